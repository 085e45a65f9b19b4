"""The native engine's forward for plain Llama / Qwen2 decoders on a CPU: under bf16
autocast, or in fp32 (no autocast, fp32 weights; opt-in, ``NativeRollout(lean_fp32=True)``).

A decode step of a small model on a CPU is a pass over its weights plus a few hundred small
ops. Through the HF modules each of those ops also pays for the module calls, keyword
plumbing, mask and cache bookkeeping around it: on SmolLM2-135M (30 layers, 1 row) the
linears over packed weights took about 60% of the step and the rest was mostly that
overhead (``bench/bench_decode_roofline.py``, method ``lean``). :class:`LeanForward` runs
the same computation as a loop over the layers on the model's own parameters:

- per layer three packed bf16 matmuls instead of seven: q/k/v fused into one weight and
  gate/up into one (:func:`verl.kernels.packed_linear.pack`), then ``o_proj`` and
  ``down_proj``; the tied LM head packed once; all packed at the start of every
  ``generate`` call from the weights as they are then (nothing kept across calls, see
  :mod:`verl.kernels.packed_linear`);
- the rotary embedding applied to the queries and keys of a layer in one pass;
- the engine's KV cache and 4-D mask: a prefill calls ``cache.update`` and the attention
  function the HF layer would call (transformers' ``"sdpa"`` entry); a decode step
  (:meth:`LeanForward._decode`) writes the cache's float32 buffers itself and computes
  :func:`verl.kernels.decode_attention.decode_attention`'s bf16 path op for op inline;
- RMSNorm, residuals and the MLP activation exactly as the HF modules compute them, in the
  same dtypes (fp32 residual stream of fp32 master weights, bf16 matmul outputs).

So it computes what the HF forward under :func:`~verl.kernels.packed_linear.packed_linears`
computes; a fused matmul may differ from three separate ones in the last bit of a bf16
output (``tests/rollout/test_lean_forward.py`` asserts greedy tokens identical and log-probs
within 2e-3; they were bit for bit on the tiny Qwen2 / Llama and on SmolLM2).

In fp32 (what precision ``auto`` runs on a CPU without bf16 instructions) the same loop
can compute in fp32. It is not the default there: it measured no faster than the HF
forward on the 2-core EPYC, where an fp32 step is the matmuls' pass over the weights and
the per-op overhead it removes is a few percent (docs/rollout.md, "Lean forward in fp32").
Its fused matmuls are ``F.linear`` over the q/k/v and gate/up weights concatenated (the
single ones read as they are) when a call decodes fewer than :data:`FP32_PACK_ROWS` rows,
else oneDNN's fp32 matmul over weights packed once per call (faster at many rows, but the
packing costs about a pass over the weights); the KV cache holds fp32 keys and values and
the inlined decode attention drops its bf16 roundings. Its results differ from the HF eager forward's in the last bits of fp32 (other matmul kernels,
attention as bmm instead of SDPA): greedy tokens identical, log-probs within 6.7e-6 on the
tiny models (``tests/rollout/test_lean_forward_fp32.py`` asserts 5e-5). With weights
arriving mid-call (:mod:`verl.rollout.partial`) the fp32 forward packs again after each
swap; the bf16 one is not used then.

:func:`unsupported` says why a module is not covered; the engine then runs the HF forward:
any other model class (or a subclass), a LoRA or other wrapper layer, a non-``sdpa``
attention, sliding-window or per-layer attention types, forward hooks, a ``forward``
patched on a module or its class, a weight that is not a plain CPU fp32 / bf16 tensor (fp32
only, in fp32). Prefill and decode both go through it (one packing per call); image prompts
take the HF path.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
from torch.nn.modules import module as nn_module

from verl.kernels import packed_linear
from verl.kernels.decode_attention import DECODE_KWARG
from verl.rollout.kv_cache import PreallocatedKVCache, SlotKVCache

logger = logging.getLogger(__name__)

__all__ = ["LeanForward", "for_call", "unsupported"]

# causal LM class -> the classes its submodules may have (besides Linear, Embedding,
# ModuleList and the MLP's activation)
_FAMILIES = {
    "LlamaForCausalLM": ("llama", "Llama"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2"),
}
_PARTS = ("Model", "DecoderLayer", "Attention", "MLP", "RMSNorm", "RotaryEmbedding")
_PLAIN = (torch.nn.Linear, torch.nn.Embedding, torch.nn.ModuleList)


def for_call(
    module: torch.nn.Module,
    device: torch.device,
    hint: int,
    lean: bool,
    mailbox: Any,
    fp32: bool = False,
) -> tuple[LeanForward | None, contextlib.AbstractContextManager]:
    """The forward of one native ``generate`` call over ``module`` (on ``device``, decode
    rows mostly ``hint``): ``(a LeanForward or None for the HF forward, a context to run
    the call in)``. ``lean``: the engine would take the lean forward (text prompts, sdpa,
    ``lean_forward=True``); ``mailbox``: weights may arrive mid-call
    (:mod:`verl.rollout.partial`).

    - under CPU bf16 autocast on a CPU with oneDNN bf16 (:func:`packed_linear.available`)
      and no mailbox: bf16 over packed weights, the lean forward when it covers the model,
      else the HF forward under :func:`~verl.kernels.packed_linear.packed_linears`;
    - with ``fp32``, outside autocast (:func:`packed_linear.fp32_available`) with fp32
      weights: the lean forward in fp32 when it covers the model, re-packing after each
      mid-call swap of ``mailbox``; the HF forward otherwise (fp32 weights are not packed
      for it);
    - anything else: the HF forward as it is."""
    none: tuple[None, contextlib.AbstractContextManager] = (None, contextlib.nullcontext())
    if packed_linear.available(device):
        if mailbox is not None:
            return none
        if lean and (why := unsupported(module)) is None:
            return LeanForward(module, hint), contextlib.nullcontext()
        if lean:
            logger.debug("native rollout: HF forward, the lean one does not cover %s", why)
        return None, packed_linear.packed_linears(module, hint)
    if not (lean and fp32 and packed_linear.fp32_available(device)):
        return none
    if (why := unsupported(module, torch.float32)) is not None:
        logger.debug("native rollout: HF forward, the fp32 lean one does not cover %s", why)
        return none
    return LeanForward(module, hint, mailbox), contextlib.nullcontext()


def unsupported(module: torch.nn.Module, dtype: torch.dtype | None = None) -> str | None:
    """Why :class:`LeanForward` does not cover ``module`` (None: it does); ``dtype``: the
    dtype every parameter must have (None: float32 or bf16, mixed; the bf16 autocast
    forward). Checked at every ``generate`` call (hooks or adapters may come and go between
    calls)."""
    cls = type(module)
    family = _FAMILIES.get(cls.__name__)
    if family is None or cls.__module__ != f"transformers.models.{family[0]}.modeling_{family[0]}":
        return f"model class {cls.__module__}.{cls.__name__}"
    config = module.config
    impl = getattr(config, "_attn_implementation", None)
    if impl != "sdpa":
        return f"attention implementation {impl!r} (needs 'sdpa')"
    types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if types != {"full_attention"}:
        return f"layer types {sorted(types)}"
    if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
        return "global module forward hooks"
    allowed = {cls.__name__, *(family[1] + part for part in _PARTS)}
    for name, sub in module.named_modules():
        if sub._forward_hooks or sub._forward_pre_hooks:
            return f"forward hooks on {name or 'the model'}"
        if "forward" in sub.__dict__:
            return f"a forward set on the instance {name or 'the model'}"
        if name.endswith(".act_fn") and not list(sub.parameters()):
            continue  # called as the HF MLP calls it
        kind = type(sub)
        if kind not in _PLAIN and (
            kind.__name__ not in allowed or not kind.__module__.startswith("transformers.models.")
        ):
            return f"module {name} of type {kind.__module__}.{kind.__name__}"
        if kind not in _PLAIN and getattr(kind.forward, "__module__", None) != kind.__module__:
            return f"{kind.__name__}.forward replaced by {kind.forward.__module__}"
        if getattr(sub, "sliding_window", None) is not None:
            return f"sliding window on {name}"
    for name, p in module.named_parameters():
        if type(p.data) is not torch.Tensor or p.device.type != "cpu":
            return f"parameter {name} is not a plain CPU tensor"
        if p.dtype not in ((torch.float32, torch.bfloat16) if dtype is None else (dtype,)):
            return f"parameter {name} is {p.dtype}"
    if len(module.model.layers) != config.num_hidden_layers:
        return f"{len(module.model.layers)} layers != num_hidden_layers"
    return None


def _bias(layers: list[torch.nn.Linear], dtype: torch.dtype) -> torch.Tensor | None:
    """The fused layers' biases in ``dtype`` (zeros for a layer without one), or None."""
    if all(layer.bias is None for layer in layers):
        return None
    parts = [
        layer.bias.detach()
        if layer.bias is not None
        else layer.weight.new_zeros(layer.out_features)
        for layer in layers
    ]
    return torch.cat([p.to(dtype) for p in parts])


def _rms_norm(norm: torch.nn.Module, x: torch.Tensor, out: torch.Tensor | None = None):
    """HF's Llama / Qwen2 RMSNorm, op for op; ``out``: a tensor in the matmuls' dtype to
    write the result to (for bf16 the rounding a bf16 matmul applies to its input, done in
    the same op)."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    if out is None:
        return norm.weight * h.to(dtype)
    return torch.mul(norm.weight, h.to(dtype), out=out)


def _decode_layers(
    cache: Any, mask: torch.Tensor, rows: int, round_to: torch.dtype | None
) -> list | None:
    """The cache layers :meth:`LeanForward._decode` writes itself (float32 buffers of values
    rounded to ``round_to``: bf16 under autocast, None in fp32; a decode step after the
    prefill), or None (``cache.update`` then)."""
    if mask.dtype != torch.bool or mask.shape[:3] != (rows, 1, 1):
        return None
    if type(cache) is PreallocatedKVCache and not cache.static:
        layer = cache.layers[0]
        if layer.length + 1 > layer.max_len or layer.rows != rows:
            return None  # overflow: cache.update raises it
        if mask.shape[3] != layer.length + 1:
            return None
    elif type(cache) is SlotKVCache and cache.columns is not None:
        layer = cache.layers[0]
        if cache.round_to is not round_to or mask.shape[3] != cache.width:
            return None
    else:
        return None
    if not layer.is_initialized or layer.keys.dtype != torch.float32:
        return None
    if getattr(layer, "round_to", round_to) is not round_to:
        return None
    return cache.layers


# decode rows from which the fp32 forward packs its weights for oneDNN (faster matmuls at
# many rows, a slower start); below, F.linear over the weights (docs/rollout.md, "Lean
# forward in fp32")
FP32_PACK_ROWS = 32


def _plain(weights: list[torch.Tensor]) -> torch.Tensor:
    """fp32 weights for ``F.linear``: one as it is (read live), several concatenated."""
    if len(weights) == 1:
        return weights[0].detach()
    return torch.cat([w.detach() for w in weights])


class _Layer:
    """One decoder layer's packed weights (in ``dtype``) and the modules it reads as is."""

    def __init__(self, layer: torch.nn.Module, pack: Any, dtype: torch.dtype) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
        self.attn, self.mlp = attn, mlp
        self.norm1, self.norm2 = layer.input_layernorm, layer.post_attention_layernorm
        self.qkv = pack([m.weight for m in qkv])
        self.qkv_bias = _bias(qkv, dtype)
        self.o = pack([attn.o_proj.weight])
        self.o_bias = _bias([attn.o_proj], dtype)
        self.gate_up = pack([mlp.gate_proj.weight, mlp.up_proj.weight])
        self.gate_up_bias = _bias([mlp.gate_proj, mlp.up_proj], dtype)
        self.down = pack([mlp.down_proj.weight])
        self.down_bias = _bias([mlp.down_proj], dtype)
        self.inter = mlp.gate_proj.out_features
        # transformers' SiLU module computes F.silu: called directly, without a module call
        kind = type(mlp.act_fn)
        plain_silu = kind is torch.nn.SiLU or (
            kind.__name__ == "SiLUActivation" and kind.__module__ == "transformers.activations"
        )
        self.act = torch.nn.functional.silu if plain_silu else mlp.act_fn
        self.scaling = attn.scaling


class LeanForward:
    """The forward of ``module`` (a model :func:`unsupported` accepts) over weights packed
    now; build one per ``generate`` call, inside ``torch.no_grad`` and either CPU bf16
    autocast (bf16 matmuls) or no autocast (fp32 weights, fp32 matmuls). ``batch_hint``: the
    rows the decode steps mostly have (oneDNN's layout choice). ``mailbox``: a
    :class:`~verl.rollout.partial.WeightMailbox` whose mid-call swaps (counted in its
    ``stats["swaps"]``) make the next forward pack the weights again."""

    def __init__(self, module: torch.nn.Module, batch_hint: int, mailbox: Any = None) -> None:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        config = module.config
        base = module.model
        self.module, self.hint, self.mailbox = module, batch_hint, mailbox
        self.embed, self.rotary, self.norm = base.embed_tokens, base.rotary_emb, base.norm
        # the matmuls' dtype and the cache's rounding (verl.kernels.decode_attention)
        autocast = torch.is_autocast_enabled("cpu")
        self.dtype = torch.get_autocast_dtype("cpu") if autocast else torch.float32
        self.round_to = self.dtype if autocast else None
        self.plain = not autocast and batch_hint < FP32_PACK_ROWS
        self._pack()
        attn = base.layers[0].self_attn
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = attn.head_dim
        self.attend = ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, None)

    def _pack(self) -> None:
        """Packs the module's weights as they are now."""
        module, hint, dtype = self.module, self.hint, self.dtype
        self.swaps = None if self.mailbox is None else self.mailbox.stats["swaps"]
        if self.plain:
            pack, self.linear = _plain, torch.nn.functional.linear
        else:
            pack = lambda weights: packed_linear.pack(weights, hint, dtype)  # noqa: E731
            self.linear = packed_linear.packed_linear
        self.layers = [_Layer(layer, pack, dtype) for layer in module.model.layers]
        self.head = pack([module.lm_head.weight])
        self.head_bias = _bias([module.lm_head], dtype)

    def _same_mode(self) -> bool:
        """Whether the autocast state is the one this forward was built for."""
        if self.round_to is None:
            return not torch.is_autocast_enabled("cpu")
        return torch.get_autocast_dtype("cpu") == self.dtype

    def __call__(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: Any,
        decode: bool,
    ) -> torch.Tensor:
        """The last position's logits (rows, vocab), in the matmuls' dtype, of ``input_ids``
        (rows, L) at ``position_ids`` (rows, L), attending with ``mask`` (the engine's 4-D
        mask) over ``cache`` (written here). ``decode``: one token per row (verl's decode
        attention)."""
        if self.mailbox is not None and self.mailbox.stats["swaps"] != self.swaps:
            self._pack()  # new weights were loaded into the module since the last forward
        rows, length = input_ids.shape
        if decode and length == 1 and self._same_mode():
            layers = _decode_layers(cache, mask, rows, self.round_to)
            if layers is not None:
                # no autocast op left in it (the attention's matmuls are fp32 on purpose)
                with torch.autocast("cpu", enabled=False):
                    return self._decode(input_ids, mask, position_ids, cache, layers)
        linear = self.linear
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        qk_width = (heads + kv_heads) * dim
        extra = {DECODE_KWARG: True} if decode else {}
        h = self.embed(input_ids)
        cos, sin = self.rotary(h, position_ids)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # over (rows, L, heads, dim)
        half = dim // 2
        for index, layer in enumerate(self.layers):
            qkv = linear(_rms_norm(layer.norm1, h), layer.qkv, layer.qkv_bias)
            qk = qkv[..., :qk_width].view(rows, length, heads + kv_heads, dim)
            rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
            qk = (qk * cos) + (rotated * sin)
            query = qk[:, :, :heads].transpose(1, 2)
            key = qk[:, :, heads:].transpose(1, 2)
            value = qkv[..., qk_width:].view(rows, length, kv_heads, dim).transpose(1, 2)
            key, value = cache.update(key, value, index)
            out, _ = self.attend(
                layer.attn,
                query,
                key,
                value,
                mask,
                dropout=0.0,
                scaling=layer.attn.scaling,
                **extra,
            )
            h = h + linear(out.reshape(rows, length, -1), layer.o, layer.o_bias)
            gate_up = linear(_rms_norm(layer.norm2, h), layer.gate_up, layer.gate_up_bias)
            act = layer.mlp.act_fn(gate_up[..., : layer.inter]) * gate_up[..., layer.inter :]
            h = h + linear(act, layer.down, layer.down_bias)
        last = _rms_norm(self.norm, h[:, -1])
        return linear(last, self.head, self.head_bias)

    def _decode(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: PreallocatedKVCache | SlotKVCache,
        cache_layers: list,
    ) -> torch.Tensor:
        """A decode step with the cache writes and verl's decode attention
        (:func:`verl.kernels.decode_attention.decode_attention`'s bf16 path; in fp32 the same
        ops without its roundings) inlined: the same values in fewer ops. The rotary embedding as ``q * cos + roll(q) * sin'`` with the
        first half of ``sin'`` negated (``rotate_half(q) * sin`` exactly), the key / value
        heads of all query heads at once (``bmm`` over (rows * kv_heads, group, dim)), the
        mask additive (0 / -inf) and built once for every layer."""
        # the roundings to bf16 are no-ops in fp32 (``.to`` / ``.float`` return the input)
        linear, low = self.linear, self.dtype
        rows = input_ids.shape[0]
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        group, half, qk_width = heads // kv_heads, dim // 2, (heads + kv_heads) * dim
        kv_rows, width = rows * kv_heads, mask.shape[-1]
        h = self.embed(input_ids)  # (rows, 1, hidden), a new tensor: updated in place
        cos, sin = self.rotary(h, position_ids)
        cos = cos.unsqueeze(2)
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).unsqueeze(2)
        additive = torch.zeros(mask.shape, dtype=torch.float32).masked_fill_(~mask, -torch.inf)
        additive = additive.expand(rows, kv_heads, group, width)
        slots = type(cache) is SlotKVCache
        if slots:
            row_index, columns = torch.arange(rows), cache.columns
        else:
            column = cache_layers[0].length
        normed = torch.empty(rows, 1, h.shape[-1], dtype=low)
        for layer, stored in zip(self.layers, cache_layers):
            qkv = linear(_rms_norm(layer.norm1, h, normed), layer.qkv, layer.qkv_bias)
            qk = qkv[..., :qk_width].view(rows, 1, heads + kv_heads, dim)
            qk = (qk * cos) + (torch.roll(qk, half, dims=-1) * sin)
            qk = qk.to(low)[:, 0]  # (rows, heads + kv_heads, dim), rounded as stored
            query = qk[:, :heads].float().reshape(kv_rows, group, dim)
            key, value = qk[:, heads:], qkv[:, 0, qk_width:].view(rows, kv_heads, dim)
            if slots:
                stored.keys[row_index, :, columns] = key.float()
                stored.values[row_index, :, columns] = value.float()
            else:
                stored.keys[:, :, column].copy_(key)
                stored.values[:, :, column].copy_(value)
                stored.length = column + 1
                stored.column.fill_(column + 1)
            keys = stored.keys[:, :, :width].reshape(kv_rows, width, dim)
            values = stored.values[:, :, :width].reshape(kv_rows, width, dim)
            scores = torch.bmm(query, keys.transpose(1, 2)).mul_(layer.scaling)
            scores.view(rows, kv_heads, group, width).add_(additive)
            probs = torch.softmax(scores, dim=-1).to(low).float()
            out = torch.bmm(probs, values).to(low).view(rows, 1, heads * dim)
            h.add_(linear(out, layer.o, layer.o_bias))
            gate_up = linear(_rms_norm(layer.norm2, h, normed), layer.gate_up, layer.gate_up_bias)
            act = layer.act(gate_up[..., : layer.inter]) * gate_up[..., layer.inter :]
            h.add_(linear(act, layer.down, layer.down_bias))
        return linear(_rms_norm(self.norm, h[:, 0], normed[:, 0]), self.head, self.head_bias)
