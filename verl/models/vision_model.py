"""Loading a vision-language model (Qwen2-VL family) as the actor.

``AutoModelForCausalLM`` does not map a Qwen2-VL config; the model (vision tower, merger,
language model and LM head) is ``AutoModelForImageTextToText``'s. :func:`is_vision_model_dir`
says whether a model directory holds such a model (its ``config.json`` ``model_type`` is
one of :data:`~verl.models.vision_processor.IMAGE_ONLY_MODEL_TYPES`);
:func:`load_vision_model` loads it as :func:`verl.models.loading.load_causal_lm` loads a
text model (same keywords, eval mode); :func:`load_actor_model` picks between the two.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import torch
from transformers import PreTrainedModel

from verl.models.loading import (
    check_model_dir,
    config_with_overrides,
    load_causal_lm,
    resolve_model_path,
    set_hub_offline,
)
from verl.models.precision import resolve_dtype
from verl.models.vision_processor import IMAGE_ONLY_MODEL_TYPES

logger = logging.getLogger(__name__)

__all__ = ["is_vision_model_dir", "load_actor_model", "load_vision_model"]


def is_vision_model_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` (a model directory or alias) holds a Qwen2-VL-family model."""
    try:
        model_dir = resolve_model_path(path)
    except (OSError, ValueError):
        return False
    config = os.path.join(model_dir, "config.json")
    if not os.path.isfile(config):
        return False
    with open(config, encoding="utf-8") as f:
        model_type = json.load(f).get("model_type")
    return model_type in IMAGE_ONLY_MODEL_TYPES


def load_vision_model(
    path: str | os.PathLike,
    dtype: torch.dtype | str = torch.float32,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    override_config: Mapping[str, Any] | None = None,
) -> PreTrainedModel:
    """Load a vision-language model (``AutoModelForImageTextToText``) from a local
    directory, in eval mode (keywords as ``load_causal_lm``)."""
    from transformers import AutoModelForImageTextToText

    set_hub_offline()
    torch_dtype = resolve_dtype(dtype)
    model_dir = resolve_model_path(path)
    check_model_dir(model_dir)
    kwargs: dict[str, Any] = {}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    config = config_with_overrides(model_dir, override_config, trust_remote_code=trust_remote_code)
    if config is not None:
        kwargs["config"] = config
    model = AutoModelForImageTextToText.from_pretrained(
        model_dir,
        dtype=torch_dtype,
        trust_remote_code=trust_remote_code,
        local_files_only=True,
        **kwargs,
    )
    logger.info(
        "loaded %s from %s (%.2f M params, %s)",
        type(model).__name__,
        model_dir,
        model.num_parameters() / 1e6,
        torch_dtype,
    )
    return model.eval()


def load_actor_model(path: str | os.PathLike, **kwargs: Any) -> PreTrainedModel:
    """:func:`load_vision_model` for a vision-language directory, else ``load_causal_lm``."""
    if is_vision_model_dir(path):
        return load_vision_model(path, **kwargs)
    return load_causal_lm(path, **kwargs)
