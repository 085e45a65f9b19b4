"""Rollout: sample responses (and their log-probs) for a batch of prompts.

``build_rollout("native", model, tokenizer).generate(prompts, SamplingParams(n=4))``.
Backends: ``native`` (our batched KV-cache sampler over the training module's weights),
``hf`` (transformers ``generate``), ``vllm`` / ``sglang`` (GPU-only, not built yet). The
output layout and log-prob convention are documented in ``verl.rollout.base``.
"""

from verl.rollout.base import RolloutEngine, SamplingParams
from verl.rollout.registry import (
    available_rollouts,
    build_rollout,
    get_rollout_engine,
    register_rollout,
)

__all__ = [
    "RolloutEngine",
    "SamplingParams",
    "available_rollouts",
    "build_rollout",
    "get_rollout_engine",
    "register_rollout",
]
