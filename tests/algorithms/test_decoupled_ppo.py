"""Decoupled PPO (``decoupled_ppo``): a hand computation per token, the reduction to
vanilla PPO when behaviour == proximal, and how the actor's loss binds it."""

import math

import pytest
import torch

from verl.algorithms import actor_loss
from verl.algorithms.policy_loss import get_policy_loss
from verl.registry import POLICY_LOSSES

decoupled = get_policy_loss("decoupled_ppo")
vanilla = get_policy_loss("vanilla")

# The proximal ratios and advantages of test_policy_loss's table (clip 0.2, dual clip 3):
# per-token PPO loss -1.0, -1.2, +0.8, +3.0, -0.5, +1.5 on the six valid tokens, t6 masked.
RATIOS = [1.0, 1.5, 0.5, 5.0, 0.5, 1.5, 100.0]
ADV = [1.0, 1.0, -1.0, -1.0, 1.0, -1.0, 7.0]
MASK = [1, 1, 1, 1, 1, 1, 0]
PPO = [-1.0, -1.2, 0.8, 3.0, -0.5, 1.5]
# exp(prox - behav) per token; the cap 2 truncates t2 (4.0 -> 2), not t4 (2.0)
RAW_WEIGHTS = [1.0, 0.5, 4.0, 1.5, 2.0, 0.25, 9.0]
WEIGHTS = [1.0, 0.5, 2.0, 1.5, 2.0, 0.25]


def _inputs():
    prox = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -1.5, -2.5, -1.0]])
    log_prob = (prox + torch.log(torch.tensor([RATIOS]))).requires_grad_(True)
    behav = prox - torch.log(torch.tensor([RAW_WEIGHTS]))
    return prox, log_prob, behav, torch.tensor([ADV]), torch.tensor([MASK])


def test_decoupled_equals_hand_computation_per_token():
    prox, log_prob, behav, adv, mask = _inputs()
    loss, metrics = decoupled(
        prox, log_prob, adv, mask, rollout_log_prob=behav, behaviour_weight_cap=2.0
    )
    weighted = [w * p for w, p in zip(WEIGHTS, PPO)]  # -1, -0.6, 1.6, 4.5, -1, 0.375
    assert loss.item() == pytest.approx(sum(weighted) / 6)
    assert metrics["behaviour_weight_mean"].item() == pytest.approx(sum(WEIGHTS) / 6)
    assert metrics["behaviour_weight_clipfrac"].item() == pytest.approx(1 / 6)
    kl = -sum(math.log(w) for w in RAW_WEIGHTS[:6]) / 6
    assert metrics["behaviour_approx_kl"].item() == pytest.approx(kl, abs=1e-6)
    # PPO's own metrics are taken against the proximal policy
    assert metrics["clipfrac"].item() == pytest.approx(2 / 6)
    assert metrics["clipfrac_lower"].item() == pytest.approx(1 / 6)
    loss.backward()
    # w * d(-A r)/d log_prob = -w A r on unclipped tokens (t0, t4, t5), 0 elsewhere
    expected = [-1.0 / 6, 0.0, 0.0, 0.0, 2.0 * -0.5 / 6, 0.25 * 1.5 / 6, 0.0]
    torch.testing.assert_close(log_prob.grad, torch.tensor([expected]))


def test_decoupled_masked_tokens_do_not_count():
    prox, log_prob, behav, adv, mask = _inputs()
    loss, _ = decoupled(prox, log_prob, adv, mask, rollout_log_prob=behav)
    junk = behav.clone()
    junk[0, 6] = -1e4  # a huge weight on the masked token
    loss2, metrics = decoupled(prox, log_prob, adv, mask, rollout_log_prob=junk)
    assert loss2.item() == pytest.approx(loss.item())
    assert metrics["behaviour_weight_mean"].item() == pytest.approx(sum(WEIGHTS) / 6)


def test_decoupled_reduces_to_vanilla_when_behaviour_is_proximal():
    g = torch.Generator().manual_seed(3)
    prox = -torch.rand(3, 6, generator=g) * 3
    adv = torch.randn(3, 6, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        lp_a = (prox + 0.5 * torch.randn(3, 6, generator=g)).requires_grad_(True)
        lp_b = lp_a.detach().clone().requires_grad_(True)
        kw = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, loss_agg_mode=mode)
        ld, md = decoupled(prox, lp_a, adv, mask, rollout_log_prob=prox.clone(), **kw)
        lv, mv = vanilla(prox, lp_b, adv, mask, **kw)
        assert ld.item() == pytest.approx(lv.item(), abs=1e-6)
        ld.backward()
        lv.backward()
        torch.testing.assert_close(lp_a.grad, lp_b.grad)
        assert md["behaviour_weight_mean"].item() == pytest.approx(1.0)
        assert md["behaviour_weight_clipfrac"].item() == 0.0
        assert md["clipfrac"].item() == pytest.approx(mv["clipfrac"].item())


def test_decoupled_needs_behaviour_log_probs_and_a_positive_cap():
    prox, log_prob, behav, adv, mask = _inputs()
    with pytest.raises(ValueError, match=r"decoupled_ppo needs .*rollout_log_probs"):
        decoupled(prox, log_prob, adv, mask)
    with pytest.raises(ValueError, match=r"behaviour_weight_cap=0\.0 must be > 0"):
        decoupled(prox, log_prob, adv, mask, rollout_log_prob=behav, behaviour_weight_cap=0.0)


def test_decoupled_is_registered_with_its_needs_and_hyperparameter():
    assert get_policy_loss("decoupled") is decoupled
    assert POLICY_LOSSES.needs("decoupled_ppo", "needs_rollout_log_prob") is True
    assert POLICY_LOSSES.needs("vanilla", "needs_rollout_log_prob") is False
    # rollout_log_prob comes from the micro-batch; only the cap is a hyperparameter
    assert POLICY_LOSSES.hyperparameters("decoupled_ppo") == {"behaviour_weight_cap": 2.0}


def test_actor_loss_gives_decoupled_the_behaviour_and_no_second_is_weight():
    """``rollout_is_threshold`` (on by default with async rollout) is not applied on top of
    the loss's own weight; the rejection (``rollout_rs_threshold``) still is."""
    prox, log_prob, behav, adv, mask = _inputs()
    direct, _ = decoupled(prox, log_prob, adv, mask, rollout_log_prob=behav)
    loss, metrics = actor_loss(
        log_prob,
        prox,
        adv,
        mask,
        policy_loss_fn=decoupled,
        rollout_log_prob=behav,
        rollout_is_threshold=2.0,
        policy_takes_rollout_log_prob=True,
    )
    assert loss.item() == pytest.approx(direct.item())
    assert "rollout_is_weight_mean" not in metrics
    assert metrics["behaviour_weight_mean"].item() == pytest.approx(sum(WEIGHTS) / 6)
    # a band of [1/1.05, 1.05] rejects the whole (single) sequence: its geometric-mean
    # ratio exp(mean(log RAW_WEIGHTS[:6])) = 1.5 ** (1/6) = 1.07 is outside it
    rejected, metrics = actor_loss(
        log_prob,
        prox,
        adv,
        mask,
        policy_loss_fn=decoupled,
        rollout_log_prob=behav,
        rollout_rs_threshold=1.05,
        policy_takes_rollout_log_prob=True,
    )
    assert rejected.item() == 0.0
    assert metrics["rollout_rs_reject_frac"].item() == 1.0


def test_bound_actor_loss_reads_rollout_log_probs_for_decoupled():
    from verl.workers.losses import bind_actor_loss
    from verl.workers.specs import ActorLossSpec

    spec = ActorLossSpec(
        policy_loss="decoupled_ppo",
        policy_loss_kwargs={"behaviour_weight_cap": 3.0},
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        clip_ratio_c=3.0,
        loss_agg_mode="token-mean",
        loss_scale_factor=None,
        entropy_coeff=0.0,
        use_kl_loss=False,
        kl_loss_coef=0.0,
        kl_loss_type="low_var_kl",
        rollout_is_threshold=2.0,
        rollout_is_level="token",
        rollout_rs_threshold=None,
    )
    bound = bind_actor_loss(spec)
    assert bound.takes_rollout_log_prob
    prox, log_prob, behav, adv, mask = _inputs()
    batch = {"advantages": adv, "response_mask": mask, "rollout_log_probs": behav}
    loss, metrics = bound(log_prob, prox, batch)
    assert "rollout_is_weight_mean" not in metrics  # rollout_is_threshold=2.0: not on top
    capped = [1.0, 0.5, 3.0, 1.5, 2.0, 0.25]  # the cap of 3 truncates t2 (4.0) to 3
    assert loss.item() == pytest.approx(sum(w * p for w, p in zip(capped, PPO)) / 6)
    with pytest.raises(ValueError, match="decoupled_ppo needs"):
        bound(log_prob, prox, {"advantages": adv, "response_mask": mask})
