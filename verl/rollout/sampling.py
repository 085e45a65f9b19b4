"""Choose the next token from logits: greedy, temperature, top-k, top-p; with its log-prob.

Sampling is inverse-CDF with ONE uniform number per row per step (``uniforms``), instead of
``torch.multinomial`` or Gumbel noise over the whole vocabulary. Two reasons: it is cheap
(one cumulative sum, no vocabulary-sized random tensor), and the caller can draw the uniforms
for every row of the full batch each step and index the rows still running, so which rows
are still running (batch compaction) never changes what the others sample.

Log-probs follow the convention of ``verl.rollout.base``: ``log_softmax(logits / T)`` at the
chosen token, before top-k / top-p truncation, with ``T = 1`` for temperature 0.
"""

from __future__ import annotations

import torch

__all__ = ["sample_next_tokens"]


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
