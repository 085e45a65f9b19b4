"""Ulysses sequence parallelism: one packed batch split along its tokens over a sequence group.

A long sequence's activations (hidden states, attention inputs, MLP intermediates) grow
with its token count; FSDP shards parameters, not activations. With
``ulysses_sequence_parallel_size = sp`` the ranks form a ``(data, sequence)`` device mesh of
``world / sp`` data-parallel groups of ``sp`` ranks each (``rank = data_rank * sp +
sequence_rank``). The ranks of one sequence group hold the same micro-batch and each
computes ``1 / sp`` of its token columns:

- **Token split** (:func:`shard_tokens`): a ``(bins, width)`` batch (packed bins or padded
  rows) is padded to a width divisible by ``sp``; sequence rank ``r`` keeps columns
  ``[r * w, (r + 1) * w)`` of every bin (``w = width / sp``), with their position ids, so the
  embeddings, rotary positions, norms, MLPs and heads run on ``w`` columns only.
- **Attention** (:func:`ulysses_attention`): before attention an all-to-all trades the token
  split for a head split (each rank then holds every token of ``heads / sp`` query heads and
  their key/value heads; key/value heads are repeated when there are fewer of them than
  ``sp``), attention runs over the whole batch with its block plan
  (:mod:`verl.kernels.block_attention`: each token attends exactly the keys its sequence
  allows), and a second all-to-all trades back. The model reaches it through transformers'
  attention registry (:func:`install`) when its forward is given ``verl_ulysses=...``; any
  other forward (generation) runs the model's own attention, unchanged.
- **Gather** (:meth:`TokenShard.gather`): the per-token outputs the loss reads (log-probs,
  entropies, values) of all sequence ranks are all-gathered, in the batch's order, so every
  rank of the group computes the same loss on the whole micro-batch. Its backward hands
  each rank ``sp`` times its own rows' gradient: the ``sp`` partial parameter gradients of
  a group sum to the gradient of the group's loss, and FSDP averages over all ``dp x sp``
  ranks, so the reduced gradient is the mean over data-parallel groups, exactly the
  gradient of one process over the same data.

The data side: every rank of a sequence group must compute on the same rows. The worker
group dispatches a batch in ``world`` chunks as always; :func:`gather_in_group` lets a
worker join its group's chunks (in sequence-rank order, so the group holds one contiguous
slice of the batch) and return its own rows' outputs.

:func:`apply_ulysses` (called by the fsdp2 engine, ``verl.engine.fsdp``) is the one place
that applies it: it checks the model, installs the attention entry and tags the module;
:func:`sequence_parallel_of` reads the tag back (``verl.kernels.torch_functional`` and the
critic's value pass do).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from verl.kernels.block_attention import (
    BlockAttentionPlan,
    block_attention,
    plan_block_attention,
    refuse_unsupported_kwargs,
)

logger = logging.getLogger(__name__)

__all__ = [
    "SP_KWARG",
    "SequenceParallel",
    "TokenShard",
    "apply_ulysses",
    "build_sequence_parallel",
    "check_heads",
    "gather_in_group",
    "install",
    "padded_blocks",
    "sequence_parallel_of",
    "shard_tokens",
    "ulysses_attention",
]

SP_KWARG = "verl_ulysses"
_TAG = "_verl_sequence_parallel"
# transformers passes a 4D mask through untouched; all-False so that a layer which ignored
# the Ulysses context would attend nowhere (NaN) rather than to its local tokens only
_NO_MASK_PLACEHOLDER = torch.zeros(1, 1, 1, 1, dtype=torch.bool)
# Model types whose decoder layers are plain (full causal) self-attention over the token
# dimension with ``config.num_attention_heads`` / ``num_key_value_heads`` heads.
SUPPORTED_MODEL_TYPES = frozenset(
    {"llama", "qwen2", "qwen3", "mistral", "qwen2_moe", "qwen3_moe", "smollm3"}
)


@dataclass(frozen=True)
class SequenceParallel:
    """This rank's place in the ``(data, sequence)`` mesh.

    ``group``: the ``size`` ranks that split one micro-batch's tokens (``rank`` is this
    rank's index in it); ``dp_size`` / ``dp_rank``: the data-parallel groups.
    """

    mesh: Any
    group: Any
    size: int
    rank: int
    dp_size: int
    dp_rank: int


def build_sequence_parallel(device_type: str, size: int) -> SequenceParallel:
    """The ``(data, sequence)`` mesh over the default process group with ``size`` ranks per
    sequence group. Collective: every rank calls it (once per engine)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if size < 1 or world % size:
        raise ValueError(
            f"ulysses_sequence_parallel_size={size} must divide the role's {world} ranks; "
            f"use a divisor of {world}"
        )
    mesh = init_device_mesh(device_type, (world // size, size), mesh_dim_names=("data", "sequence"))
    return SequenceParallel(
        mesh=mesh,
        group=mesh.get_group("sequence"),
        size=size,
        rank=mesh.get_local_rank("sequence"),
        dp_size=world // size,
        dp_rank=mesh.get_local_rank("data"),
    )


def check_heads(config: Any, size: int, where: str = "ulysses_sequence_parallel_size") -> None:
    """Raise ``ValueError`` unless a model with ``config`` splits its attention heads over
    ``size`` sequence ranks: the query heads divide evenly, and the key/value heads either
    divide evenly or divide ``size`` (they are then repeated)."""
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    if not heads:
        raise ValueError(f"{where}={size}: the model config has no num_attention_heads")
    if heads % size:
        raise ValueError(
            f"{where}={size}: the model's {heads} attention heads do not split over {size} "
            f"sequence ranks; use a divisor of {heads}"
        )
    if kv % size and size % kv:
        raise ValueError(
            f"{where}={size}: the model's {kv} key/value heads neither split over {size} "
            f"sequence ranks nor repeat evenly to {size}; use a divisor or a multiple of {kv} "
            f"that divides {heads}"
        )


def _check_model(config: Any, size: int) -> None:
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise NotImplementedError(
            f"ulysses_sequence_parallel_size={size}: model_type={model_type!r} is not supported "
            f"(supported: {sorted(SUPPORTED_MODEL_TYPES)}); set it to 1"
        )
    if getattr(config, "sliding_window", None) is not None and getattr(
        config, "use_sliding_window", True
    ):
        raise NotImplementedError(
            f"ulysses_sequence_parallel_size={size}: the model uses sliding-window attention, "
            "which the sequence-parallel attention does not implement; set it to 1"
        )
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
        raise NotImplementedError(
            f"ulysses_sequence_parallel_size={size}: the model has layers other than full "
            f"attention ({sorted(set(config.layer_types))}); set it to 1"
        )
    check_heads(config, size)
    impl = getattr(config, "_attn_implementation", None)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if impl not in ALL_ATTENTION_FUNCTIONS:
        raise NotImplementedError(
            f"ulysses_sequence_parallel_size={size}: attn_implementation={impl!r} is not in "
            "transformers' attention registry, so the sequence-parallel attention cannot take "
            "its place; load the model with sdpa (the default) or flash attention"
        )


def apply_ulysses(module: nn.Module, sp: SequenceParallel) -> None:
    """Prepare ``module`` (a causal LM of a supported type, a peft model over one, or a
    ``CausalLMWithValueHead``) for sequence-parallel forwards on ``sp``: check that its
    attention splits (:func:`check_heads`; ``NotImplementedError`` for an unsupported
    model), register the sequence-parallel attention entry for its attention
    implementation and tag it for :func:`sequence_parallel_of`."""
    targets = [module]
    get_base = getattr(module, "get_base_model", None)
    if callable(get_base):
        targets.append(get_base())
    config = getattr(targets[-1], "config", None)
    _check_model(config, sp.size)
    install(config._attn_implementation)
    for target in targets:
        setattr(target, _TAG, sp)
    logger.info(
        "ulysses: %d sequence ranks x %d data-parallel groups (this rank: sequence %d, data %d)",
        sp.size,
        sp.dp_size,
        sp.rank,
        sp.dp_rank,
    )


def sequence_parallel_of(module: nn.Module) -> SequenceParallel | None:
    """The :class:`SequenceParallel` :func:`apply_ulysses` tagged ``module`` with (or its
    peft base model), or None."""
    sp = getattr(module, _TAG, None)
    if sp is None:
        get_base = getattr(module, "get_base_model", None)
        if callable(get_base):
            sp = getattr(get_base(), _TAG, None)
    return sp


# ---- collectives -------------------------------------------------------------------------


class _AllToAll(torch.autograd.Function):
    """``x (size, ...)``: chunk ``j`` goes to rank ``j``; chunk ``j`` of the output came from
    rank ``j``. Its own inverse, so backward is the same exchange of the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def _tokens_to_heads(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """``(bins, heads, w, d)`` (this rank's tokens, all heads) -> ``(bins, heads / sp, sp * w,
    d)`` (every token, this rank's heads)."""
    b, h, w, d = x.shape
    send = x.reshape(b, sp.size, h // sp.size, w, d).transpose(0, 1)
    recv = _AllToAll.apply(send, sp.group)  # (sp, b, h / sp, w, d): chunk j = rank j's tokens
    return recv.permute(1, 2, 0, 3, 4).reshape(b, h // sp.size, sp.size * w, d)


def _heads_to_tokens(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """``(bins, width, heads / sp, d)`` (every token, this rank's heads; the attention output
    layout) -> ``(bins, width / sp, heads, d)`` (this rank's tokens, all heads)."""
    b, width, h, d = x.shape
    w = width // sp.size
    send = x.reshape(b, sp.size, w, h, d).transpose(0, 1)
    recv = _AllToAll.apply(send, sp.group)  # (sp, b, w, h, d): chunk j = rank j's heads
    return recv.permute(1, 2, 0, 3, 4).reshape(b, w, sp.size * h, d)


class _GatherTokens(torch.autograd.Function):
    """Per-token outputs of every rank of the group, in the batch's order (see
    :meth:`TokenShard.gather`)."""

    @staticmethod
    def forward(ctx, mine: torch.Tensor, shard: TokenShard) -> torch.Tensor:
        sp = shard.sp
        mine = mine.contiguous()
        parts = [torch.empty_like(mine) for _ in range(sp.size)]
        dist.all_gather(parts, mine, group=sp.group)
        rows = torch.cat([part[:count] for part, count in zip(parts, shard.counts)])
        out = rows.new_empty((shard.num_wanted, *mine.shape[1:]))
        out = out.index_copy(0, shard.order, rows)
        ctx.shard = shard
        ctx.rows = mine.shape[0]
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        shard = ctx.shard
        own = grad.index_select(0, shard.own_order) * shard.sp.size
        out = grad.new_zeros((ctx.rows, *grad.shape[1:]))
        out[: own.shape[0]] = own
        return out, None


def gather_in_group(obj: Any, sp: SequenceParallel) -> list[Any]:
    """``obj`` of every rank of this rank's sequence group, in sequence-rank order
    (``all_gather_object``: in memory, between the processes of one run)."""
    parts: list[Any] = [None] * sp.size
    dist.all_gather_object(parts, obj, group=sp.group)
    return parts


# ---- attention ------------------------------------------------------------------------------


@dataclass
class UlyssesContext:
    """What a sequence-parallel forward hands every attention layer (``verl_ulysses=``)."""

    sp: SequenceParallel
    plan: BlockAttentionPlan


def ulysses_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    ctx: UlyssesContext,
    scaling: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """Attention of this rank's tokens over the whole sequence-parallel batch.

    Args:
        query: ``(bins, heads, w, d)``; key / value ``(bins, kv_heads, w, d)`` for this
            rank's ``w`` token columns of every bin, as transformers' attention functions
            receive them (rotary positions applied).
        ctx: the group and the block plan of the whole ``(bins, sp * w)`` batch.

    Returns:
        ``(bins, w, heads, d)`` (transformers' attention output layout).
    """
    sp = ctx.sp
    kv_heads = key.shape[1]
    if kv_heads < sp.size:  # each rank needs the key/value head of its query heads
        key = key.repeat_interleave(sp.size // kv_heads, dim=1)
        value = value.repeat_interleave(sp.size // kv_heads, dim=1)
    q = _tokens_to_heads(query, sp)
    k = _tokens_to_heads(key, sp)
    v = _tokens_to_heads(value, sp)
    out = block_attention(q, k, v, ctx.plan, scaling=scaling, dropout=dropout)
    return _heads_to_tokens(out, sp)


_installed: set[str] = set()
_install_lock = threading.Lock()


def install(impl: str) -> None:
    """Wrap transformers' attention function ``impl`` (``"sdpa"``, ``"flash_attention_2"``
    ...) once per process: a forward given ``verl_ulysses=UlyssesContext(...)`` computes
    :func:`ulysses_attention`; any other runs the wrapped function unchanged."""
    with _install_lock:
        if impl in _installed:
            return
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

        original = ALL_ATTENTION_FUNCTIONS[impl]

        def ulysses_or_original(module, query, key, value, attention_mask, **kwargs):
            ctx = kwargs.pop(SP_KWARG, None)
            if ctx is None:
                return original(module, query, key, value, attention_mask, **kwargs)
            refuse_unsupported_kwargs("sequence-parallel attention", module, kwargs)
            out = ulysses_attention(
                query,
                key,
                value,
                ctx,
                scaling=kwargs.get("scaling"),
                dropout=kwargs.get("dropout", 0.0),
            )
            return out, None

        AttentionInterface.register(impl, ulysses_or_original)
        _installed.add(impl)


# ---- the token split --------------------------------------------------------------------------


def padded_blocks(attention_mask: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """The block-attention blocks of a padded ``(rows, width)`` batch: each row's real tokens
    (one contiguous run: prompts left-padded, responses right-padded) attend causally among
    themselves. Raises ``ValueError`` for a row with a hole in its mask."""
    mask = attention_mask.detach().bool().cpu()
    width = mask.shape[1]
    counts = mask.sum(-1)
    first = torch.where(counts > 0, mask.int().argmax(-1), torch.zeros_like(counts))
    last = width - 1 - mask.flip(-1).int().argmax(-1)
    span = torch.where(counts > 0, last - first + 1, torch.zeros_like(counts))
    holes = (span != counts).nonzero().flatten().tolist()
    if holes:
        raise ValueError(
            f"sequence parallelism: rows {holes[:8]} of the padded batch have padding between "
            "real tokens; each row's real tokens must be one contiguous run"
        )
    return [
        (i * width + f, n, 0, 0)
        for i, (f, n) in enumerate(zip(first.tolist(), counts.tolist()))
        if n > 0
    ]


@dataclass
class TokenShard:
    """This rank's part of one ``(bins, width)`` batch split along tokens (see
    :func:`shard_tokens`).

    ``input_ids`` / ``position_ids`` ``(bins, w)``: this rank's columns. The ``n`` wanted
    positions (the ones whose outputs the loss reads) are split by owner: this rank's
    ``counts[sp.rank]`` of them, in the wanted order, are rows ``[0, count)`` of
    :meth:`select`'s output (padded to ``max(counts)`` rows, so every rank runs the same
    number of head chunks), and :meth:`gather` puts every rank's rows back in the wanted
    order.
    """

    sp: SequenceParallel
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    plan: BlockAttentionPlan
    num_layers: int
    num_wanted: int
    counts: list[int]
    take: torch.Tensor  # (max(counts),) local flat positions (bins * w) of this rank's rows
    owned: torch.Tensor  # (n,) bool: the wanted positions this rank holds
    order: torch.Tensor  # (n,) wanted index of each gathered row (ranks' rows concatenated)
    own_order: torch.Tensor  # (counts[rank],) wanted index of this rank's rows

    @contextlib.contextmanager
    def forward_kwargs(self) -> Iterator[dict[str, Any]]:
        """Keyword arguments of the model forward on :attr:`input_ids`; on leaving, checks
        that every attention layer ran the sequence-parallel attention."""
        yield {
            "attention_mask": _NO_MASK_PLACEHOLDER,
            "position_ids": self.position_ids,
            SP_KWARG: UlyssesContext(self.sp, self.plan),
        }
        if self.plan.calls < self.num_layers:
            raise RuntimeError(
                f"sequence parallelism: {self.plan.calls} of {self.num_layers} attention layers "
                "ran the sequence-parallel attention; the model's attention does not go through "
                "transformers' attention registry (verl.kernels.ulysses.install)"
            )

    def select(self, outputs: torch.Tensor) -> torch.Tensor:
        """``outputs (bins, w, ...)`` of the forward -> this rank's wanted rows ``(max(counts),
        ...)`` (rows past ``counts[rank]`` are filler)."""
        flat = outputs.reshape(-1, *outputs.shape[2:])
        return flat.index_select(0, self.take)

    def select_wanted(self, values: torch.Tensor) -> torch.Tensor:
        """Per-wanted-position values ``(n, ...)`` (e.g. the labels) -> this rank's rows,
        padded like :meth:`select` with zeros."""
        own = values[self.owned]
        pad = self.take.shape[0] - own.shape[0]
        if pad:
            own = torch.cat([own, own.new_zeros((pad, *own.shape[1:]))])
        return own

    def gather(self, mine: torch.Tensor) -> torch.Tensor:
        """This rank's rows ``(max(counts), ...)`` -> every wanted position's ``(n, ...)``, on
        every rank of the group (differentiable; see the module docstring)."""
        return _GatherTokens.apply(mine, self)


def shard_tokens(
    sp: SequenceParallel,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    blocks: list[tuple[int, int, int, int]],
    wanted: torch.Tensor,
    num_layers: int,
    pad_token_id: int = 0,
) -> TokenShard:
    """Split a ``(bins, width)`` batch along its tokens for this rank of ``sp``.

    Args:
        input_ids / position_ids: ``(bins, width)``: packed bins or padded rows.
        blocks: its attention structure (``verl.kernels.block_attention.Block``, flat
            positions into ``bins * width``): the packer's blocks, or :func:`padded_blocks`.
        wanted: ``(n,)`` flat positions whose outputs the caller reads, in its order.
        num_layers: attention layers of the model (each must use the plan).
        pad_token_id: id of the columns added to make the width divisible by ``sp.size``.
    """
    bins, width = input_ids.shape
    w = -(-width // sp.size)
    padded = w * sp.size
    device = input_ids.device
    if padded != width:
        extra = padded - width
        input_ids = torch.cat([input_ids, input_ids.new_full((bins, extra), pad_token_id)], 1)
        position_ids = torch.cat([position_ids, position_ids.new_zeros((bins, extra))], 1)

    def remap(flat: int) -> int:
        return (flat // width) * padded + flat % width

    moved = [(remap(q), n, remap(p) if m else 0, m) for q, n, p, m in blocks]
    plan = plan_block_attention(moved, bins * padded, device)
    wanted = wanted.to(device)
    column = wanted % width
    owner = torch.div(column, w, rounding_mode="floor")
    local = torch.div(wanted, width, rounding_mode="floor") * w + column % w
    host_owner = owner.cpu()
    counts = torch.bincount(host_owner, minlength=sp.size).tolist()
    rows = max(1, max(counts))
    owned = owner == sp.rank
    take = local[owned]
    if take.shape[0] < rows:
        take = torch.cat([take, take.new_zeros(rows - take.shape[0])])
    index = torch.arange(wanted.shape[0], device=device)
    order = torch.cat([index[owner == r] for r in range(sp.size)])
    cols = slice(sp.rank * w, (sp.rank + 1) * w)
    return TokenShard(
        sp=sp,
        input_ids=input_ids[:, cols],
        position_ids=position_ids[:, cols],
        plan=plan,
        num_layers=num_layers,
        num_wanted=int(wanted.shape[0]),
        counts=counts,
        take=take,
        owned=owned,
        order=order,
        own_order=index[owned],
    )


def num_attention_layers(model: nn.Module) -> int:
    """Attention layers of a supported model (its ``config.num_hidden_layers``)."""
    return int(model.config.num_hidden_layers)
