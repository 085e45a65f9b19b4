"""Masked statistics and entropy: the small tensor helpers every algorithm builds on.

A ``mask`` is a tensor broadcastable to ``x`` holding 1 (or a positive weight) on valid
positions and 0 elsewhere; bool, integer and float masks are all accepted. Masked positions
never leak into a result, even when ``x`` holds ``inf``/``nan`` there (right padding after a
response may hold anything). Reductions over zero valid elements return 0 instead of NaN, so
an all-padding micro-batch cannot poison a loss.
"""

from __future__ import annotations

import torch

__all__ = [
    "entropy_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]


def _as_weights(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    dtype = like.dtype if like.is_floating_point() else torch.float32
    return mask.to(device=like.device, dtype=dtype)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``x * mask`` over ``dim`` (all elements when ``None``); masked values are ignored.

    Shapes: ``x`` any, e.g. ``(batch, response_len)``; ``mask`` broadcastable to ``x``.
    Returns a 0-dim tensor when ``dim is None``, else ``x`` reduced over ``dim``.
    """
    w = _as_weights(mask, x)
    # torch.where rather than a plain product: 0 * inf in the padding would be NaN.
    masked = torch.where(w != 0, x * w, torch.zeros((), dtype=w.dtype, device=x.device))
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``x`` over the valid positions of ``mask``: ``sum(x * mask) / sum(mask)``.

    Shapes: ``x`` e.g. ``(batch, response_len)``, ``mask`` broadcastable to ``x``. With
    ``dim=None`` the mean is over every valid element (a 0-dim tensor); with ``dim=-1`` it is
    one mean per row, ``(batch,)``. A reduction with no valid element returns 0.
    """
    w = _as_weights(mask, x).expand_as(x)
    num = masked_sum(x, w, dim)
    den = w.sum() if dim is None else w.sum(dim=dim)
    safe_den = torch.where(den != 0, den, torch.ones_like(den))
    return torch.where(den != 0, num / safe_den, torch.zeros_like(num))


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the valid elements of ``x`` (a 0-dim tensor).

    ``unbiased=True`` applies Bessel's correction ``n / (n - 1)`` with ``n = sum(mask)``, as
    ``torch.var`` does. With ``n <= 1`` the spread is 0 and the correction is skipped, so the
    result is 0 rather than NaN or an error.
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = _as_weights(mask, x).expand_as(x).sum()
        safe = torch.where(n > 1, n - 1, torch.ones_like(n))
        var = torch.where(n > 1, var * n / safe, var)
    return var


def masked_whiten(
    x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise the valid elements of ``x`` to unit (unbiased) variance.

    ``(x - mean) / sqrt(var + eps)`` with the masked mean and unbiased masked variance; with
    ``shift_mean=False`` the mean is added back (scale only). Masked positions are set to 0.
    Statistics are computed in float64; the result has ``x``'s dtype.
    Shape: same as ``x``, e.g. ``(batch, response_len)``.
    """
    # Statistics in float64: a batch of equal values (e.g. every group's advantage 0, or one
    # shared non-representable score) must whiten to ~0, not to float32 rounding noise / eps.
    x64 = x.to(torch.float64) if x.dtype in (torch.float16, torch.bfloat16, torch.float32) else x
    mean = masked_mean(x64, mask)
    var = masked_var(x64, mask, unbiased=True)
    whitened = (x64 - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    valid = _as_weights(mask, x64).expand_as(x64) != 0
    return torch.where(valid, whitened, torch.zeros_like(whitened)).to(x.dtype)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution ``softmax(logits)`` over the last dim, in nats.

    Computed as ``-sum(p * log_softmax(l))`` with ``log_softmax(l) = (l - max) -
    log(sum(exp(l - max)))`` (a shifted logsumexp): every term stays small, so large logits
    neither overflow nor lose digits to cancellation as ``logsumexp(l) - sum(p l)`` would.
    ``-inf`` logits (banned tokens) contribute 0. Half precision is computed in float32. Shape: ``(..., vocab) -> (...)``, e.g.
    ``(batch, response_len, vocab)`` -> ``(batch, response_len)``. Differentiable.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    log_probs = torch.log_softmax(logits, dim=-1)
    probs = torch.exp(log_probs)
    log_probs = torch.where(torch.isfinite(log_probs), log_probs, torch.zeros_like(log_probs))
    return -(probs * log_probs).sum(dim=-1)
