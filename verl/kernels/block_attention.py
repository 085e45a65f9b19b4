"""Packed attention block by block: each query attends only the keys its sequence allows.

A packed micro-batch (:mod:`verl.kernels.packing`, :mod:`verl.kernels.prefix_packing`) lays
several sequences end to end in each bin. Run through the model with a ``(bins, width,
width)`` mask (or the block-diagonal mask transformers derives from restarting positions),
attention costs ``bins * width**2`` query-key pairs although each query may see only its own
sequence: with 1024-token bins of 80-token sequences, over 90% of that work is masked out.

Here the packer records its *blocks* instead: a block is a run of ``q_len`` query tokens at
flat position ``q_start`` (into ``bins * width``) that attend, causally, to themselves, and
fully to ``prefix_len`` earlier tokens at ``prefix_start`` (0 for a plain sequence; the
group's prompt for a response of a shared-prompt unit, whose prompt is a block of its own).
:func:`plan_block_attention` gathers the blocks into a few padded groups of shape ``(B, Lq)``
queries by ``(B, Lp + Lq)`` keys, and :func:`block_attention` computes each group with one
``scaled_dot_product_attention`` call and scatters the outputs back. Every query sees exactly
the keys it sees under the full mask, so the outputs agree with the masked pass up to float
rounding (``tests/kernels/test_block_attention.py``).

The model's attention reaches this path through transformers' attention registry:
:func:`install` registers a wrapper under ``"sdpa"`` that computes block attention when the
forward is given ``verl_block_plan=...`` (and the decode-step attention of
:mod:`verl.kernels.decode_attention` when given ``verl_decode_attention=True``) and is
transformers' own ``sdpa`` otherwise. The
plan counts the layers that used it, so a model whose attention bypassed the wrapper is
detected (:meth:`BlockAttentionPlan.check_used`) instead of silently attending across
sequences.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from verl.kernels import decode_attention

# (q_start, q_len, prefix_start, prefix_len), flat positions into bins * width
Block = tuple[int, int, int, int]

# Query and key slots of a group are rounded up to a multiple of this (few distinct shapes).
SLOT_MULTIPLE = 8
# A block joins the current group while the group's padded pairs stay within this factor of
# the pairs its blocks need (blocks sorted by size, so groups hold blocks of similar length).
MAX_PADDING_FACTOR = 1.3
# Most groups (SDPA calls per layer) one plan uses; beyond it the last group takes the rest.
MAX_GROUPS = 8

PLAN_KWARG = "verl_block_plan"
# bf16 / fp16 groups whose score matrix (blocks x heads x Lq x Lk, fp32) is at most this
# large are computed by _SmallAttention: on a CPU, SDPA's flash backward on many short
# blocks in bf16 measured 2-3x slower than it (bench/bench_packing.py).
SMALL_SCORES_BYTES = 64 * 2**20


@dataclass
class _Group:
    """Blocks computed by one SDPA call: ``B`` blocks, ``Lq`` query slots, ``Lk`` key slots
    (``Lp`` prefix slots then ``Lq`` own slots)."""

    shape: tuple[int, int, int]
    q_index: torch.Tensor  # (B * Lq,) flat position read by each query slot
    k_index: torch.Tensor  # (B * Lk,) flat position read by each key slot
    mask: torch.Tensor | None  # (B, 1, Lq, Lk) True = attend; None = plain causal (is_causal)
    keep: torch.Tensor  # (n,) query slots (into B * Lq) that are real tokens
    dest: torch.Tensor  # (n,) their flat positions
    _stacked: dict[int, torch.Tensor] = field(default_factory=dict)

    def stacked_mask(self, rep: int) -> torch.Tensor:
        """The mask for ``rep`` query heads per key head stacked along the query rows,
        ``(B, 1, rep * Lq, Lk)``; built once per plan, read by every layer."""
        if rep not in self._stacked:
            b, lq, lk = self.shape
            mask = self.mask
            if mask is None:
                mask = torch.ones(lq, lk, dtype=torch.bool, device=self.q_index.device).tril()
                mask = mask.expand(b, 1, lq, lk)
            self._stacked[rep] = mask.repeat(1, 1, rep, 1) if rep > 1 else mask
        return self._stacked[rep]


class BlockAttentionPlan:
    """The groups of one packed batch (see the module docstring); built once per forward,
    read by every layer."""

    def __init__(self, groups: list[_Group], num_positions: int) -> None:
        self.groups = groups
        self.num_positions = num_positions
        self.calls = 0

    @property
    def pairs(self) -> int:
        """Query-key pairs the groups compute (padding included)."""
        return sum(b * q * k for b, q, k in (g.shape for g in self.groups))

    def mark_used(self) -> None:
        self.calls += 1

    def check_used(self, layers: int) -> None:
        """Raise unless ``layers`` attention layers computed with this plan (call after the
        forward): a layer that did not ignored the packing and attended across sequences."""
        if self.calls < layers:
            raise RuntimeError(
                f"block attention: {self.calls} of {layers} attention layers used the packed "
                "batch's block plan; the model's attention does not go through transformers' "
                "'sdpa' entry (verl.kernels.block_attention.install), so packed sequences would "
                "attend to each other"
            )


class _SmallAttention(torch.autograd.Function):
    """Masked attention of small blocks in ``dtype`` (bf16 / fp16). The scores and their
    softmax are fp32 (the score matmul on fp32 copies of q and k, as flash attention
    accumulates them); the other matmuls (probabilities x values, and the backward's) run
    in ``dtype``, as autocast runs a linear layer's. Backward recomputes the probabilities
    from the saved log-sum-exp: only q, k, v, the output and the log-sum-exp are kept, as
    flash attention keeps them. ``query`` ``(B, kv_heads, rows, d)`` holds the query heads
    of each key head's group stacked along ``rows``, so the key and value heads are never
    repeated."""

    @staticmethod
    def _probs(query, key, mask, scale, lse=None):
        scores = torch.matmul(query.float(), key.float().transpose(-1, -2)).mul_(scale)
        scores.masked_fill_(~mask, float("-inf"))
        if lse is None:
            lse = torch.logsumexp(scores, dim=-1, keepdim=True)
        return scores.sub_(lse).exp_(), lse

    @staticmethod
    def forward(ctx, query, key, value, mask, scale, dtype):
        probs, lse = _SmallAttention._probs(query, key, mask, scale)
        value = value.to(dtype)
        out = torch.matmul(probs.to(dtype), value)
        ctx.save_for_backward(query, key, value, mask, lse, out)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, mask, lse, out = ctx.saved_tensors
        dtype = value.dtype
        with torch.autocast(query.device.type, enabled=False):
            probs, _ = _SmallAttention._probs(query, key, mask, ctx.scale, lse)
            grad_out = grad_out.to(dtype)
            grad_v = torch.matmul(probs.to(dtype).transpose(-1, -2), grad_out)
            grad_probs = torch.matmul(grad_out, value.transpose(-1, -2)).float()
            row = (grad_out.float() * out.float()).sum(-1, keepdim=True)
            grad_scores = grad_probs.sub_(row).mul_(probs).mul_(ctx.scale).to(dtype)
            grad_q = torch.matmul(grad_scores, key.to(dtype)).to(query.dtype)
            grad_k = torch.matmul(grad_scores.transpose(-1, -2), query.to(dtype)).to(key.dtype)
        return grad_q, grad_k, grad_v, None, None, None


def _attend(group: _Group, q, k, v, scale, dropout):
    """One group's attention, ``(B, heads, Lq, d)``: :class:`_SmallAttention` for small
    groups computed on a CPU in bf16 / fp16 (autocast's dtype, else the inputs') without
    dropout, else ``scaled_dot_product_attention`` (on a CPU in fp32 it measured faster
    than the matmuls)."""
    b, heads, lq, dim = q.shape
    kv_heads, lk = k.shape[1], k.shape[2]
    device = q.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else q.dtype
    scale = dim**-0.5 if scale is None else scale
    small = b * heads * lq * lk * 4 <= SMALL_SCORES_BYTES
    low_precision = dtype in (torch.bfloat16, torch.float16)
    if device == "cpu" and low_precision and small and dropout == 0.0:
        rep = heads // kv_heads
        # q, k, v in the compute dtype, as autocast hands them to SDPA (and as saved)
        with torch.autocast(device, enabled=False):
            out = _SmallAttention.apply(
                q.to(dtype).reshape(b, kv_heads, rep * lq, dim),
                k.to(dtype),
                v.to(dtype),
                group.stacked_mask(rep),
                scale,
                dtype,
            )
        return out.view(b, heads, lq, -1)
    # enable_gqa (torch >= 2.5): the key and value heads are not repeated (nor saved repeated)
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=group.mask,
        dropout_p=dropout,
        scale=scale,
        is_causal=group.mask is None,
        enable_gqa=kv_heads != heads,
    )


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _group_blocks(blocks: list[Block]) -> list[list[Block]]:
    """Blocks in groups of similar size (see :data:`MAX_PADDING_FACTOR`)."""
    ordered = sorted(blocks, key=lambda b: (b[1] + b[3], b[1]))
    groups: list[list[Block]] = []
    current: list[Block] = []
    need = lq_max = lp_max = 0
    for block in ordered:
        _, lq, _, lp = block
        if current and len(groups) < MAX_GROUPS - 1:
            q, p = max(lq_max, lq), max(lp_max, lp)
            padded = (len(current) + 1) * q * (p + q)
            if padded > MAX_PADDING_FACTOR * (need + lq * (lp + lq)):
                groups.append(current)
                current, need, lq_max, lp_max = [], 0, 0, 0
        current.append(block)
        need += lq * (lp + lq)
        lq_max, lp_max = max(lq_max, lq), max(lp_max, lp)
    if current:
        groups.append(current)
    return groups


def _build_group(blocks: list[Block], device: torch.device) -> _Group:
    t = torch.tensor(blocks, dtype=torch.long)
    q_start, q_len, p_start, p_len = t.unbind(1)
    lp_max = int(p_len.max())
    # plain sequences of one length: no padding, SDPA's own causal mask
    uniform = lp_max == 0 and bool((q_len == q_len[0]).all())
    lq = int(q_len[0]) if uniform else _round_up(int(q_len.max()), SLOT_MULTIPLE)
    lp = _round_up(lp_max, SLOT_MULTIPLE) if lp_max else 0
    b = len(blocks)
    s = torch.arange(lq)
    # padding slots read a real token of their block (masked, or their output dropped)
    own = q_start[:, None] + torch.minimum(s[None, :], q_len[:, None] - 1)  # (B, Lq)
    keys = [own]
    if lp:
        j = torch.arange(lp)
        last = (p_len - 1).clamp_min(0)
        prefix = torch.where(
            p_len[:, None] > 0,
            p_start[:, None] + torch.minimum(j[None, :], last[:, None]),
            own[:, :1],
        )
        keys.insert(0, prefix)
    k_index = torch.cat(keys, dim=1)  # (B, Lp + Lq)
    real_q = s[None, :] < q_len[:, None]  # (B, Lq)
    mask = None
    if not uniform:
        causal = s[None, :, None] >= s[None, None, :]  # (1, Lq, Lq): key slot t <= query s
        own_mask = causal & (s[None, None, :] < q_len[:, None, None])
        parts = [own_mask]
        if lp:
            parts.insert(0, (j[None, None, :] < p_len[:, None, None]).expand(b, lq, lp))
        mask = torch.cat(parts, dim=2)[:, None].to(device)  # (B, 1, Lq, Lp + Lq)
    keep = real_q.reshape(-1).nonzero().squeeze(1)
    dest = (q_start[:, None] + s[None, :]).reshape(-1)[keep]
    return _Group(
        shape=(b, lq, lp + lq),
        q_index=own.reshape(-1).to(device),
        k_index=k_index.reshape(-1).to(device),
        mask=mask,
        keep=keep.to(device),
        dest=dest.to(device),
    )


def plan_block_attention(
    blocks: list[Block], num_positions: int, device: torch.device | str = "cpu"
) -> BlockAttentionPlan:
    """The plan of a packed batch of ``num_positions`` flat positions (``bins * width``)
    whose real tokens are covered by ``blocks`` (filler positions are in no block; their
    attention output is zero)."""
    blocks = [b for b in blocks if b[1] > 0]
    for q_start, q_len, p_start, p_len in blocks:
        if q_start < 0 or q_start + q_len > num_positions or p_len < 0:
            raise ValueError(f"block {(q_start, q_len, p_start, p_len)} outside {num_positions}")
        if p_len and (p_start < 0 or p_start + p_len > q_start):
            raise ValueError(
                f"block {(q_start, q_len, p_start, p_len)}: its prefix must end before its queries"
            )
    device = torch.device(device)
    groups = [_build_group(g, device) for g in _group_blocks(blocks)]
    return BlockAttentionPlan(groups, num_positions)


def block_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    plan: BlockAttentionPlan,
    scaling: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Attention of a packed batch by its plan.

    Args:
        query: ``(bins, heads, width, head_dim)``; key / value ``(bins, kv_heads, width,
            head_dim)`` (``heads`` a multiple of ``kv_heads``), as transformers' attention
            functions receive them.

    Returns:
        ``(bins, width, heads, head_dim)`` (transformers' attention output layout); filler
        positions are 0.
    """
    bins, heads, width, dim = query.shape
    kv_heads = key.shape[1]
    if bins * width != plan.num_positions:
        raise ValueError(
            f"block attention: the plan covers {plan.num_positions} positions, the batch has "
            f"{bins} x {width}"
        )
    q_flat = query.transpose(1, 2).reshape(bins * width, heads, dim)
    k_flat = key.transpose(1, 2).reshape(bins * width, kv_heads, dim)
    v_flat = value.transpose(1, 2).reshape(bins * width, kv_heads, value.shape[-1])
    out = None
    for g in plan.groups:
        b, lq, lk = g.shape
        q = q_flat.index_select(0, g.q_index).view(b, lq, heads, dim).transpose(1, 2)
        k = k_flat.index_select(0, g.k_index).view(b, lk, kv_heads, dim).transpose(1, 2)
        v = v_flat.index_select(0, g.k_index).view(b, lk, kv_heads, -1).transpose(1, 2)
        o = _attend(g, q, k, v, scaling, dropout)
        o = o.transpose(1, 2).reshape(b * lq, heads, -1).index_select(0, g.keep)
        if out is None:
            out = o.new_zeros(bins * width, heads, o.shape[-1])
        out = out.index_copy(0, g.dest, o.to(out.dtype))
    if out is None:  # no real token
        out = query.new_zeros(bins * width, heads, value.shape[-1])
    plan.mark_used()
    return out.view(bins, width, heads, -1)


_installed: dict[str, object] = {}
_install_lock = threading.Lock()


def install() -> None:
    """Register the block-attention wrapper as transformers' ``"sdpa"`` attention (once per
    process): with ``verl_block_plan`` in the forward's keyword arguments a layer computes
    :func:`block_attention`; with ``verl_decode_attention=True`` (the native rollout's decode
    steps) :func:`verl.kernels.decode_attention.decode_attention` where it applies; otherwise
    transformers' own ``sdpa`` function runs unchanged."""
    with _install_lock:
        if "sdpa" in _installed:
            return
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

        original = ALL_ATTENTION_FUNCTIONS["sdpa"]

        def sdpa_or_block_attention(module, query, key, value, attention_mask, **kwargs):
            plan = kwargs.pop(PLAN_KWARG, None)
            decode = kwargs.pop(decode_attention.DECODE_KWARG, False)
            if plan is None:
                if decode and decode_attention.applies(query, key, attention_mask, kwargs):
                    out = decode_attention.decode_attention(
                        query, key, value, attention_mask, scaling=kwargs.get("scaling")
                    )
                    return out, None
                return original(module, query, key, value, attention_mask, **kwargs)
            refuse_unsupported_kwargs("block attention", module, kwargs)
            out = block_attention(
                query,
                key,
                value,
                plan,
                scaling=kwargs.get("scaling"),
                dropout=kwargs.get("dropout", 0.0),
            )
            return out, None

        AttentionInterface.register("sdpa", sdpa_or_block_attention)
        _installed["sdpa"] = original


def refuse_unsupported_kwargs(what: str, module: Any, kwargs: dict[str, Any]) -> None:
    """Raise when a model's attention call passes an option the replacement attention
    (``what``: block or sequence-parallel attention) does not implement."""
    for unsupported in ("sliding_window", "softcap", "position_bias"):
        if kwargs.get(unsupported) is not None:
            raise ValueError(
                f"{what}: {type(module).__name__} passes {unsupported}="
                f"{kwargs[unsupported]!r}, which {what} does not implement"
            )
