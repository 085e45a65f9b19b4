"""Chunked log-probability and entropy kernels over a ``(rows, vocab)`` logits tensor.

Contract: :func:`logprobs_from_logits` / :func:`entropy_from_logits` take logits of any
float dtype and shape ``(..., vocab)`` and return float32 ``(...)``, upcasting at most
``chunk_size`` rows to float32 at a time; their backward passes recompute the softmax per
chunk from the saved input (no float32 copy is kept for autograd). :class:`LogProbEntropy`
scores float32 ``(rows, vocab)`` logits of one LM-head chunk (log-probs and, when asked,
entropies in one pass); :func:`verl.kernels.torch_functional.compute_response_log_probs`
calls it per chunk. Nothing here knows about models.
"""

from __future__ import annotations

import torch

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "LogProbEntropy",
    "check_chunk_size",
    "entropy_from_logits",
    "logprobs_from_logits",
    "row_chunks",
]

DEFAULT_CHUNK_SIZE = 128  # tokens per chunk; see bench/bench_logprob.py for the trade-off


def check_chunk_size(chunk_size: int) -> None:
    if chunk_size <= 0:
        raise ValueError(f"chunk_size={chunk_size} must be a positive number of rows")


def row_chunks(n_rows: int, chunk_size: int):
    for start in range(0, n_rows, chunk_size):
        yield start, min(start + chunk_size, n_rows)


class _ChunkedLogProb(torch.autograd.Function):
    """log softmax(x)[label] over rows of a 2-D ``(rows, vocab)`` tensor, chunk by chunk."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, chunk_size: int):
        n_rows = logits.shape[0]
        out = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        lse = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        for s, e in row_chunks(n_rows, chunk_size):
            chunk = logits[s:e].float()
            lse[s:e] = torch.logsumexp(chunk, dim=-1)
            out[s:e] = chunk.gather(-1, labels[s:e, None]).squeeze(-1) - lse[s:e]
        ctx.save_for_backward(logits, labels, lse)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, labels, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for s, e in row_chunks(logits.shape[0], ctx.chunk_size):
            g = grad_out[s:e].float()
            # d/dx_j log p_label = onehot_j - p_j
            chunk = torch.exp(logits[s:e].float() - lse[s:e, None]).mul_(-g[:, None])
            chunk.scatter_add_(-1, labels[s:e, None], g[:, None])
            grad[s:e] = chunk
        return grad, None, None


class _ChunkedEntropy(torch.autograd.Function):
    """Entropy of softmax(x) over rows of a 2-D ``(rows, vocab)`` tensor, chunk by chunk."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, chunk_size: int):
        n_rows = logits.shape[0]
        lse = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        mean_logit = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        for s, e in row_chunks(n_rows, chunk_size):
            chunk = logits[s:e].float()
            lse[s:e] = torch.logsumexp(chunk, dim=-1)
            probs = torch.exp(chunk - lse[s:e, None])
            # nansum: a -inf logit (a banned token) has p = 0 and contributes 0 * -inf -> 0
            mean_logit[s:e] = (probs * chunk).nansum(-1)
        ctx.save_for_backward(logits, lse, mean_logit)
        ctx.chunk_size = chunk_size
        # H = logsumexp(x) - E_p[x]
        return lse - mean_logit

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, lse, mean_logit = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for s, e in row_chunks(logits.shape[0], ctx.chunk_size):
            chunk = logits[s:e].float()  # a view when logits is already float32
            probs = torch.exp(chunk - lse[s:e, None])
            # dH/dx_j = -p_j (x_j - E_p[x])
            centered = chunk - mean_logit[s:e, None]
            centered.masked_fill_(probs == 0, 0.0)  # -inf logits get zero gradient, not nan
            grad[s:e] = centered.mul_(probs).mul_(-grad_out[s:e, None].float())
        return grad, None


class LogProbEntropy(torch.autograd.Function):
    """Log-probabilities of ``labels`` and (``with_entropy``) entropies of the rows of a
    float32 ``(rows, vocab)`` logits tensor in one pass: one log-sum-exp and one probability
    tensor serve both, and backward recomputes the probabilities once for both gradients
    (the entropy's only when the entropy reached the loss).

    Every vocabulary-wide temporary is a fresh allocation of ``rows x vocab`` floats, which
    a CPU fills page by page (a 100 MB chunk: ~20 ms of page faults per temporary against
    ~6 ms for the arithmetic), so there are as few as the math allows: forward one (the
    shifted exponentials, reused for the entropy's mean logit), backward one (the
    probabilities). ``disposable=True`` lets backward write the gradient into ``logits``
    itself: only for logits that nothing else reads after this function (a checkpointed
    chunk's, which backward recomputes)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, with_entropy: bool, disposable):
        ctx.set_materialize_grads(False)
        top = logits.amax(dim=-1)
        shifted = torch.sub(logits, top[:, None]).exp_()  # exp(x - max)
        total = shifted.sum(-1)
        lse = total.log().add_(top)
        log_probs = logits.gather(-1, labels[:, None]).squeeze(-1) - lse
        entropy = mean_logit = None
        if with_entropy:
            # E_p[x] = sum exp(x - max) x / sum exp(x - max); a -inf logit (a banned token)
            # has p = 0: 0 * -inf is nan, and nansum drops it
            mean_logit = shifted.mul_(logits).nansum(-1).div_(total)
            entropy = lse - mean_logit  # H = logsumexp(x) - E_p[x]
        del shifted
        ctx.save_for_backward(logits, labels, lse, mean_logit)
        ctx.disposable = bool(disposable)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        logits, labels, lse, mean_logit = ctx.saved_tensors
        probs = torch.sub(logits, lse[:, None]).exp_()
        g = grad_log_probs.float() if grad_log_probs is not None else None
        if grad_entropy is not None:
            # dH/dx_j = -p_j (x_j - E_p[x]); d log p_label / dx_j = onehot_j - p_j
            if ctx.disposable:
                grad = logits.sub_(mean_logit[:, None])
            else:
                grad = torch.sub(logits, mean_logit[:, None])
            grad.mul_(-grad_entropy.float()[:, None])
            if g is not None:
                grad.sub_(g[:, None])
            # a -inf logit has p = 0 and an infinite (x - E_p[x]): its 0 * inf is nan -> 0
            grad.mul_(probs).nan_to_num_(nan=0.0)
        elif g is not None:
            grad = probs.mul_(-g[:, None])
        else:
            return None, None, None, None
        if g is not None:
            grad.scatter_add_(-1, labels[:, None], g[:, None])
        return grad, None, None, None


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> torch.Tensor:
    """Log-probabilities of ``labels`` under ``softmax(logits)``.

    Args:
        logits: ``(..., vocab)`` any float dtype; only ``chunk_size`` rows are upcast to
            float32 at a time.
        labels: ``(...)`` integer token ids.
        chunk_size: rows (tokens) processed per chunk.

    Returns:
        ``(...)`` float32 log-probs. Differentiable w.r.t. ``logits``.
    """
    check_chunk_size(chunk_size)
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"logits shape {tuple(logits.shape)} does not match labels shape "
            f"{tuple(labels.shape)}: expected logits (..., vocab) and labels (...)"
        )
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1).long()
    return _ChunkedLogProb.apply(flat_logits, flat_labels, chunk_size).view(labels.shape)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits)`` along the last dim.

    Args:
        logits: ``(..., vocab)`` any float dtype; upcast to float32 one chunk at a time.
        chunk_size: rows (tokens) processed per chunk.

    Returns:
        ``(...)`` float32 entropies. Differentiable w.r.t. ``logits``.
    """
    check_chunk_size(chunk_size)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    return _ChunkedEntropy.apply(flat_logits, chunk_size).view(logits.shape[:-1])
