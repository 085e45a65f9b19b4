"""A Hugging Face model's forward pass on a packed batch (:mod:`verl.kernels.packing`).

Contract: :func:`pack_batch` packs a padded ``(rows, P + R)`` batch for a model (sharing a
group's prompt when asked and the attention takes a custom 4D mask, else plainly; width
rounded up to :func:`shape_multiple`); :func:`packed_forward` gives the keyword arguments
of a forward on it (position ids plus a block-attention plan or the packed attention
mask) and checks, on leaving, that every attention layer used the plan;
:func:`packed_response_hidden` returns the base model's hidden states that predict the
valid response tokens; :func:`sequence_parallel_inputs` splits such a batch along its
tokens for one Ulysses rank. :func:`supports_packing` / :func:`block_attention_layers`
say which models these apply to (the plain-head model types, ``sdpa`` attention without
a sliding window for block attention). Results equal the padded pass's.
"""

from __future__ import annotations

import contextlib
import logging

import torch
from torch import nn

from verl.kernels import block_attention
from verl.kernels.packing import PackedBatch, pack_sequences
from verl.kernels.prefix_packing import pack_shared_prefix, prompt_groups

logger = logging.getLogger(__name__)

__all__ = [
    "CPU_REDUCED_PRECISION_SHAPE_MULTIPLE",
    "PLAIN_HEAD_MODEL_TYPES",
    "block_attention_layers",
    "has_plain_head",
    "pack_batch",
    "packed_attention_mask",
    "packed_forward",
    "packed_response_hidden",
    "sequence_parallel_inputs",
    "shape_multiple",
    "supports_packing",
]

# oneDNN, which runs torch's bf16/fp16 matmuls on a CPU, builds kernels for every new
# (M, N, K) it sees and keeps them: ~1.7 MiB of heap per new shape of a linear's forward
# and backward that no malloc_trim returns (torch 2.13, measured in docs/memory.md). A
# packed pass has a data-dependent width, so a bf16 run grew ~30 MiB per step on W2 and
# never stopped. Rounding the packed width and the LM head's last chunk up to a multiple of
# this bounds the shapes a run ever sees, at the cost of a few filler columns.
CPU_REDUCED_PRECISION_SHAPE_MULTIPLE = 64

# Model types whose causal-LM head is exactly ``lm_head(model(...).last_hidden_state)``.
# Others (Gemma soft-capping, Cohere logit_scale, Granite logits_scaling, ...) post-process
# the logits, so they take the generic ``model(..., logits_to_keep=...)`` path.
PLAIN_HEAD_MODEL_TYPES = frozenset(
    {"llama", "qwen2", "qwen3", "mistral", "qwen2_moe", "qwen3_moe", "smollm3"}
)


def shape_multiple(model: nn.Module) -> int:
    """Multiple to round the token dimension of ``model``'s passes up to: 1 (any shape)
    except on a CPU in bf16/fp16 (autocast on, or reduced-precision weights), where every
    new matmul shape costs memory that stays (``CPU_REDUCED_PRECISION_SHAPE_MULTIPLE``)."""
    param = next(model.parameters(), None)
    if param is None or param.device.type != "cpu":
        return 1
    reduced = (torch.bfloat16, torch.float16)
    autocast = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") in reduced
    return CPU_REDUCED_PRECISION_SHAPE_MULTIPLE if autocast or param.dtype in reduced else 1


# attention implementations that take a custom 4D mask as is (transformers passes a 4D
# ``attention_mask`` through ``masking_utils`` untouched): sdpa wants a boolean mask (True =
# attend; autocast would cast a float one), eager adds it to the scores, so it wants 0 / -inf
_MASK_KINDS = {"sdpa": "bool", "eager": "additive"}
_fallback_logged: set[str] = set()
_NO_MASK_PLACEHOLDER = torch.zeros(1, 1, 1, 1, dtype=torch.bool)


def pack_batch(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    share_prefix: bool,
) -> PackedBatch:
    """``input_ids``/``attention_mask`` ``(rows, P + R)`` packed for ``model`` (a HF base or
    causal-LM model): shared-prompt packing (:func:`verl.kernels.prefix_packing.pack_shared_prefix`)
    when ``share_prefix`` is asked for, two rows share a prompt and the model's attention
    takes a custom 4D mask; else plain packing (:func:`verl.kernels.packing.pack_sequences`).
    Feed the model ``packed_attention_mask(model, packed.attention_mask)``. The width is
    rounded up to :func:`shape_multiple` of ``model``."""
    width_multiple = shape_multiple(model)
    groups = prompt_groups(input_ids, attention_mask, response_len) if share_prefix else []
    if not any(len(g) > 1 for g in groups):
        return pack_sequences(
            input_ids, attention_mask, response_len, width_multiple=width_multiple
        )
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in _MASK_KINDS:
        if impl not in _fallback_logged:
            _fallback_logged.add(impl)
            logger.warning(
                "share_prompt_prefix: attn_implementation=%r takes no custom 4D attention "
                "mask; packing without sharing prompts (each row computes its prompt)",
                impl,
            )
        return pack_sequences(
            input_ids, attention_mask, response_len, width_multiple=width_multiple
        )
    return pack_shared_prefix(
        input_ids, attention_mask, response_len, groups=groups, width_multiple=width_multiple
    )


def has_plain_head(model: nn.Module) -> bool:
    """Whether ``model`` is a causal LM whose logits are exactly
    ``lm_head(model.model(...).last_hidden_state)`` (a plain-head model type with both parts)."""
    config = getattr(model, "config", None)
    return (
        getattr(config, "model_type", None) in PLAIN_HEAD_MODEL_TYPES
        and isinstance(getattr(model, "model", None), nn.Module)
        and isinstance(getattr(model, "lm_head", None), nn.Module)
    )


def supports_packing(model: nn.Module) -> bool:
    """Whether ``model`` (a HF base or causal-LM model) derives a block-diagonal mask from
    restarting position ids (the model types of the plain-head path)."""
    return getattr(getattr(model, "config", None), "model_type", None) in PLAIN_HEAD_MODEL_TYPES


def packed_response_hidden(
    base_model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    share_prefix: bool = False,
) -> tuple[torch.Tensor, PackedBatch]:
    """The base transformer's hidden states that predict the valid response tokens, computed
    on the batch packed (shared-prompt packed with ``share_prefix``).

    Args:
        base_model: the HF base model (``model.model`` of a causal LM or value model).
        input_ids / attention_mask: ``(rows, P + R)`` padded batch.
        response_len: ``R``.

    Returns:
        ``(hidden (n, H), packed)``: ``n`` = valid response tokens in row-major order, as
        ``packed.response_mask (rows, R)`` places them (``packed.labels`` are their ids).
    """
    packed = pack_batch(base_model, input_ids, attention_mask, response_len, share_prefix)
    with packed_forward(base_model, packed) as kwargs:
        out = base_model(input_ids=packed.input_ids, use_cache=False, **kwargs)
    flat = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])
    return flat[packed.response_index], packed


def sequence_parallel_inputs(
    model: nn.Module,
    sp,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
    pack: bool,
    share_prefix: bool,
):
    """A ``(rows, P + R)`` batch split along its tokens for this rank of ``sp``
    (:func:`verl.kernels.ulysses.shard_tokens`), packed (shared-prompt packed with
    ``share_prefix``) or padded, with the wanted positions those that predict the response
    tokens.

    Args:
        model: the causal LM or value model (its ``config`` and body ``model.model``).

    Returns:
        ``(shard, labels (n,), place)``: ``place(values (n,))`` puts per-wanted-position
        values into the ``(rows, R)`` layout (padded response positions 0 when packed).
    """
    from verl.kernels.ulysses import num_attention_layers, padded_blocks, shard_tokens

    if not supports_packing(model):
        raise NotImplementedError(
            f"sequence parallelism: model_type="
            f"{getattr(getattr(model, 'config', None), 'model_type', None)!r} has no plain "
            "head path; set ulysses_sequence_parallel_size=1"
        )
    layers = num_attention_layers(model)
    rows, seq_len = input_ids.shape
    if pack:
        packed = pack_batch(model.model, input_ids, attention_mask, response_len, share_prefix)
        shard = shard_tokens(
            sp, packed.input_ids, packed.position_ids, packed.blocks, packed.response_index, layers
        )
        mask = packed.response_mask

        def place(values: torch.Tensor) -> torch.Tensor:
            return values.new_zeros(mask.shape).masked_scatter(mask, values)

        return shard, packed.labels, place
    columns = torch.arange(seq_len - response_len - 1, seq_len - 1, device=input_ids.device)
    wanted = (torch.arange(rows, device=input_ids.device)[:, None] * seq_len + columns).reshape(-1)
    shard = shard_tokens(sp, input_ids, position_ids, padded_blocks(attention_mask), wanted, layers)
    labels = input_ids[:, -response_len:].reshape(-1)
    return shard, labels, lambda values: values.view(rows, response_len)


def block_attention_layers(model: nn.Module) -> int:
    """Attention layers of ``model`` (a HF base or causal-LM model) that would compute a
    packed batch block by block (:mod:`verl.kernels.block_attention`), or 0 when its attention
    cannot: not transformers' ``sdpa``, a model type outside the plain-head set, or a
    sliding window."""
    if not supports_packing(model):
        return 0
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return 0
    if getattr(config, "sliding_window", None) is not None and getattr(
        config, "use_sliding_window", True
    ):
        return 0
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return 0
    return int(config.num_hidden_layers)


@contextlib.contextmanager
def packed_forward(model: nn.Module, packed: PackedBatch):
    """The keyword arguments of a forward of ``model`` (a HF base model, or a module that
    passes them on to one) on ``packed``: ``position_ids`` and either a block-attention plan
    (each sequence attends its own keys only; used when the packer recorded its blocks, the
    model's attention is ``sdpa`` and the plan computes fewer query-key pairs than the bins'
    full masks) or the packed attention mask. On leaving, checks that every attention layer
    used the plan."""
    layers = block_attention_layers(model) if packed.blocks is not None else 0
    bins, width = packed.input_ids.shape
    plan = None
    if layers:
        plan = block_attention.plan_block_attention(
            packed.blocks, bins * width, packed.input_ids.device
        )
        if plan.pairs >= bins * width * width:
            plan = None
    if plan is None:
        # attention_mask None: block-diagonal causal mask from the restarting positions
        yield {
            "attention_mask": packed_attention_mask(model, packed.attention_mask),
            "position_ids": packed.position_ids,
        }
        return
    block_attention.install()
    yield {
        # transformers passes a 4D mask through untouched; all-False so that a layer which
        # ignored the plan would attend nowhere (NaN) rather than across sequences
        "attention_mask": _NO_MASK_PLACEHOLDER,
        "position_ids": packed.position_ids,
        block_attention.PLAN_KWARG: plan,
    }
    plan.check_used(layers)


def packed_attention_mask(model: nn.Module, allowed: torch.Tensor | None) -> torch.Tensor | None:
    """``allowed (bins, q, k)`` (a packed batch's boolean mask, or None) as the 4D
    ``attention_mask`` the model's attention implementation takes (None stays None)."""
    if allowed is None:
        return None
    allowed = allowed[:, None]
    if _MASK_KINDS[model.config._attn_implementation] == "bool":
        return allowed
    dtype = next(model.parameters()).dtype
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min
    )
