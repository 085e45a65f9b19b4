"""Choose the next token from logits: greedy, temperature, top-k, top-p; with its log-prob.

Sampling is inverse-CDF with ONE uniform number per row per step (``uniforms``), instead of
``torch.multinomial`` or Gumbel noise over the whole vocabulary: it is cheap (one cumulative
sum, no vocabulary-sized random tensor), and the uniforms can be a function of the sample
alone. :func:`row_uniforms` gives them: the uniform of sample ``r`` (its row in the
``repeat_interleave`` output of a ``generate`` call) at its ``t``-th generated token is a
hash of ``(seed, r, t)`` (a counter-based generator, no generator state). So what a sample
draws depends on the call's seed, its row and its own token index only: not on which rows
run beside it (batch compaction), on the slot it occupies or the step at which it was
admitted (continuous batching, :mod:`verl.rollout.continuous`).

Log-probs follow the convention of ``verl.rollout.base``: ``log_softmax(logits / T)`` at the
chosen token, before top-k / top-p truncation, with ``T = 1`` for temperature 0.
"""

from __future__ import annotations

import torch

__all__ = ["row_uniforms", "sample_next_tokens"]

_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, m: int) -> torch.Tensor:
    """``x * m mod 2**32`` for int64 ``x`` in [0, 2**32) without int64 overflow: the low
    and high 16 bits of ``x`` are multiplied separately (each product < 2**48)."""
    low = (x & 0xFFFF) * m
    high = (((x >> 16) * m) & 0xFFFF) << 16
    return (low + high) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xor-shift-multiply, the "lowbias32" constants), elementwise
    on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def row_uniforms(seed: int, rows: torch.Tensor, steps: torch.Tensor | int) -> torch.Tensor:
    """Uniforms in [0, 1) (float32, 24 random bits like ``torch.rand``), one per entry of
    ``rows`` (1-D long: sample indices): a hash of ``(seed, row, step)``, where ``steps``
    (same shape, or one int for all) is each sample's token index.

    Schedule independence: the value for a sample depends on nothing else, so a sample
    draws the same numbers whichever rows share its decode step. ``seed`` is any int
    (reduced mod 2**64).
    """
    seed %= 2**64
    rows = rows.to(torch.long)
    if not isinstance(steps, torch.Tensor):
        steps = torch.full_like(rows, int(steps))
    steps = steps.to(device=rows.device, dtype=torch.long)
    h = _mix32(torch.full_like(rows, (seed & _M32) ^ 0x9E3779B9))
    h = _mix32(h ^ ((seed >> 32) & _M32))
    h = _mix32(h ^ (rows & _M32))
    h = _mix32(h ^ (steps & _M32))
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


def _inverse_cdf(cdf: torch.Tensor, total: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index ``i`` with ``cdf[i-1] < (1-u) * total <= cdf[i]``, per row.

    ``cdf`` (rows, V) non-decreasing, ``total`` (rows, 1) the mass to sample from (a prefix of
    ``cdf`` for truncated distributions), ``uniforms`` (rows,) in [0, 1). ``1 - u`` lies in
    (0, 1], so the target is > 0 and <= total: a zero-probability token (flat step of the
    cdf) is never returned and the search never runs past the sampled mass.
    """
    target = (1.0 - uniforms).unsqueeze(-1) * total
    idx = torch.searchsorted(cdf, target.to(cdf.dtype), right=False)
    return idx.clamp_max_(cdf.shape[-1] - 1).squeeze(-1)


def sample_next_tokens(
    logits: torch.Tensor,
    *,
    greedy: bool,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row and return ``(tokens (rows,) long, log_probs (rows,) float32)``.

    ``logits`` (rows, vocab), any float dtype (computed in float32). ``greedy`` takes the
    argmax (``temperature`` then only sets the log-prob temperature). Otherwise the tempered
    distribution, truncated to the ``top_k`` largest logits (``-1`` = off) and then to the
    smallest prefix whose probability reaches ``top_p``, is sampled with ``uniforms``
    (rows,) in [0, 1).
    """
    logits = logits.float()
    temp = float(temperature) if temperature > 0 else 1.0
    scaled = logits / temp if temp != 1.0 else logits
    log_probs = scaled.log_softmax(dim=-1)
    vocab = logits.shape[-1]
    if greedy:
        tokens = logits.argmax(dim=-1)
    else:
        if uniforms is None:
            raise ValueError("sampling (greedy=False) needs uniforms (rows,) in [0, 1)")
        use_top_k = 0 < top_k < vocab
        if use_top_k or top_p < 1.0:
            if use_top_k:
                values, order = scaled.topk(top_k, dim=-1)  # sorted, largest first
                probs = values.softmax(dim=-1)
            else:
                values, order = scaled.sort(dim=-1, descending=True)
                probs = log_probs.gather(-1, order).exp()
            cdf = probs.cumsum(dim=-1)
            if top_p < 1.0:
                # Keep token j while the mass before it is < top_p: the smallest prefix
                # reaching top_p (always at least the first token).
                kept = ((cdf - probs) < top_p).sum(dim=-1, keepdim=True)
                total = cdf.gather(-1, kept - 1)
            else:
                total = cdf[:, -1:]
            tokens = order.gather(-1, _inverse_cdf(cdf, total, uniforms).unsqueeze(-1))
            tokens = tokens.squeeze(-1)
        else:
            cdf = log_probs.exp().cumsum(dim=-1)
            tokens = _inverse_cdf(cdf, cdf[:, -1:], uniforms)
    chosen = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, chosen
