"""On-policy distillation (OPD): the student's per-token reverse KL to a teacher as a loss.

The student samples responses; a frozen teacher scores every sampled token; the loss pulls
the student's next-token distribution ``s`` towards the teacher's ``t`` on the student's
own samples, through the reverse KL ``KL(s || t) = sum_v s(v) (log s(v) - log t(v))`` at
each response position. The signal is dense (one value per token), where a task reward is
one number per sequence.

Estimators (registered in ``verl.registry.builtin`` as ``DISTILL_ESTIMATORS``), with
``d = log s(y) - log t(y)`` at the sampled token ``y``:

============ ==========================================================================
``k1``        value ``d``: unbiased per-token estimate of ``KL(s || t)``, can be negative
``k3``        value ``exp(-d) + d - 1``: unbiased, >= 0, lower variance (``-d`` clamped
              to [-20, 20], the value to [0, 10], as :mod:`verl.algorithms.kl`)
``topk``      the full-distribution KL over the student's top-k tokens at the position
              (ids chosen before the update, see :func:`topk_reverse_kl`); exact, no
              sampling noise at the position, cost ``k`` log-probs per token of the teacher
============ ==========================================================================

Gradients. ``d`` is differentiable only through the student (the teacher's log-probs
arrive as detached data). For ``k1``/``k3`` the *value* is the estimator's, but the
gradient is that of ``d**2 / 2``, i.e. ``d * grad log s(y)``: with ``y`` drawn from ``s``
its expectation is the exact gradient of the position's reverse KL (the score-function
form; differentiating ``d`` itself would give zero in expectation, and ``k3`` itself the
*forward* KL's gradient). This is the straight-through ``k1+``/``k3+`` of
:func:`verl.algorithms.kl.kl_penalty`. Each position's KL is minimised on its own (the
effect of a token on later positions' KL is not propagated: a discount of 0 on the KL
"reward"). ``topk`` is differentiated as written.

Every per-token matrix is ``(batch, response_len)``, masked by ``response_mask`` and
reduced with a ``loss_agg_mode`` (:func:`verl.algorithms.agg_loss`). When the teacher
equals the student every estimator is 0 and so is its gradient.
"""

from __future__ import annotations

import torch

from verl.algorithms.loss_agg import agg_loss
from verl.registry import DISTILL_ESTIMATORS

__all__ = [
    "DISTILL_ESTIMATORS",
    "distill_loss",
    "sampled_token_reverse_kl",
    "topk_reverse_kl",
]

_TAIL_EPS = 1e-6  # smallest tail mass: a top-k that holds all of the mass leaves 0 behind


def _k1(diff: torch.Tensor) -> torch.Tensor:
    return diff


def _k3(diff: torch.Tensor) -> torch.Tensor:
    neg = torch.clamp(-diff, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(neg) + diff.clamp(-20.0, 20.0) - 1.0, min=0.0, max=10.0)


def sampled_token_reverse_kl(
    log_prob: torch.Tensor, teacher_log_prob: torch.Tensor, estimator: str = "k1"
) -> torch.Tensor:
    """Per-token reverse KL ``KL(student || teacher)`` estimated at the sampled tokens.

    Args:
        log_prob: the student's log-probs of the sampled tokens, ``(batch, response_len)``,
            differentiable.
        teacher_log_prob: the teacher's log-probs of the same tokens,
            ``(batch, response_len)``; detached here (the teacher takes no gradient).
        estimator: ``k1`` or ``k3`` (a registered :data:`DISTILL_ESTIMATORS` name that
            maps ``d = log_prob - teacher_log_prob`` to a per-token value).

    Returns:
        ``(batch, response_len)``: the estimator's value, with the gradient
        ``d * grad log_prob`` (module docstring). Masked positions are not zeroed.
    """
    diff = log_prob.float() - teacher_log_prob.detach().float()
    value = DISTILL_ESTIMATORS.get(estimator)(diff)
    grad_path = 0.5 * diff.square()
    return value.detach() + grad_path - grad_path.detach()


def topk_reverse_kl(
    student_topk_log_probs: torch.Tensor,
    teacher_topk_log_probs: torch.Tensor,
    tail: bool = True,
) -> torch.Tensor:
    """Reverse KL of the student's and the teacher's distributions restricted to ``k``
    tokens per position (the student's top-k).

    Both inputs are log-probs of the *full* vocabulary softmax, gathered at the same ``k``
    token ids. Two ways to make the ``k`` values a distribution:

    - ``tail=True`` (the default): a ``k + 1``-th bucket holds the rest of each side's mass,
      ``1 - sum exp(lp)`` (at least ``1e-6``). The result is the KL between the two
      distributions coarsened to ``{top-k ids, everything else}``, a lower bound on the
      full-vocabulary KL (data processing), equal to it when the ids hold all the mass;
    - ``tail=False``: each side is renormalised over the ``k`` ids
      (``lp - logsumexp(lp)``); the KL of the two conditionals given the top-k.

    Args:
        student_topk_log_probs: ``(batch, response_len, k)``, differentiable.
        teacher_topk_log_probs: ``(batch, response_len, k)``; detached here.
        tail: tail bucket (True) or renormalised (False).

    Returns:
        ``(batch, response_len)`` per-token KL, >= 0 up to rounding. Masked positions are
        not zeroed.
    """
    if student_topk_log_probs.shape != teacher_topk_log_probs.shape:
        raise ValueError(
            f"student top-k log-probs {tuple(student_topk_log_probs.shape)} and teacher top-k "
            f"log-probs {tuple(teacher_topk_log_probs.shape)} must have one shape "
            "(batch, response_len, k)"
        )
    s = student_topk_log_probs.float()
    t = teacher_topk_log_probs.detach().float()
    if not tail:
        s = s - torch.logsumexp(s, dim=-1, keepdim=True)
        t = t - torch.logsumexp(t, dim=-1, keepdim=True)
        return (s.exp() * (s - t)).sum(-1)
    head = (s.exp() * (s - t)).sum(-1)
    s_tail = (1.0 - s.exp().sum(-1)).clamp(min=_TAIL_EPS)
    t_tail = (1.0 - t.exp().sum(-1)).clamp(min=_TAIL_EPS)
    return head + s_tail * (s_tail.log() - t_tail.log())


def distill_loss(
    log_prob: torch.Tensor,
    teacher_log_prob: torch.Tensor | None,
    response_mask: torch.Tensor,
    *,
    estimator: str = "k1",
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
    student_topk_log_probs: torch.Tensor | None = None,
    teacher_topk_log_probs: torch.Tensor | None = None,
    topk_tail: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The distillation loss of one micro-batch: the aggregated per-token reverse KL.

    Args:
        log_prob: the student's log-probs of the sampled tokens, ``(batch, response_len)``.
        teacher_log_prob: the teacher's, ``(batch, response_len)`` (``k1``/``k3``; with
            ``topk`` only read for the ``distill_k1`` metric, may be None).
        response_mask: 1 on valid response tokens, ``(batch, response_len)``.
        estimator: ``k1``, ``k3`` or ``topk``.
        loss_agg_mode / loss_scale_factor: the reduction (:func:`verl.algorithms.agg_loss`).
        student_topk_log_probs / teacher_topk_log_probs: ``(batch, response_len, k)``, both
            required for ``topk``.
        topk_tail: see :func:`topk_reverse_kl`.

    Returns:
        ``(loss, metrics)``: the 0-dim loss and detached 0-dim metrics ``distill_loss`` (the
        loss) and ``distill_k1`` (token-mean of ``log_prob - teacher_log_prob``, when the
        teacher's sampled-token log-probs are given).
    """
    if estimator == "topk":
        if student_topk_log_probs is None or teacher_topk_log_probs is None:
            raise ValueError(
                "estimator='topk' needs student_topk_log_probs and teacher_topk_log_probs "
                "(batch, response_len, k)"
            )
        per_token = topk_reverse_kl(student_topk_log_probs, teacher_topk_log_probs, topk_tail)
    else:
        if teacher_log_prob is None:
            raise ValueError(f"estimator={estimator!r} needs teacher_log_prob")
        per_token = sampled_token_reverse_kl(log_prob, teacher_log_prob, estimator)
    loss = agg_loss(per_token, response_mask, loss_agg_mode, loss_scale_factor)
    metrics = {"distill_loss": loss.detach()}
    if teacher_log_prob is not None:
        diff = (log_prob.detach().float() - teacher_log_prob.float()) * response_mask
        metrics["distill_k1"] = diff.sum() / response_mask.sum().clamp(min=1)
    return loss, metrics
