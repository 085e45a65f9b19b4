"""Model loading and construction: tiny test models, local HF checkpoints, the embedded
SmolLM2-135M-Instruct, the critic's value-head model, precision and activation checkpointing."""

from verl.models.embedded import EMBEDDED_MODEL_NAME, embedded_model_dir, is_embedded_alias
from verl.models.loading import (
    check_vocab_covers_tokenizer,
    load_causal_lm,
    load_tokenizer,
    resolve_model_path,
)
from verl.models.precision import (
    attention_implementation,
    checkpoint_if_configured,
    enable_activation_checkpointing,
    resolve_dtype,
)
from verl.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny_model_dir
from verl.models.value_model import CausalLMWithValueHead, load_reward_model

__all__ = [
    "EMBEDDED_MODEL_NAME",
    "CausalLMWithValueHead",
    "attention_implementation",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "check_vocab_covers_tokenizer",
    "checkpoint_if_configured",
    "embedded_model_dir",
    "enable_activation_checkpointing",
    "is_embedded_alias",
    "load_causal_lm",
    "load_reward_model",
    "load_tokenizer",
    "resolve_dtype",
    "resolve_model_path",
    "save_tiny_model_dir",
]
