"""The clipped value loss, against hand-computed values."""

import pytest
import torch

from verl.algorithms.value_loss import compute_value_loss


def test_clipped_value_loss_values_clipfrac_and_grad():
    vpreds = torch.tensor([[1.0, 2.0, 0.0, 42.0]], requires_grad=True)
    values = torch.tensor([[0.5, 0.5, 0.5, 0.0]])
    returns = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.2)
    # t0: unclipped (1-1)^2 = 0, clipped 0.5+0.2=0.7 -> (0.7-1)^2 = 0.09 -> max 0.09 (clipped)
    # t1: unclipped (2-1)^2 = 1, clipped 0.7 -> 0.09 -> 1
    # t2: unclipped (0-1)^2 = 1, clipped 0.3 -> 0.49 -> 1
    # loss = 0.5 * (0.09 + 1 + 1) / 3
    assert loss.item() == pytest.approx(0.5 * 2.09 / 3)
    assert clipfrac.item() == pytest.approx(1 / 3)
    assert not clipfrac.requires_grad
    loss.backward()
    # t0 uses the clamped prediction (no gradient); t1: 0.5*2*(2-1)/3; t2: 0.5*2*(0-1)/3
    torch.testing.assert_close(vpreds.grad, torch.tensor([[0.0, 1 / 3, -1 / 3, 0.0]]))


def test_no_clipping_when_cliprange_is_none():
    vpreds = torch.tensor([[3.0, 1.0]])
    loss, clipfrac = compute_value_loss(
        vpreds, torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), cliprange_value=None
    )
    assert loss.item() == pytest.approx(0.5 * (9 + 1) / 2)
    assert clipfrac.item() == 0.0


def test_value_loss_agg_mode_and_bad_cliprange():
    vpreds = torch.tensor([[1.0, 1.0], [2.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    zeros = torch.zeros(2, 2)
    loss, _ = compute_value_loss(vpreds, zeros, vpreds, mask, 0.5, "seq-mean-token-sum")
    # values == vpreds so nothing clips; per-seq sums 1+1=2 and 4 -> 0.5 * mean(2, 4)
    assert loss.item() == pytest.approx(1.5)
    with pytest.raises(ValueError, match="cliprange_value=-1"):
        compute_value_loss(vpreds, zeros, zeros, mask, -1)
