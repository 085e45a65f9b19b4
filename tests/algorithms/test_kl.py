"""KL estimators, KL controllers and the KL reward penalty."""

import math

import pytest
import torch

from verl.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_kl_loss,
    get_kl_controller,
    kl_penalty,
)

LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-1.5, -1.0]])  # log_r = logp - ref = (0.5, -1.0)


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [
        (("k1", "kl"), [0.5, -1.0]),
        (("abs",), [0.5, 1.0]),
        (("k2", "mse"), [0.125, 0.5]),  # 0.5 * log_r^2
        # exp(ref - logp) - (ref - logp) - 1: exp(-0.5) + 0.5 - 1, exp(1) - 1 - 1
        (("k3", "low_var_kl"), [math.exp(-0.5) - 0.5, math.e - 2.0]),
    ],
)
def test_estimators(kinds, expected):
    for kind in kinds:
        torch.testing.assert_close(kl_penalty(LOGP, REF, kind), torch.tensor([expected]))


def test_k3_is_clamped():
    # log_r = -30: exp(30) - 30 - 1 would be huge; ref-logp clamps to 20 and the result to 10
    # and log_r = 30 gives exp(-20) + 20 - 1 = 19 -> 10; log_r = 5 is inside the range
    out = kl_penalty(torch.tensor([-30.0, 30.0, 5.0]), torch.zeros(3), "low_var_kl")
    assert out[:2].tolist() == [10.0, 10.0]
    assert out[2].item() == pytest.approx(math.exp(-5) + 5 - 1)


def test_straight_through_variant_keeps_value_uses_k2_gradient():
    logp = LOGP.clone().requires_grad_(True)
    out = kl_penalty(logp, REF, "k3+")
    torch.testing.assert_close(out.detach(), kl_penalty(LOGP, REF, "k3"))
    out.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.5, -1.0]]))  # d k2 / d logp = log_r


def test_unknown_kind():
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'; available: abs, k1, k2"):
        kl_penalty(LOGP, REF, "k4")


def test_compute_kl_loss():
    mask = torch.tensor([[1, 0]])
    loss = compute_kl_loss(LOGP, REF, mask, kind="k2")
    assert loss.item() == pytest.approx(0.125)


def test_fixed_controller():
    ctrl = get_kl_controller("fixed", kl_coef=0.05)
    assert isinstance(ctrl, FixedKLController)
    ctrl.update(100.0, 64)
    assert ctrl.value == 0.05
    state = ctrl.state_dict()
    other = FixedKLController(0.5)
    other.load_state_dict(state)
    assert other.value == 0.05
    with pytest.raises(ValueError, match="kl_coef=-1"):
        FixedKLController(-1)


def test_adaptive_controller_updates():
    ctrl = get_kl_controller("adaptive", kl_coef=0.1, target_kl=6.0, horizon=10000)
    assert isinstance(ctrl, AdaptiveKLController)
    ctrl.update(current_kl=9.0, n_steps=1000)  # error clip(0.5) = 0.2 -> *1.02
    assert ctrl.value == pytest.approx(0.102)
    ctrl.update(current_kl=torch.tensor(3.0), n_steps=1000)  # error clip(-0.5) = -0.2 -> *0.98
    assert ctrl.value == pytest.approx(0.102 * 0.98)
    ctrl.update(current_kl=6.6, n_steps=1000)  # error 0.1 -> *1.01
    assert ctrl.value == pytest.approx(0.102 * 0.98 * 1.01)
    ctrl.update(current_kl=6.0, n_steps=1000)  # on target: unchanged
    assert ctrl.value == pytest.approx(0.102 * 0.98 * 1.01)


def test_adaptive_controller_checkpoint_roundtrip():
    ctrl = AdaptiveKLController(0.2, target_kl=1.0, horizon=100)
    ctrl.update(2.0, 10)  # *1.02
    resumed = AdaptiveKLController(0.2, target_kl=1.0, horizon=100)
    resumed.load_state_dict(ctrl.state_dict())
    assert resumed.value == pytest.approx(0.204)
    resumed.update(2.0, 10)
    assert resumed.value == pytest.approx(0.204 * 1.02)


def test_controller_config_errors():
    with pytest.raises(ValueError, match="target_kl=None must be > 0"):
        get_kl_controller("adaptive", kl_coef=0.1)
    with pytest.raises(ValueError, match="horizon=0 must be > 0"):
        get_kl_controller("adaptive", kl_coef=0.1, target_kl=1.0, horizon=0)
    with pytest.raises(ValueError, match="Did you mean 'adaptive'"):
        get_kl_controller("adaptve", kl_coef=0.1)


def test_apply_kl_penalty_rewards_metrics_and_controller_update():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -2.0, -9.0], [-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5], [-1.2, -1.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    ctrl = AdaptiveKLController(0.5, target_kl=0.01, horizon=30)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, ctrl, kind="k1")
    # k1 = old - ref: row 0 (0.5, 0, -0.5), row 1 (0.2, -1.0, masked), row 2 all masked
    expected = scores - 0.5 * torch.tensor([[0.5, 0.0, -0.5], [0.2, -1.0, 0.0], [0, 0, 0]])
    torch.testing.assert_close(rewards, expected)
    # sequence means 0 and -0.4; the empty row is excluded -> batch KL -0.2
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(-0.2)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5
    # error = clip(-0.2/0.01 - 1) = -0.2; value *= 1 - 0.2 * 3 / 30
    assert ctrl.value == pytest.approx(0.5 * 0.98)


def test_apply_kl_penalty_fixed_controller_k3():
    scores = torch.zeros(1, 2)
    rewards, metrics = apply_kl_penalty(
        scores, LOGP, REF, torch.ones(1, 2), FixedKLController(0.1), kind="low_var_kl"
    )
    k3 = [math.exp(-0.5) - 0.5, math.e - 2.0]
    torch.testing.assert_close(rewards, torch.tensor([[-0.1 * k3[0], -0.1 * k3[1]]]))
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(sum(k3) / 2)
