"""On-policy distillation losses against hand computations (verl.algorithms.distill)."""

from __future__ import annotations

import math

import pytest
import torch

from verl.algorithms import DISTILL_ESTIMATORS, distill_loss, topk_reverse_kl
from verl.algorithms.distill import sampled_token_reverse_kl
from verl.registry import UnknownNameError

# two sequences, three positions; the last position of row 0 and the first of row 1 are
# masked out
S = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -0.7, -1.5]])
T = torch.tensor([[-1.0, -0.5, -9.0], [-3.0, -0.2, -1.5]])
MASK = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]])


def _valid_diffs() -> list[float]:
    # d = s - t at the four valid positions
    return [0.5, -0.5, -0.5, 0.0]


def test_k1_value_is_the_masked_mean_log_ratio() -> None:
    loss, metrics = distill_loss(S, T, MASK, estimator="k1")
    expected = sum(_valid_diffs()) / 4  # token-mean over the 4 valid tokens
    assert loss.item() == pytest.approx(expected)
    assert metrics["distill_k1"].item() == pytest.approx(expected)
    assert metrics["distill_loss"].item() == pytest.approx(expected)


def test_k3_value_by_hand() -> None:
    loss, _ = distill_loss(S, T, MASK, estimator="k3")
    per_token = [math.exp(-d) + d - 1 for d in _valid_diffs()]
    assert loss.item() == pytest.approx(sum(per_token) / 4, rel=1e-6)


def test_seq_mean_token_mean_aggregation() -> None:
    loss, _ = distill_loss(S, T, MASK, estimator="k1", loss_agg_mode="seq-mean-token-mean")
    # row 0: (0.5 - 0.5) / 2 = 0; row 1: (-0.5 + 0) / 2 = -0.25
    assert loss.item() == pytest.approx((0.0 - 0.25) / 2)


def test_sampled_token_gradient_is_the_score_function_form() -> None:
    """Both estimators take the gradient d * grad log s (the reverse KL's, in expectation)."""
    for estimator in ("k1", "k3"):
        s = S.clone().requires_grad_(True)
        loss, _ = distill_loss(s, T, MASK, estimator=estimator)
        loss.backward()
        expected = (S - T) * MASK / MASK.sum()
        torch.testing.assert_close(s.grad, expected)


def test_teacher_receives_no_gradient() -> None:
    s = S.clone().requires_grad_(True)
    t = T.clone().requires_grad_(True)
    for estimator in ("k1", "k3"):
        distill_loss(s, t, MASK, estimator=estimator)[0].backward()
    st = torch.log_softmax(torch.randn(2, 3, 5), -1)[..., :3].requires_grad_(True)
    tt = torch.log_softmax(torch.randn(2, 3, 5), -1)[..., :3].requires_grad_(True)
    distill_loss(
        s,
        None,
        MASK,
        estimator="topk",
        student_topk_log_probs=st,
        teacher_topk_log_probs=tt,
    )[0].backward()
    assert t.grad is None and tt.grad is None
    assert s.grad is not None and st.grad is not None


def test_topk_tail_bucket_by_hand() -> None:
    s = torch.log(torch.tensor([[[0.5, 0.3]]]))  # tail 0.2
    t = torch.log(torch.tensor([[[0.25, 0.25]]]))  # tail 0.5
    expected = 0.5 * math.log(0.5 / 0.25) + 0.3 * math.log(0.3 / 0.25) + 0.2 * math.log(0.2 / 0.5)
    assert topk_reverse_kl(s, t, tail=True).item() == pytest.approx(expected, rel=1e-6)


def test_topk_renormalised_by_hand() -> None:
    s = torch.log(torch.tensor([[[0.5, 0.3]]]))  # renormalised: 5/8, 3/8
    t = torch.log(torch.tensor([[[0.25, 0.25]]]))  # renormalised: 1/2, 1/2
    expected = 5 / 8 * math.log((5 / 8) / 0.5) + 3 / 8 * math.log((3 / 8) / 0.5)
    assert topk_reverse_kl(s, t, tail=False).item() == pytest.approx(expected, rel=1e-6)


def test_topk_with_all_tokens_is_the_full_kl_and_masked() -> None:
    torch.manual_seed(0)
    s_logits, t_logits = torch.randn(2, 3, 6), torch.randn(2, 3, 6)
    s, t = torch.log_softmax(s_logits, -1), torch.log_softmax(t_logits, -1)
    full = (s.exp() * (s - t)).sum(-1)  # (2, 3)
    loss, _ = distill_loss(
        s[..., 0],
        None,
        MASK,
        estimator="topk",
        student_topk_log_probs=s,
        teacher_topk_log_probs=t,
    )
    assert loss.item() == pytest.approx(((full * MASK).sum() / MASK.sum()).item(), rel=1e-5)
    # a masked position's value does not reach the loss
    t2 = t.clone()
    t2[0, 2] = torch.log_softmax(torch.randn(6), -1)
    loss2, _ = distill_loss(
        s[..., 0], None, MASK, estimator="topk", student_topk_log_probs=s, teacher_topk_log_probs=t2
    )
    assert loss2.item() == pytest.approx(loss.item())


@pytest.mark.parametrize("estimator", ["k1", "k3", "topk"])
@pytest.mark.parametrize("tail", [True, False])
def test_teacher_equal_to_student_gives_zero_loss_and_gradient(estimator: str, tail: bool) -> None:
    torch.manual_seed(1)
    logp = torch.log_softmax(torch.randn(2, 3, 8), -1)
    top = logp.topk(4, dim=-1).values
    sampled = logp[..., 0].clone().requires_grad_(True)
    top_s = top.clone().requires_grad_(True)
    loss, _ = distill_loss(
        sampled,
        logp[..., 0],
        MASK,
        estimator=estimator,
        student_topk_log_probs=top_s,
        teacher_topk_log_probs=top,
        topk_tail=tail,
    )
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    grad = sampled.grad if estimator != "topk" else top_s.grad
    assert grad.abs().max().item() == pytest.approx(0.0, abs=1e-6)


def test_bad_inputs_name_the_problem() -> None:
    with pytest.raises(ValueError, match="topk"):
        distill_loss(S, T, MASK, estimator="topk")
    with pytest.raises(ValueError, match="teacher_log_prob"):
        distill_loss(S, None, MASK, estimator="k1")
    with pytest.raises(ValueError, match="one shape"):
        topk_reverse_kl(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4))
    with pytest.raises(UnknownNameError):
        sampled_token_reverse_kl(S, T, "k9")


def test_registry_entries() -> None:
    assert DISTILL_ESTIMATORS.names() == ["k1", "k3", "topk"]
    assert DISTILL_ESTIMATORS.needs("topk", "needs_topk") is True
    assert DISTILL_ESTIMATORS.needs("k3", "needs_topk") is False
