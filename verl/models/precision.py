"""Precision names -> torch dtypes, and activation checkpointing for HF models."""

from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)

_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
}
_ALLOWED = (torch.float32, torch.bfloat16, torch.float16)


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """Map "fp32"/"float32"/"bf16"/"bfloat16"/"fp16"/"float16" (or a torch dtype) to a dtype.

    Also accepts "torch.bfloat16"-style strings; ``None`` passes through (keep the dtype).
    The one name -> dtype table of the package (the engines import it from here). Raises
    ValueError naming the accepted names.
    """
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype):
        if dtype not in _ALLOWED:
            raise ValueError(f"dtype={dtype} is not a training precision; use one of {_ALLOWED}")
        return dtype
    if not isinstance(dtype, str):
        raise TypeError(
            f"dtype must be a str or torch.dtype, got {type(dtype).__name__}: {dtype!r}"
        )
    key = dtype.strip().lower().removeprefix("torch.")
    if key not in _DTYPES:
        raise ValueError(
            f"unknown dtype {dtype!r}; use one of fp32/float32, bf16/bfloat16, fp16/float16"
        )
    return _DTYPES[key]


_ATTENTION_LOGGED: set[str] = set()


def attention_implementation(use_flash_attention: bool, device: str | torch.device) -> str | None:
    """The HF ``attn_implementation`` for ``use_flash_attention`` (``None`` = HF's default).

    ``True`` picks ``flash_attention_2`` when the ``flash_attn`` package is installed and the
    device is CUDA, else ``sdpa``; the choice is logged once per process.
    """
    if not use_flash_attention:
        return None
    import importlib.util

    on_cuda = torch.device(device).type == "cuda"
    if on_cuda and importlib.util.find_spec("flash_attn") is not None:
        impl, why = "flash_attention_2", "flash_attn is installed"
    else:
        impl = "sdpa"
        why = "flash attention needs CUDA" if not on_cuda else "flash_attn is not installed"
    if impl not in _ATTENTION_LOGGED:
        _ATTENTION_LOGGED.add(impl)
        logger.info("use_flash_attention=true: attention runs as %s (%s)", impl, why)
    return impl


def hf_checkpointing_enable(model: nn.Module, kwargs: dict | None) -> None:
    """Call a HF model's activation-checkpointing switch with `torch.utils.checkpoint` kwargs.

    transformers >= 5.2x names it `activation_checkpointing_enable` and deprecates
    `gradient_checkpointing_enable`; older 5.x releases only have the latter.
    """
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
        return
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if enable is None:
        raise TypeError(
            f"{type(model).__name__} has no activation_checkpointing_enable() or "
            "gradient_checkpointing_enable(); activation checkpointing here supports HF "
            "PreTrainedModel instances and CausalLMWithValueHead"
        )
    enable(gradient_checkpointing_kwargs=kwargs)


def enable_activation_checkpointing(model: nn.Module) -> nn.Module:
    """Turn on non-reentrant activation checkpointing of a HF model in place; return it.

    Non-reentrant checkpointing works with FSDP2 and with inputs that do not require grad.
    Checkpointing acts only in train mode (HF then drops the KV cache itself), so the same
    module still generates with a cache in eval mode. Raises TypeError for a module without
    HF checkpointing support.
    """
    if not getattr(model, "supports_gradient_checkpointing", True):
        raise TypeError(f"{type(model).__name__} does not support activation checkpointing")
    hf_checkpointing_enable(model, {"use_reentrant": False})
    logger.info("enabled activation checkpointing on %s", type(model).__name__)
    return model


def is_activation_checkpointing(model: nn.Module) -> bool:
    """True if any submodule of `model` has HF activation checkpointing switched on."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


# Activation memory a decoder layer keeps for backward without checkpointing, in bytes per
# token and per unit of hidden size. Measured on SmolLM2-135M (30 layers, hidden 576, one
# forward + backward of 612 packed tokens): checkpointing lowered the peak by
# 690 MiB under bf16 autocast and 530-650 MiB in fp32, 55-66 bytes per token x layer x hidden.
ACTIVATION_BYTES_PER_TOKEN_LAYER_HIDDEN = 64
# ``enable_gradient_checkpointing: null`` turns checkpointing on above this estimate (the
# config's help text, verl.config.schema_roles.CHECKPOINTING_HELP, states it too). Below it
# the memory saved is small next to what any training process holds (~330 MiB for
# torch + transformers alone); above it the saving is large. The cost is one more forward
# per micro-batch: +18-24% of the update on SmolLM2 in 1024-token micro-batches, +36% in
# the main job's small ones (~300 packed tokens), measured in docs/memory.md.
AUTO_CHECKPOINTING_MIN_BYTES = 512 * 2**20


def estimated_activation_bytes(model: nn.Module, tokens: int) -> int | None:
    """Activation bytes a micro-batch of ``tokens`` tokens keeps for backward in ``model``
    without checkpointing (``ACTIVATION_BYTES_PER_TOKEN_LAYER_HIDDEN``), or ``None`` when the
    model's config names no layer count and hidden size."""
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", None)
    hidden = getattr(config, "hidden_size", None)
    if not isinstance(layers, int) or not isinstance(hidden, int):
        return None
    return tokens * layers * hidden * ACTIVATION_BYTES_PER_TOKEN_LAYER_HIDDEN


def resolve_activation_checkpointing(
    setting: bool | None, model: nn.Module, tokens_per_micro_batch: int, key: str
) -> bool:
    """Whether to checkpoint ``model``'s activations: ``setting`` when it is a bool, else
    (null, the default) whether a micro-batch's activations are estimated above
    ``AUTO_CHECKPOINTING_MIN_BYTES`` (:func:`estimated_activation_bytes`). The automatic
    choice is logged with its numbers under the config key ``key``."""
    if setting is not None:
        return bool(setting)
    estimate = estimated_activation_bytes(model, tokens_per_micro_batch)
    if estimate is None:
        logger.info("%s=null: off (the model config names no num_hidden_layers/hidden_size)", key)
        return False
    on = estimate > AUTO_CHECKPOINTING_MIN_BYTES
    logger.info(
        "%s=null: %s (a micro-batch of up to %d tokens keeps ~%d MiB of activations for "
        "backward; checkpointing turns on above %d MiB)",
        key,
        "on" if on else "off",
        tokens_per_micro_batch,
        estimate >> 20,
        AUTO_CHECKPOINTING_MIN_BYTES >> 20,
    )
    return on


def checkpoint_if_configured(
    model: nn.Module, setting: bool | None, tokens_per_micro_batch: int, key: str
) -> bool:
    """Turn on activation checkpointing of ``model`` in place when
    :func:`resolve_activation_checkpointing` says so; return whether it is on."""
    on = resolve_activation_checkpointing(setting, model, tokens_per_micro_batch, key)
    if on:
        enable_activation_checkpointing(model)
    return on
