"""Rollout backends by name: ``native``, ``hf``, and the GPU-only ``vllm`` / ``sglang`` stubs.

Backends are registered as import paths and imported on first use, so ``import
verl.rollout`` never pulls in a backend's dependencies (vLLM, SGLang, or even transformers'
generation code). A new backend is one ``register_rollout`` call or decorator.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from verl.rollout.base import RolloutEngine

logger = logging.getLogger(__name__)

__all__ = ["available_rollouts", "build_rollout", "get_rollout_engine", "register_rollout"]

# name -> class, or "module:attribute" imported lazily.
_REGISTRY: dict[str, type[RolloutEngine] | str] = {
    "native": "verl.rollout.native:NativeRollout",
    "hf": "verl.rollout.hf:HFRollout",
    "vllm": "verl.rollout.external:VLLMRollout",
    "sglang": "verl.rollout.external:SGLangRollout",
}

E = TypeVar("E", bound=type[RolloutEngine])


def register_rollout(
    name: str, engine: type[RolloutEngine] | str | None = None
) -> Callable[[E], E] | None:
    """Register ``engine`` (a class or ``"module:attr"``) as ``name``; usable as a decorator.

    Re-registering a name replaces it (with a log line), so tests can swap a backend.
    """

    def add(cls: Any) -> Any:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            logger.info("rollout backend %r re-registered", name)
        _REGISTRY[name] = cls
        return cls

    if engine is None:
        return add
    add(engine)
    return None


def available_rollouts() -> list[str]:
    """Names of registered backends (registered, not necessarily usable on this machine)."""
    return sorted(_REGISTRY)


def get_rollout_engine(name: str) -> type[RolloutEngine]:
    """The engine class registered as ``name`` (imports it on first use)."""
    if name not in _REGISTRY:
        raise ValueError(
            f"unknown rollout backend {name!r}; available: {available_rollouts()} "
            "(set rollout.name to one of them)"
        )
    entry = _REGISTRY[name]
    if isinstance(entry, str):
        module_name, attr = entry.split(":")
        entry = getattr(importlib.import_module(module_name), attr)
        _REGISTRY[name] = entry
    return entry


def build_rollout(name: str, module: Any, tokenizer: Any = None, **cfg: Any) -> RolloutEngine:
    """Construct backend ``name`` over ``module`` (the actor's model) and ``tokenizer``.

    ``cfg`` goes to the engine's constructor (e.g. ``compaction=False`` for ``native``).
    """
    return get_rollout_engine(name)(module, tokenizer, **cfg)
