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
    assert metrics["rollout_is_weight_mean"] == 1.0 and metrics["rollout_is_clipfrac"] == 0.0
    assert metrics["rollout_is_ess"].item() == pytest.approx(1.0)


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
    if POLICY_LOSSES.needs(name, "needs_rollout_log_prob"):  # decoupled_ppo: the behaviour
        kwargs["rollout_log_prob"] = old - 0.1
    torch.manual_seed(0)
    base, _ = fn(old, log_prob, adv, mask, **kwargs)
    torch.manual_seed(0)
    ones, _ = fn(old, log_prob, adv, mask, rollout_is_weights=torch.ones(1, 5), **kwargs)
    torch.manual_seed(0)
    twice, _ = fn(old, log_prob, adv, mask, rollout_is_weights=torch.full((1, 5), 2.0), **kwargs)
    assert ones.item() == pytest.approx(base.item())
    assert twice.item() == pytest.approx(2 * base.item())


# --------------------------------------------------------------------------- sequence level
def test_sequence_level_weight_is_the_truncated_product_on_every_token():
    # row 0: ratios (2, 1.5) -> product 3 -> min(3, 4) = 3; row 1: (0.5, 0.5, masked 100)
    # -> 0.25; row 2: (3, 2) -> 6 -> truncated to 4
    rollout = torch.zeros(3, 3)
    old = torch.log(torch.tensor([[2.0, 1.5, 1.0], [0.5, 0.5, 100.0], [3.0, 2.0, 1.0]]))
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 0]])
    weights, metrics = compute_rollout_is_weights(old, rollout, mask, 4.0, level="sequence")
    expected = torch.tensor([[3.0, 3.0, 0.0], [0.25, 0.25, 0.0], [4.0, 4.0, 0.0]])
    torch.testing.assert_close(weights, expected)
    assert metrics["rollout_is_clipfrac"].item() == pytest.approx(1 / 3)  # one sequence of 3
    assert metrics["rollout_is_weight_mean"].item() == pytest.approx((6 + 0.5 + 8) / 6)


# --------------------------------------------------------------------------- rejection
def test_rejection_drops_sequences_whose_geometric_mean_ratio_leaves_the_band():
    # geometric-mean ratios: row 0 sqrt(2 * 2) = 2 (outside [1/1.5, 1.5]); row 1
    # sqrt(1.2 * 1) ~ 1.095 (kept); row 2 sqrt(0.25 * 1) = 0.5 (outside); row 3 empty.
    rollout = torch.zeros(4, 2)
    old = torch.log(torch.tensor([[2.0, 2.0], [1.2, 1.0], [0.25, 1.0], [9.0, 9.0]]))
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [0, 0]])
    # rejection only: weights are 0/1
    weights, metrics = compute_rollout_is_weights(old, rollout, mask, None, rs_threshold=1.5)
    torch.testing.assert_close(
        weights, torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    )
    assert metrics["rollout_rs_reject_frac"].item() == pytest.approx(2 / 3)
    assert metrics["rollout_is_clipfrac"].item() == 0.0
    assert metrics["rollout_is_weight_mean"].item() == pytest.approx(2 / 6)
    # with token TIS on top: the kept row keeps its truncated token weights (1.2, 1)
    weights, _ = compute_rollout_is_weights(old, rollout, mask, 2.0, rs_threshold=1.5)
    torch.testing.assert_close(
        weights, torch.tensor([[0.0, 0.0], [1.2, 1.0], [0.0, 0.0], [0.0, 0.0]])
    )


def test_effective_sample_size_fraction():
    # weights (1, 1, 2, 0): (sum w)^2 / (n sum w^2) = 16 / (4 * 6)
    rollout = torch.zeros(1, 4)
    old = torch.log(torch.tensor([[1.0, 1.0, 2.0, 1e-30]]))
    _, metrics = compute_rollout_is_weights(old, rollout, torch.ones(1, 4), 5.0)
    assert metrics["rollout_is_ess"].item() == pytest.approx(16 / 24, rel=1e-6)


def test_bad_rollout_correction_settings_are_named():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=r"rollout_rs_threshold=1\.0 must be > 1"):
        compute_rollout_is_weights(x, x, torch.ones(1, 2), None, rs_threshold=1.0)
    with pytest.raises(ValueError, match="rollout_is_level='seq' must be one of token, sequence"):
        compute_rollout_is_weights(x, x, torch.ones(1, 2), 2.0, level="seq")
    with pytest.raises(ValueError, match="needs a threshold"):
        compute_rollout_is_weights(x, x, torch.ones(1, 2), None)


def test_actor_loss_applies_rejection_to_the_policy_loss():
    from verl.algorithms import actor_loss

    # row 0 drifted (geometric ratio 2), row 1 did not; ratio to old = 1: loss = -A w
    # token-mean over 4 valid tokens: row 0 weighs 0 -> (-(-1) - (-1)) / 4 = 0.5
    rollout = torch.log(torch.tensor([[0.25, 0.25], [0.5, 0.5]]))
    old = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    loss, metrics = actor_loss(
        old.clone(),
        old,
        adv,
        torch.ones(2, 2),
        policy_loss_fn=get_policy_loss("vanilla"),
        rollout_log_prob=rollout,
        rollout_rs_threshold=1.5,
    )
    assert loss.item() == pytest.approx(0.5)
    assert metrics["rollout_rs_reject_frac"].item() == pytest.approx(0.5)
