"""Rollout: sample responses (and their log-probs) for a batch of prompts.

``build_rollout("native", model, tokenizer).generate(prompts, SamplingParams(n=4))``.
Backends: ``native`` (our batched KV-cache sampler over the training module's weights),
``hf`` (transformers ``generate``), ``vllm`` (vLLM's engine with its own copy of the weights,
pushed after each update; ``verl.rollout.vllm_rollout``) and ``sglang`` (SGLang's engine,
CUDA only; ``verl.rollout.sglang_rollout``). With several actor ranks those two run as one
engine on rank 0 (``verl.rollout.rank_zero``).
The output layout and log-prob convention are documented in ``verl.rollout.base``;
installing and choosing a backend: ``docs/rollout.md``.
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
