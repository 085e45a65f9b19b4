"""Preference losses against hand-computed values: DPO (+ label smoothing), IPO, KTO."""

from __future__ import annotations

import math

import pytest
import torch

from verl.algorithms import (
    PREFERENCE_LOSSES,
    UnknownNameError,
    compute_dpo_loss,
    compute_ipo_loss,
    compute_kto_loss,
    get_preference_loss,
    is_paired_loss,
    kto_reference_point,
    preference_metrics,
    sequence_log_probs,
)


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def softplus(x: float) -> float:
    """-log sigmoid(-x) = log(1 + e^x)."""
    return math.log1p(math.exp(x))


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


# Two pairs. Log-ratios: chosen [0.5, 0.0], rejected [-0.5, 0.5] -> h = [1.0, -0.5].
PC, PR = t(-1.0, -2.0), t(-3.0, -1.0)
RC, RR = t(-1.5, -2.0), t(-2.5, -1.5)


def test_dpo_loss_hand_computed():
    out = compute_dpo_loss(PC, PR, RC, RR, beta=0.5)
    # -log sigmoid(beta * h) = log(1 + exp(-beta * h))
    expected = [softplus(-0.5 * 1.0), softplus(-0.5 * -0.5)]
    assert expected == pytest.approx([0.4740769841801067, 0.8259394171693531])
    assert out.losses.tolist() == pytest.approx(expected, abs=1e-6)
    assert out.chosen_rewards.tolist() == pytest.approx([0.25, 0.0])
    assert out.rejected_rewards.tolist() == pytest.approx([-0.25, 0.25])
    assert out.kl is None


def test_dpo_label_smoothing_hand_computed():
    eps, beta = 0.1, 0.5
    out = compute_dpo_loss(PC, PR, RC, RR, beta=beta, label_smoothing=eps)
    expected = [(1 - eps) * softplus(-beta * h) + eps * softplus(beta * h) for h in (1.0, -0.5)]
    assert out.losses.tolist() == pytest.approx(expected, abs=1e-6)
    with pytest.raises(ValueError, match=r"label_smoothing=0\.5"):
        compute_dpo_loss(PC, PR, RC, RR, label_smoothing=0.5)


def test_dpo_at_the_reference_is_log_2_and_gradient_matches_formula():
    pc = t(-4.0, -7.0).requires_grad_()
    pr = t(-5.0, -6.0).requires_grad_()
    out = compute_dpo_loss(pc, pr, pc.detach(), pr.detach(), beta=0.1)
    assert out.losses.tolist() == pytest.approx([math.log(2)] * 2)
    out.losses.mean().backward()
    # d/d pc of -log sigmoid(beta h) at h = 0: -beta * (1 - sigmoid(0)) / batch
    assert pc.grad.tolist() == pytest.approx([-0.1 * 0.5 / 2] * 2)
    assert pr.grad.tolist() == pytest.approx([0.1 * 0.5 / 2] * 2)


def test_ipo_loss_hand_computed():
    out = compute_ipo_loss(PC, PR, RC, RR, beta=0.5)
    # (h - 1 / (2 beta))^2 with 1 / (2 * 0.5) = 1
    assert out.losses.tolist() == pytest.approx([0.0, 2.25])
    assert out.chosen_rewards.tolist() == pytest.approx([0.25, 0.0])


def test_kto_loss_hand_computed_with_zero_reference_point():
    policy, ref = t(-1.0, -2.0, -3.0), t(-1.5, -2.0, -2.0)  # log-ratios 0.5, 0, -1
    labels = torch.tensor([True, True, False])
    out = compute_kto_loss(
        policy, ref, labels, beta=0.5, desirable_weight=2.0, undesirable_weight=1.0
    )
    # mean log-ratio = -1/6 < 0 -> z = 0
    assert float(out.kl) == 0.0
    expected = [2.0 * (1 - sigmoid(0.25)), 2.0 * (1 - sigmoid(0.0)), 1 - sigmoid(0.5 * 1.0)]
    assert out.losses.tolist() == pytest.approx(expected, abs=1e-6)
    assert out.chosen_rewards.tolist() == pytest.approx([0.25, 0.0])
    assert out.rejected_rewards.tolist() == pytest.approx([-0.5])


def test_kto_reference_point_is_batch_mean_and_not_differentiated():
    policy = t(0.0, 1.0, -2.0).requires_grad_()
    ref = t(-1.0, -1.0, -2.0)  # log-ratios 1, 2, 0 -> z = 1
    labels = torch.tensor([True, False, True])
    assert float(kto_reference_point(policy, ref)) == pytest.approx(1.0)
    out = compute_kto_loss(policy, ref, labels, beta=1.0)
    expected = [1 - sigmoid(1 - 1), 1 - sigmoid(1 - 2), 1 - sigmoid(0 - 1)]
    assert out.losses.tolist() == pytest.approx(expected, abs=1e-6)
    out.losses.sum().backward()
    # with z held constant: d/dr (1 - s(r - z)) = -s'(r - z); d/dr (1 - s(z - r)) = +s'(z - r)
    ds = [sigmoid(x) * (1 - sigmoid(x)) for x in (0.0, -1.0, -1.0)]
    assert policy.grad.tolist() == pytest.approx([-ds[0], ds[1], -ds[2]], abs=1e-6)
    # an explicit reference point wins
    given = compute_kto_loss(policy, ref, labels, beta=1.0, kl=0.0)
    assert float(given.kl) == 0.0
    assert given.losses[0].item() == pytest.approx(1 - sigmoid(1.0))


def test_kto_rejects_non_bool_labels():
    with pytest.raises(TypeError, match="bool"):
        compute_kto_loss(t(0.0), t(0.0), torch.tensor([1]))


def test_sequence_log_probs_ignores_masked_tokens_even_if_not_finite():
    token_lp = torch.tensor([[-1.0, -2.0, float("-inf")], [-0.5, float("nan"), -0.25]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert sequence_log_probs(token_lp, mask).tolist() == pytest.approx([-3.0, -0.75])
    with pytest.raises(ValueError, match="shape"):
        sequence_log_probs(token_lp, mask[:, :2])


def test_preference_metrics_paired_and_unpaired():
    paired = preference_metrics(t(0.25, 0.0, 1.0), t(-0.25, 0.25, 1.0), paired=True)
    assert paired == pytest.approx(
        {
            "rewards/chosen": 1.25 / 3,
            "rewards/rejected": 1.0 / 3,
            "rewards/margins": 0.25 / 3,
            "rewards/accuracies": 1 / 3,  # ties do not count
        }
    )
    unpaired = preference_metrics(t(0.5, -0.1), t(-1.0), paired=False)
    assert unpaired == pytest.approx(
        {
            "rewards/chosen": 0.2,
            "rewards/rejected": -1.0,
            "rewards/margins": 1.2,
            "rewards/accuracies": 2 / 3,
        }
    )
    only_desirable = preference_metrics(t(0.5), t(), paired=False)
    assert set(only_desirable) == {"rewards/chosen", "rewards/accuracies"}


def test_registry():
    assert {"dpo", "ipo", "kto"} <= set(PREFERENCE_LOSSES.names())
    assert get_preference_loss("sigmoid") is compute_dpo_loss
    assert is_paired_loss("dpo") and is_paired_loss("ipo") and not is_paired_loss("kto")
    with pytest.raises(UnknownNameError, match="Did you mean 'dpo'"):
        get_preference_loss("dpp")


def test_shape_mismatch_is_reported():
    with pytest.raises(ValueError, match="one shape"):
        compute_dpo_loss(t(0.0, 1.0), t(0.0), t(0.0), t(0.0))
