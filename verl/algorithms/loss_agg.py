"""Aggregation of a per-token loss matrix into a scalar loss, and the entropy loss.

Every policy/value/KL/entropy loss is first computed per token, shape
``(batch, response_len)``, then reduced by one of the modes below (``loss_agg_mode`` in the
config). With ``m`` the response mask, ``L`` the per-token loss, ``B`` the batch size and
``V = {i : sum_t m[i, t] > 0}`` the sequences with at least one valid token:

=========================== ==========================================================
``token-mean``              ``sum_{i,t} m L / sum_{i,t} m`` (every valid token weighs the
                            same; the default)
``seq-mean-token-sum``      ``mean_{i in V} sum_t m L``
``seq-mean-token-mean``     ``mean_{i in V} (sum_t m L / sum_t m)`` (every sequence weighs
                            the same; GSPO)
``seq-mean-token-sum-norm`` ``sum_{i,t} m L / (B * S)`` with ``S = loss_scale_factor``,
                            default ``response_len`` (Dr.GRPO: a constant normaliser, so
                            long and short responses are not reweighted)
=========================== ==========================================================

Sequences with no valid token are excluded from the sequence means (counting them as 0
would shrink the loss of a batch that happens to contain empty responses). Any mode over a
batch with no valid token returns 0, never NaN.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from verl.algorithms.core import entropy_from_logits, masked_mean, masked_sum
from verl.registry import LOSS_AGG_MODES

__all__ = [
    "LOSS_AGG_MODES",
    "agg_loss",
    "apply_entropy_bonus",
    "compute_entropy_loss",
]

# (loss_mat, loss_mask, loss_scale_factor) -> 0-dim loss; the modes below are registered in
# verl.registry.builtin under the names of the module docstring.
AggFn = Callable[..., torch.Tensor]


def _seq_mean(seq_losses: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    has_tokens = loss_mask.sum(dim=-1) > 0
    return masked_mean(seq_losses, has_tokens)


def _token_mean(loss_mat, loss_mask, loss_scale_factor=None):
    return masked_mean(loss_mat, loss_mask)


def _seq_mean_token_sum(loss_mat, loss_mask, loss_scale_factor=None):
    return _seq_mean(masked_sum(loss_mat, loss_mask, dim=-1), loss_mask)


def _seq_mean_token_mean(loss_mat, loss_mask, loss_scale_factor=None):
    return _seq_mean(masked_mean(loss_mat, loss_mask, dim=-1), loss_mask)


def _seq_mean_token_sum_norm(loss_mat, loss_mask, loss_scale_factor=None):
    scale = loss_mat.shape[-1] if loss_scale_factor is None else loss_scale_factor
    if scale <= 0:
        raise ValueError(f"loss_scale_factor={scale} must be positive")
    batch = max(int(loss_mat.shape[0]), 1) if loss_mat.dim() > 1 else 1
    return masked_sum(loss_mat, loss_mask) / (batch * scale)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar (see the module docstring for each mode's formula).

    Args:
        loss_mat: per-token loss, ``(batch, response_len)``.
        loss_mask: 1 on tokens that count, ``(batch, response_len)``.
        loss_agg_mode: ``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean`` or
            ``seq-mean-token-sum-norm``.
        loss_scale_factor: the constant ``S`` of ``seq-mean-token-sum-norm`` (default
            ``response_len``); ignored by the other modes.

    Returns:
        A 0-dim tensor, differentiable with respect to ``loss_mat``.
    """
    return LOSS_AGG_MODES.get(loss_agg_mode)(loss_mat, loss_mask, loss_scale_factor)


def compute_entropy_loss(
    logits_or_entropy: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregated policy entropy, in nats.

    Args:
        logits_or_entropy: either logits ``(batch, response_len, vocab)`` or an already
            computed per-token entropy ``(batch, response_len)`` (the actor usually keeps the
            latter to avoid holding full-vocabulary logits).
        response_mask: ``(batch, response_len)``.
        loss_agg_mode: how to reduce, see :func:`agg_loss`.

    Returns:
        0-dim tensor, the entropy to *maximise* (subtract ``coef *`` it from the loss, see
        :func:`apply_entropy_bonus`).
    """
    entropy = logits_or_entropy
    if entropy.dim() == response_mask.dim() + 1:
        entropy = entropy_from_logits(entropy)
    return agg_loss(entropy, response_mask, loss_agg_mode, loss_scale_factor)


def apply_entropy_bonus(
    policy_loss: torch.Tensor,
    logits_or_entropy: torch.Tensor,
    response_mask: torch.Tensor,
    entropy_coeff: float,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``policy_loss - entropy_coeff * entropy``: reward exploration by raising entropy.

    Returns ``(loss, entropy)`` where ``entropy`` is the aggregated entropy (for logging,
    differentiable). With ``entropy_coeff == 0`` the loss is returned unchanged, so no graph
    through the entropy is built into it.
    """
    entropy = compute_entropy_loss(logits_or_entropy, response_mask, loss_agg_mode)
    if entropy_coeff == 0:
        return policy_loss, entropy
    return policy_loss - entropy_coeff * entropy, entropy
