"""Load tokenizers and causal LMs from local directories only (never from a model hub).

A model path is either a local HF directory (config.json + *.safetensors / *.bin, or a
directory holding one *.gguf file) or the name of the embedded model, `"smollm2-135m-instruct"`
(alias `"embedded:smollm2"`), which resolves to its converted cache directory
(see `verl/models/embedded.py`). Problems are reported before transformers is called, with
the path and what was expected.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from verl.models.embedded import EMBEDDED_MODEL_NAME, embedded_model_dir, is_embedded_alias
from verl.models.precision import resolve_dtype

logger = logging.getLogger(__name__)

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.gguf")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def set_hub_offline() -> None:
    """Set HF_HUB_OFFLINE=1 unless the user set it: verl never downloads models."""
    # Belt and braces next to local_files_only=True: also covers code paths (and child
    # processes started later) that consult the environment instead of the argument.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def resolve_model_path(path: str | os.PathLike) -> Path:
    """Turn a model path value into an existing local directory.

    The embedded-model names resolve to the converted SmolLM2 cache (converting on first use).
    Raises FileNotFoundError for a missing path, NotADirectoryError for a file.
    """
    if is_embedded_alias(path):
        return embedded_model_dir()
    raw = os.fspath(path)
    p = Path(raw).expanduser()
    if not p.exists():
        raise FileNotFoundError(
            f"model path '{raw}' does not exist; pass a local HF model directory or "
            f"'{EMBEDDED_MODEL_NAME}' for the embedded SmolLM2-135M-Instruct "
            "(models are never downloaded from a hub)"
        )
    if not p.is_dir():
        hint = f"; pass its directory '{p.parent}'" if p.suffix == ".gguf" else ""
        raise NotADirectoryError(
            f"model path '{raw}' is a file, not a model directory (expected a directory with "
            f"config.json and weights){hint}"
        )
    return p.resolve()


def _gguf_file(path: Path) -> str | None:
    """The single .gguf to load when the directory has no HF weights, else None."""
    if any(path.glob("*.safetensors")) or any(path.glob("*.bin")):
        return None
    ggufs = sorted(p.name for p in path.glob("*.gguf"))
    if len(ggufs) > 1:
        raise ValueError(
            f"model directory '{path}' holds several GGUF files {ggufs}; keep only one, or "
            "convert the one you want to safetensors"
        )
    return ggufs[0] if ggufs else None


def check_model_dir(path: Path) -> str | None:
    """Check that a directory holds loadable weights; return the GGUF file name to pass as
    `gguf_file` when the weights are a single GGUF, else None."""
    if not any(any(path.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise FileNotFoundError(
            f"model directory '{path}' has no weights: expected *.safetensors, "
            "pytorch_model*.bin or a single *.gguf file"
        )
    gguf = _gguf_file(path)
    if gguf is None and not (path / "config.json").is_file():
        raise FileNotFoundError(f"model directory '{path}' has weights but no config.json")
    _check_safetensors_headers(path)
    return gguf


def _check_safetensors_headers(path: Path) -> None:
    """Open every ``*.safetensors`` of ``path`` (reads its header only): a truncated or
    damaged file is a ``ValueError`` naming it rather than the reader's error later."""
    from safetensors import SafetensorError, safe_open

    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except (SafetensorError, OSError) as err:
            raise ValueError(
                f"model weights '{file}' are not a readable safetensors file (truncated or "
                f"damaged? {err}); copy or download the model again"
            ) from err


def config_with_overrides(
    model_dir: Path,
    overrides: Mapping[str, Any] | None,
    *,
    gguf: str | None = None,
    trust_remote_code: bool = False,
    what: str = "model.override_config",
) -> PretrainedConfig | None:
    """The HF config of ``model_dir`` with ``overrides`` set on it, or None without overrides.

    Only keys the config already has may be overridden (``attention_dropout``,
    ``rope_theta``, ...): a key it lacks raises ``ValueError`` naming ``what``, the key and
    the closest existing names, instead of being passed on to the model's constructor.
    """
    if not overrides:
        return None
    from transformers import AutoConfig

    kwargs = {"gguf_file": gguf} if gguf else {}
    config = AutoConfig.from_pretrained(
        model_dir, trust_remote_code=trust_remote_code, local_files_only=True, **kwargs
    )
    known = set(config.to_dict())
    unknown = [key for key in overrides if key not in known and not hasattr(config, key)]
    if unknown:
        hints = {key: difflib.get_close_matches(key, sorted(known), n=3) for key in unknown}
        detail = "; ".join(
            f"{key!r}" + (f" (did you mean {', '.join(hints[key])}?)" if hints[key] else "")
            for key in unknown
        )
        raise ValueError(
            f"{what}: {detail} not a field of {type(config).__name__} of '{model_dir}'"
        )
    for key, value in overrides.items():
        setattr(config, key, value)
    logger.info("%s applied to %s: %s", what, model_dir, dict(overrides))
    return config


def load_tokenizer(
    path: str | os.PathLike, trust_remote_code: bool = False
) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a local model directory (or the embedded model).

    If the tokenizer has no pad token, the eos token is used as pad (logged). `padding_side`
    is left as saved: callers set it (left for prompts, right for training).
    """
    from transformers import AutoTokenizer

    set_hub_offline()
    model_dir = resolve_model_path(path)
    kwargs = {}
    if not any((model_dir / name).is_file() for name in TOKENIZER_FILES):
        gguf = _gguf_file(model_dir)
        if gguf is None:
            raise FileNotFoundError(
                f"model directory '{model_dir}' has no tokenizer: expected one of "
                f"{', '.join(TOKENIZER_FILES)} or a *.gguf file"
            )
        kwargs["gguf_file"] = gguf
    tokenizer = AutoTokenizer.from_pretrained(
        model_dir, trust_remote_code=trust_remote_code, local_files_only=True, **kwargs
    )
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            logger.warning("tokenizer at %s has neither pad nor eos token", model_dir)
        else:
            tokenizer.pad_token = tokenizer.eos_token
            logger.info(
                "tokenizer at %s has no pad token; using eos %r as pad",
                model_dir,
                tokenizer.eos_token,
            )
    return tokenizer


def check_vocab_covers_tokenizer(module: torch.nn.Module, tokenizer: Any, role: str) -> None:
    """Raise if ``tokenizer`` can produce token ids that ``module`` has no embedding row for.

    A model with fewer embedding rows than its tokenizer has ids would otherwise fail at the
    first prompt holding such an id with a bare ``IndexError`` deep inside the embedding.
    More rows than ids is normal (vocabularies are padded to a multiple of 64 or 128).
    """
    if tokenizer is None or not hasattr(module, "get_input_embeddings"):
        return
    embedding = module.get_input_embeddings()
    rows = getattr(embedding, "num_embeddings", None)
    num_ids = len(tokenizer)
    if rows is not None and num_ids > rows:
        raise ValueError(
            f"{role}: the model has {rows} token embeddings but its tokenizer has {num_ids} "
            f"token ids (ids {rows}..{num_ids - 1} have no embedding): use the tokenizer the "
            "model was trained with (model.tokenizer_path), or resize the model's embeddings "
            "(model.resize_token_embeddings(len(tokenizer))) and save it before training"
        )


def load_causal_lm(
    path: str | os.PathLike,
    dtype: torch.dtype | str = torch.float32,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    override_config: Mapping[str, Any] | None = None,
) -> PreTrainedModel:
    """Load a causal LM (`AutoModelForCausalLM`) from a local directory, in eval mode.

    `dtype` is a torch dtype or a name accepted by `resolve_dtype` ("bf16", "fp32", ...).
    `attn_implementation` ("eager", "sdpa", ...) is passed through when given.
    `override_config` sets fields of the model's HF config (see `config_with_overrides`).
    """
    from transformers import AutoModelForCausalLM

    set_hub_offline()
    torch_dtype = resolve_dtype(dtype)
    model_dir = resolve_model_path(path)
    gguf = check_model_dir(model_dir)
    kwargs = {}
    if gguf is not None:
        kwargs["gguf_file"] = gguf
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    config = config_with_overrides(
        model_dir, override_config, gguf=gguf, trust_remote_code=trust_remote_code
    )
    if config is not None:
        kwargs["config"] = config
    model = AutoModelForCausalLM.from_pretrained(
        model_dir,
        dtype=torch_dtype,
        trust_remote_code=trust_remote_code,
        local_files_only=True,
        **kwargs,
    )
    if gguf is not None:
        # Dequantised on load; dropping the GGUF marker lets the model be saved as safetensors.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    logger.info(
        "loaded %s from %s (%.1f M params, %s)",
        type(model).__name__,
        model_dir,
        model.num_parameters() / 1e6,
        torch_dtype,
    )
    return model.eval()
