"""Whether a model's layers split over tensor-parallel ranks: one rule, torch-free.

The config check (before any process starts, from a local ``config.json``) and the engine
(when it applies the plan, from the loaded model's config) both ask
:func:`model_split_problem`, so a refusal reads the same wherever it is found.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["SPLIT_COUNTS", "SUPPORTED_MODEL_TYPES", "model_split_problem", "split_counts"]

# Model types whose decoder layers are (self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj)
# with heads reshaped by ``-1`` in forward, and whose logits are ``lm_head(hidden)``.
SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
# The counts of a model config that tensor parallelism splits, with their config keys.
SPLIT_COUNTS = (
    ("query heads", "num_attention_heads"),
    ("key/value heads", "num_key_value_heads"),
    ("intermediate size", "intermediate_size"),
    ("vocabulary", "vocab_size"),
)


def split_counts(config: Any) -> dict[str, Any]:
    """``model_type`` and the split counts of an HF config object, as a ``config.json``
    dict holds them (for :func:`model_split_problem`)."""
    fields = ["model_type", *(field for _, field in SPLIT_COUNTS)]
    return {field: getattr(config, field, None) for field in fields}


def model_split_problem(model_config: Mapping[str, Any], key: str, size: int) -> str | None:
    """Why a model with HF config ``model_config`` (a ``config.json`` as a dict) cannot be
    split over ``size`` ranks of ``key``, or ``None`` when it can."""
    model_type = model_config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        return (
            f"{key}={size}: model_type={model_type!r} has no tensor-parallel plan "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)}); set {key}=1"
        )
    counts = {name: model_config.get(field) for name, field in SPLIT_COUNTS}
    if counts["key/value heads"] is None:
        counts["key/value heads"] = counts["query heads"]
    heads = f"{counts['query heads']} query / {counts['key/value heads']} key/value heads"
    for name, count in counts.items():
        if isinstance(count, int) and count % size:
            fits = ", ".join(str(d) for d in range(1, count + 1) if count % d == 0)
            return (
                f"{key}={size}: the model's {name} ({count}) cannot be split evenly over "
                f"{size} tensor ranks (it has {heads}, intermediate size "
                f"{counts['intermediate size']}); use a {key} that divides {count}: one of {fits}"
            )
    return None
