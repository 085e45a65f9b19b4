"""Truncated importance-sampling weights against hand-computed values."""

import math

import pytest
import torch

from verl.algorithms import POLICY_LOSSES, compute_rollout_is_weights, get_policy_loss

# Trainer-vs-rollout ratios exp(old - rollout) per token; the last token is masked.
RATIOS = [1.0, 1.5, 3.0, 0.5, 100.0]
MASK = [1, 1, 1, 1, 0]


def _inputs():
    rollout = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -0.1]])
    old = rollout + torch.log(torch.tensor([RATIOS]))
    return old, rollout, torch.tensor([MASK])


def test_weights_truncate_and_zero_masked_tokens():
    old, rollout, mask = _inputs()
    weights, metrics = compute_rollout_is_weights(old, rollout, mask, threshold=2.0)
    # min(ratio, 2): 1, 1.5, 2 (truncated), 0.5; masked -> 0
    torch.testing.assert_close(weights, torch.tensor([[1.0, 1.5, 2.0, 0.5, 0.0]]))
    assert not weights.requires_grad
    assert metrics["rollout_is_weight_mean"] == pytest.approx((1.0 + 1.5 + 2.0 + 0.5) / 4)
    assert metrics["rollout_is_clipfrac"] == pytest.approx(1 / 4)


def test_identical_log_probs_give_unit_weights():
    old, _, mask = _inputs()
    weights, metrics = compute_rollout_is_weights(old, old.clone(), mask, threshold=2.0)
    torch.testing.assert_close(weights, torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]]))
    assert metrics == {"rollout_is_weight_mean": 1.0, "rollout_is_clipfrac": 0.0}


def test_extreme_gap_is_finite_and_threshold_is_checked():
    old = torch.tensor([[0.0, -1000.0]])
    rollout = torch.tensor([[-1000.0, 0.0]])
    weights, _ = compute_rollout_is_weights(old, rollout, torch.ones(1, 2), threshold=5.0)
    # ratio exp(+20) -> truncated to 5; exp(-20) stays (tiny but finite)
    torch.testing.assert_close(weights, torch.tensor([[5.0, math.exp(-20.0)]]))
    with pytest.raises(ValueError, match=r"rollout_is_threshold=0\.0 must be > 0"):
        compute_rollout_is_weights(old, rollout, torch.ones(1, 2), threshold=0.0)


def test_vanilla_loss_with_is_weights_hand_computed():
    # Policy equals the old policy (ratio 1, nothing clipped): per-token loss = -A.
    # A = [1, -1, 2, 1]; weights [1, 1.5, 2, 0.5] -> (-1 + 1.5 - 4 - 0.5) / 4 = -1.0
    old, rollout, mask = _inputs()
    weights, _ = compute_rollout_is_weights(old, rollout, mask, threshold=2.0)
    log_prob = old.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 2.0, 1.0, 9.0]])
    loss, _ = get_policy_loss("vanilla")(old, log_prob, adv, mask, rollout_is_weights=weights)
    assert loss.item() == pytest.approx(-1.0)
    loss.backward()
    # d(-A w r)/d log_prob = -A w r / 4 at r = 1
    expected = [[-1.0 / 4, 1.5 / 4, -4.0 / 4, -0.5 / 4, 0.0]]
    torch.testing.assert_close(log_prob.grad, torch.tensor(expected))


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_every_policy_loss_is_linear_in_the_weights(name):
    # token-mean of w * L: constant weights 2 double the loss, ones leave it unchanged
    old, _, mask = _inputs()
    log_prob = old + torch.tensor([[0.1, -0.05, 0.02, 0.0, 0.3]])
    adv = torch.tensor([[1.0, -1.0, 0.5, 2.0, 0.0]])
    fn = get_policy_loss(name)
    kwargs = {"loss_agg_mode": "token-mean"}
    torch.manual_seed(0)
    base, _ = fn(old, log_prob, adv, mask, **kwargs)
    torch.manual_seed(0)
    ones, _ = fn(old, log_prob, adv, mask, rollout_is_weights=torch.ones(1, 5), **kwargs)
    torch.manual_seed(0)
    twice, _ = fn(old, log_prob, adv, mask, rollout_is_weights=torch.full((1, 5), 2.0), **kwargs)
    assert ones.item() == pytest.approx(base.item())
    assert twice.item() == pytest.approx(2 * base.item())
