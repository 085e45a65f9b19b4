"""Loss aggregation modes and the entropy loss, against hand-computed values."""

import math

import pytest
import torch

from verl.algorithms.loss_agg import agg_loss, apply_entropy_bonus, compute_entropy_loss

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])

MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 valid tokens
        ("seq-mean-token-sum", 3.5),  # ((1 + 2) + 4) / 2 sequences
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2
        ("seq-mean-token-sum-norm", 7 / 6),  # 7 / (batch 2 * response_len 3)
    ],
)
def test_modes(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_sum_norm_with_explicit_scale_factor():
    # 7 / (batch 2 * 7)
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=7).item() == 0.5
    with pytest.raises(ValueError, match="loss_scale_factor=0"):
        agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=0)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),
        ("seq-mean-token-sum", 3.5),  # the empty sequence is excluded from the mean
        ("seq-mean-token-mean", 2.75),
        ("seq-mean-token-sum-norm", 7 / 9),  # constant normaliser: batch 3 * 3
    ],
)
def test_empty_sequence(mode, expected):
    loss = torch.cat([LOSS, torch.tensor([[9.0, float("nan"), float("inf")]])])
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=MASK.dtype)])
    out = agg_loss(loss, mask, mode)
    assert out.item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", MODES)
def test_all_masked_is_zero_and_differentiable(mode):
    loss = LOSS.clone().requires_grad_(True)
    out = agg_loss(loss, torch.zeros_like(MASK), mode)
    assert out.item() == 0.0
    out.backward()
    assert torch.all(loss.grad == 0)


def test_token_mean_gradient_weights_each_valid_token_equally():
    loss = LOSS.clone().requires_grad_(True)
    agg_loss(loss, MASK, "seq-mean-token-mean").backward()
    # seq 0 has 2 tokens -> 1/(2*2) each; seq 1 has 1 token -> 1/2
    torch.testing.assert_close(loss.grad, torch.tensor([[0.25, 0.25, 0.0], [0.5, 0.0, 0.0]]))


def test_unknown_mode():
    with pytest.raises(ValueError, match="Did you mean 'token-mean'"):
        agg_loss(LOSS, MASK, "token_mean")


def test_entropy_loss_from_logits_or_entropy():
    logits = torch.zeros(2, 3, 4)  # uniform over 4 tokens: ln 4 everywhere
    logits[0, 0] = torch.tensor([0.0, -float("inf"), -float("inf"), -float("inf")])  # 0 nats
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    expected = 2 * math.log(4) / 3  # tokens: 0, ln4, ln4
    assert compute_entropy_loss(logits, mask).item() == pytest.approx(expected, abs=1e-6)
    per_token = torch.tensor([[0.0, math.log(4), 9.0], [math.log(4), 9.0, 9.0]])
    assert compute_entropy_loss(per_token, mask).item() == pytest.approx(expected, abs=1e-6)


def test_apply_entropy_bonus():
    policy_loss = torch.tensor(1.0)
    entropy = torch.tensor([[2.0, 4.0]])
    loss, ent = apply_entropy_bonus(policy_loss, entropy, torch.ones(1, 2), entropy_coeff=0.1)
    assert ent.item() == pytest.approx(3.0)
    assert loss.item() == pytest.approx(1.0 - 0.1 * 3.0)
    loss0, _ = apply_entropy_bonus(policy_loss, entropy, torch.ones(1, 2), entropy_coeff=0.0)
    assert loss0 is policy_loss
