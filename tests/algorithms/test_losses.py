"""Tests for verl/algorithms/losses.py: the actor's and critic's micro-batch losses."""

from __future__ import annotations

import math

import pytest
import torch

from verl.algorithms import actor_loss, critic_loss, get_policy_loss

VANILLA = get_policy_loss("vanilla")
CLIP = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0}


def _actor_inputs():
    old = torch.tensor([[-1.0, -2.0]])
    log_prob = old.clone().requires_grad_(True)  # ratio 1 on both tokens
    advantages = torch.tensor([[1.0, -2.0]])
    mask = torch.ones(1, 2)
    return log_prob, old, advantages, mask


def test_actor_loss_adds_entropy_bonus_and_kl_to_the_policy_loss():
    log_prob, old, adv, mask = _actor_inputs()
    entropy = torch.tensor([[0.5, 1.5]])
    ref = log_prob.detach() + torch.tensor([[0.0, math.log(2.0)]])
    loss, metrics = actor_loss(
        log_prob,
        old,
        adv,
        mask,
        policy_loss_fn=VANILLA,
        policy_loss_kwargs=CLIP,
        entropy=entropy,
        entropy_coeff=0.1,
        ref_log_prob=ref,
        kl_loss_coef=0.5,
        kl_loss_type="low_var_kl",
    )
    # pg: mean(-A r) = -(1 - 2) / 2; entropy: mean = 1; k3 on token 2: 2 - ln 2 - 1
    kl = (1.0 - math.log(2.0)) / 2
    assert metrics["pg_loss"].item() == pytest.approx(0.5)
    assert metrics["entropy_loss"].item() == pytest.approx(1.0)
    assert metrics["kl_loss"].item() == pytest.approx(kl, rel=1e-6)
    assert loss.item() == pytest.approx(0.5 - 0.1 * 1.0 + 0.5 * kl, rel=1e-6)
    assert metrics["clipfrac"].item() == 0.0 and metrics["approx_kl"].item() == 0.0
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in metrics.values())
    assert not any(v.requires_grad for v in metrics.values())
    loss.backward()
    # d/d log_prob: -A / 2 from the surrogate (r = 1) + 0.5 * d k3 / 2 (k3' = 1 - exp(ref - lp))
    expected = [-1.0 / 2 + 0.0, 2.0 / 2 + 0.5 * (1.0 - 2.0) / 2]
    torch.testing.assert_close(log_prob.grad, torch.tensor([expected]))


def test_actor_loss_without_optional_terms_reports_only_policy_metrics():
    log_prob, old, adv, mask = _actor_inputs()
    loss, metrics = actor_loss(log_prob, old, adv, mask, policy_loss_fn=VANILLA)
    assert set(metrics) == {"pg_loss", "clipfrac", "clipfrac_lower", "approx_kl"}
    assert loss.item() == pytest.approx(0.5)


def test_actor_loss_weights_tokens_by_truncated_rollout_is_ratios():
    log_prob, old, adv, mask = _actor_inputs()
    rollout = old - torch.tensor([[math.log(3.0), 0.0]])  # ratios 3 (truncated to 2) and 1
    loss, metrics = actor_loss(
        log_prob,
        old,
        adv,
        mask,
        policy_loss_fn=VANILLA,
        rollout_log_prob=rollout,
        rollout_is_threshold=2.0,
    )
    assert loss.item() == pytest.approx((-1.0 * 2.0 + 2.0 * 1.0) / 2)
    assert metrics["rollout_is_weight_mean"].item() == pytest.approx(1.5)
    assert metrics["rollout_is_clipfrac"].item() == pytest.approx(0.5)


def test_actor_loss_refuses_clashing_kwargs_and_a_missing_threshold():
    log_prob, old, adv, mask = _actor_inputs()
    with pytest.raises(ValueError, match=r"policy_loss_kwargs sets \['loss_agg_mode'\]"):
        actor_loss(
            log_prob,
            old,
            adv,
            mask,
            policy_loss_fn=VANILLA,
            policy_loss_kwargs={"loss_agg_mode": "token-mean"},
        )
    with pytest.raises(ValueError, match="without rollout_is_threshold"):
        actor_loss(log_prob, old, adv, mask, policy_loss_fn=VANILLA, rollout_log_prob=old)


def test_actor_loss_passes_kwargs_and_makes_float_metrics_tensors():
    seen = {}

    def custom(old_log_prob, log_prob, advantages, response_mask, **kwargs):
        seen.update(kwargs)
        return (log_prob * response_mask).sum(), {"custom": 0.25}

    log_prob, old, adv, mask = _actor_inputs()
    loss, metrics = actor_loss(
        log_prob,
        old,
        adv,
        mask,
        policy_loss_fn=custom,
        policy_loss_kwargs={"my_ratio": 0.3},
        loss_agg_mode="seq-mean-token-mean",
        loss_scale_factor=4.0,
    )
    assert seen == {
        "my_ratio": 0.3,
        "loss_agg_mode": "seq-mean-token-mean",
        "loss_scale_factor": 4.0,
        "rollout_is_weights": None,
    }
    assert loss.item() == pytest.approx(-3.0)
    assert isinstance(metrics["custom"], torch.Tensor) and metrics["custom"].item() == 0.25


def test_critic_loss_is_the_weighted_clipped_value_loss():
    vpreds = torch.tensor([[1.0, 0.0, 9.0]], requires_grad=True)
    values = torch.zeros(1, 3)
    returns = torch.tensor([[2.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is padding
    loss, metrics = critic_loss(vpreds, values, returns, mask, cliprange_value=0.5, loss_coef=0.5)
    # token 1: max((1-2)^2, (0.5-2)^2) = 2.25 (clipped); token 2: max(1, 1) = 1
    assert metrics["vf_loss"].item() == pytest.approx(0.5 * (2.25 + 1.0) / 2)
    assert loss.item() == pytest.approx(0.5 * 0.5 * (2.25 + 1.0) / 2)
    assert metrics["vf_clipfrac"].item() == pytest.approx(0.5)
    assert metrics["vpred_mean"].item() == pytest.approx(0.5)
    assert not any(v.requires_grad for v in metrics.values())
    loss.backward()
    # token 1 is clipped (no gradient); token 2: 0.25 * d(v - 1)^2 / 2 = 0.25 * (v - 1)
    torch.testing.assert_close(vpreds.grad, torch.tensor([[0.0, -0.25, 0.0]]))
