"""Log-probs and entropies from vocabulary-sharded logits, without gathering the vocabulary.

With tensor parallelism (``verl.engine.tensor_parallel``) the LM head is split by rows of
its ``(vocab, hidden)`` weight: tensor rank ``r`` of ``t`` holds vocabulary ids
``[r * V / t, (r + 1) * V / t)`` and its head produces only those logits, ``(rows, V / t)``.
:class:`VocabParallelLogProbEntropy` scores them with three reductions over the tensor
group, each of ``rows`` numbers (never ``rows x V``):

- ``max``: the global maximum logit per row (for a stable exponent);
- ``sum`` of ``(sum_j exp(x_j - max), sum_j exp(x_j - max) x_j, x_label)``: the partition
  function, the unnormalised mean logit (entropy only) and the taken token's logit, which
  only the rank owning the label contributes (the others add 0).

Then ``log p(label) = x_label - lse`` and ``H = lse - E_p[x]``, exactly as
:class:`verl.kernels.logprob_kernels.LogProbEntropy` computes them on the full row.
Backward needs no communication: the gradient of a rank's logits is
``p_j (g_H (E_p[x] - x_j) - g_lp) + g_lp [j = label]`` over its own columns, with the global
``lse`` and ``E_p[x]`` saved from forward; the callers' upstream gradients are the same on
every tensor rank (every rank computes the same loss).

A head is marked vocabulary-parallel with :func:`mark_vocab_parallel`;
:func:`vocab_parallel_of` reads the mark (``verl.kernels.torch_functional`` does), and
:func:`local_logits` is the context in which the marked head returns this rank's shard of
the logits rather than the gathered full row (which every other caller, generation
included, receives).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "VocabParallelLogProbEntropy",
    "VocabShard",
    "local_logits",
    "mark_vocab_parallel",
    "vocab_parallel_log_probs",
    "vocab_parallel_of",
    "wants_local_logits",
]

_TAG = "_verl_vocab_parallel"
_state = threading.local()


@dataclass(frozen=True)
class VocabShard:
    """This rank's slice of a vocabulary-parallel head: ids ``[start, start + size)`` of
    ``vocab``, reduced over ``group`` (the tensor-parallel ranks)."""

    group: Any
    start: int
    size: int
    vocab: int


def mark_vocab_parallel(head: nn.Module, shard: VocabShard) -> None:
    """Mark ``head`` as producing ``shard``'s logits (see the module docstring)."""
    setattr(head, _TAG, shard)


def vocab_parallel_of(head: nn.Module) -> VocabShard | None:
    """The :class:`VocabShard` :func:`mark_vocab_parallel` gave ``head``, or None."""
    return getattr(head, _TAG, None)


@contextlib.contextmanager
def local_logits() -> Iterator[None]:
    """Marked heads called in this block (this thread) return this rank's logit shard."""
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    try:
        yield
    finally:
        _state.depth = depth


def wants_local_logits() -> bool:
    """Whether the caller is inside :func:`local_logits`."""
    return getattr(_state, "depth", 0) > 0


class VocabParallelLogProbEntropy(torch.autograd.Function):
    """``(log_probs, entropy)`` of ``labels`` from float32 logit shards ``(rows, V / t)``.

    Args of ``apply``: ``logits`` (this rank's columns), ``labels (rows,)`` global token
    ids, ``shard`` (:class:`VocabShard`), ``with_entropy``. Returns float32 ``(rows,)``
    each (``entropy`` None unless ``with_entropy``), the same on every rank of the group.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, shard: VocabShard, with_entropy):
        ctx.set_materialize_grads(False)
        top = logits.amax(dim=-1)
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=shard.group)
        shifted = torch.sub(logits, top[:, None]).exp_()
        local = labels - shard.start
        owned = (local >= 0) & (local < shard.size)
        taken = logits.gather(-1, local.clamp(0, shard.size - 1)[:, None]).squeeze(-1)
        parts = [shifted.sum(-1), torch.where(owned, taken, torch.zeros_like(taken))]
        if with_entropy:
            # a -inf logit (a banned token) has p = 0: 0 * -inf is nan, and nansum drops it
            parts.append(shifted.mul_(logits).nansum(-1))
        del shifted
        sums = torch.stack(parts)
        dist.all_reduce(sums, group=shard.group)
        total = sums[0]
        lse = total.log() + top
        log_probs = sums[1] - lse
        entropy = mean_logit = None
        if with_entropy:
            mean_logit = sums[2] / total
            entropy = lse - mean_logit  # H = logsumexp(x) - E_p[x]
        ctx.save_for_backward(logits, local, owned, lse, mean_logit)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        logits, local, owned, lse, mean_logit = ctx.saved_tensors
        probs = torch.sub(logits, lse[:, None]).exp_()
        g = grad_log_probs.float() if grad_log_probs is not None else None
        if grad_entropy is not None:
            # dH/dx_j = -p_j (x_j - E_p[x]); d log p_label / dx_j = [j = label] - p_j
            grad = torch.sub(logits, mean_logit[:, None]).mul_(-grad_entropy.float()[:, None])
            if g is not None:
                grad.sub_(g[:, None])
            grad.mul_(probs).nan_to_num_(nan=0.0)
        elif g is not None:
            grad = probs.mul_(-g[:, None])
        else:
            return None, None, None, None
        if g is not None:
            index = local.clamp(0, logits.shape[-1] - 1)[:, None]
            grad.scatter_add_(-1, index, torch.where(owned, g, torch.zeros_like(g))[:, None])
        return grad, None, None, None


def vocab_parallel_log_probs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    shard: VocabShard,
    with_entropy: bool = False,
    with_sum_pi_squared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(log_probs, entropy, sum_pi_squared)`` of float32 logit shards ``(rows, V / t)``.

    ``sum_pi_squared`` (``sum_v p(v)^2``, detached) costs one more reduction of ``rows``
    numbers. Collective over ``shard.group``: every rank calls it with its own shard and the
    same ``labels``.
    """
    if logits.shape[-1] != shard.size:
        raise ValueError(
            f"vocabulary-parallel logits have {logits.shape[-1]} columns, but this rank's "
            f"head owns {shard.size} ids ([{shard.start}, {shard.start + shard.size}))"
        )
    log_probs, entropy = VocabParallelLogProbEntropy.apply(logits, labels, shard, with_entropy)
    sum_pi_squared = None
    if with_sum_pi_squared:
        with torch.no_grad():  # sum_v p_v^2 = sum_v exp(x_v - max)^2 / (sum_v exp(x_v - max))^2
            top = logits.amax(dim=-1)
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=shard.group)
            shifted = torch.sub(logits, top[:, None]).exp_()
            sums = torch.stack([shifted.sum(-1), shifted.square_().sum(-1)])
            dist.all_reduce(sums, group=shard.group)
            sum_pi_squared = sums[1] / sums[0].square()
    return log_probs, entropy, sum_pi_squared
