"""Attention of one new token per row against a KV cache (a decode step), on a CPU.

transformers' ``sdpa`` attention with a mask repeats the key and value heads of a
grouped-query model (``repeat_kv``: a copy of the whole cache, per layer and step), and
under autocast SDPA casts the cached keys and values to the autocast dtype (another copy).
On this CPU those copies and bf16 SDPA took most of a decode step's attention: W3's
(SmolLM2, 9 query / 3 key heads, 32 rows, ~128 columns) SDPA calls 0.69 ms each plus
0.16 ms of copies, W2's (tiny Qwen2, 256 rows) copies 0.33 s of a 0.65 s generation.

With a single query per row, the query heads that share a key head can be stacked as that
head's queries (``(rows, kv_heads, group, dim)``): one attention call then reads each
cached key and value once, and no head is repeated. :func:`decode_attention` computes that:

- under CPU autocast to bf16 / fp16 it computes what the training pass's block attention
  (:mod:`verl.kernels.block_attention`) computes for the same tokens: scores and softmax in
  fp32 from queries and keys rounded to the autocast dtype, probabilities rounded to it
  times values, the output in it. The cache should then hold float32 tensors whose values
  are already rounded to the autocast dtype (``PreallocatedKVCache(dtype=float32,
  round_to=bf16)``): the matmuls read them without a copy, and fp32 matmuls on these small
  shapes measured faster here than bf16 SDPA (W2's shape: 0.43 vs 0.74 ms);
- otherwise one ``scaled_dot_product_attention`` call in the inputs' dtype (transformers'
  result within 1e-6).

The native rollout engine asks for it (``verl_decode_attention=True`` in the forward's
keyword arguments); :func:`verl.kernels.block_attention.install`'s ``"sdpa"`` wrapper routes
the call here when :func:`applies` (CPU autocast to bf16 / fp16) and to transformers' own
function otherwise.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

DECODE_KWARG = "verl_decode_attention"

# Keyword arguments of an attention call that this path does not implement.
_UNSUPPORTED = ("sliding_window", "softcap", "position_bias", "s_aux", "sinks")


def applies(query: torch.Tensor, key: torch.Tensor, mask: Any, kwargs: dict) -> bool:
    """Whether the registered ``"sdpa"`` wrapper computes this call with
    :func:`decode_attention`: a CPU tensor under autocast to bf16 / fp16, one query
    position, key heads dividing the query heads, no dropout, a mask of one row per batch
    row (broadcast over heads or one per query head) and no feature it does not implement.
    In fp32 transformers' function keeps the call: stacking measured no faster there (W2's
    fp32 generation 0.66 s either way) and its results differ from transformers' in the last
    bits, which would change fp32 runs that are compared bit for bit with earlier ones (the
    opt-in fp32 lean forward of :mod:`verl.rollout.lean_forward` inlines its own)."""
    if query.device.type != "cpu" or query.shape[2] != 1:
        return False
    if not torch.is_autocast_enabled("cpu"):
        return False
    if torch.get_autocast_dtype("cpu") not in (torch.bfloat16, torch.float16):
        return False
    heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads == 0 or heads % kv_heads or kwargs.get("dropout", 0.0):
        return False
    if any(kwargs.get(name) is not None for name in _UNSUPPORTED):
        return False
    if mask is None:
        return True
    return (
        mask.dim() == 4
        and mask.shape[0] in (1, query.shape[0])
        and mask.shape[1] in (1, heads)
        and mask.shape[2] == 1
        and mask.shape[3] == key.shape[2]
    )


def decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None = None,
) -> torch.Tensor:
    """Attention of ``query`` ``(B, heads, 1, d)`` over ``key`` / ``value``
    ``(B, kv_heads, L, d)``; ``mask`` (None, bool with True = attend, or additive) is
    ``(B or 1, 1 or heads, 1, L)``. Returns ``(B, 1, heads, d_v)``, the layout transformers'
    attention functions return."""
    b, heads, _, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    group = heads // kv_heads
    scale = dim**-0.5 if scaling is None else scaling
    q = query.reshape(b, kv_heads, group, dim)
    if mask is not None and mask.shape[1] != 1:
        mask = mask.reshape(mask.shape[0], kv_heads, group, length)
    device = query.device.type
    low = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    if low not in (torch.bfloat16, torch.float16):
        out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scale)
        return out.reshape(b, 1, heads, value.shape[-1])
    with torch.autocast(device, enabled=False):
        scores = torch.matmul(q.to(low).float(), _rounded(key, low).transpose(-1, -2))
        scores.mul_(scale)
        if mask is not None and mask.dtype == torch.bool:
            scores.masked_fill_(~mask, float("-inf"))
        elif mask is not None:
            scores.add_(mask.float())
        probs = torch.softmax(scores, dim=-1).to(low).float()
        out = torch.matmul(probs, _rounded(value, low)).to(low)
    return out.reshape(b, 1, heads, value.shape[-1])


def _rounded(x: torch.Tensor, low: torch.dtype) -> torch.Tensor:
    """``x`` as float32 holding values of dtype ``low``: as is when it is float32 (the cache
    stores rounded values), else converted (a copy)."""
    return x if x.dtype == torch.float32 else x.to(low).float()
