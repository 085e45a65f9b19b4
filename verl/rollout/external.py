"""Placeholder for the GPU serving-engine backend ``sglang`` (``vllm`` is real:
``verl.rollout.vllm_rollout``).

It is registered so that ``rollout.name=sglang`` is a known name with a clear message,
instead of an unknown-name error or an import failure deep in a worker. Constructing one
checks, in order: the package is installed, a CUDA device exists, and then reports that the
adapter (weight sync from the training module, DataProto conversion) is not built yet.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from verl.rollout.base import RolloutEngine, SamplingParams

__all__ = ["SGLangRollout"]


class _ExternalRollout(RolloutEngine):
    package = ""

    def __init__(self, module: Any = None, tokenizer: Any = None, **cfg: Any) -> None:
        name = self.package
        if importlib.util.find_spec(name) is None:
            raise ImportError(
                f"{name} is not installed; install verl[gpu] on a CUDA machine or use "
                "rollout.name=native"
            )
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"{name} needs a CUDA device and none is visible; use rollout.name=native on CPU"
            )
        raise NotImplementedError(
            f"the {name} rollout adapter is not implemented yet; use rollout.name=native "
            "or rollout.name=hf"
        )

    def generate(self, prompts: Any, params: SamplingParams) -> Any:  # pragma: no cover
        raise NotImplementedError(f"{self.package} rollout is not implemented")


class SGLangRollout(_ExternalRollout):
    """SGLang backend placeholder (GPU only)."""

    package = "sglang"
