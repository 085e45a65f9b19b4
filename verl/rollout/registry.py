"""Rollout backends by name: ``native``, ``hf``, ``vllm`` and the GPU-only ``sglang``.

The backends are entries of :data:`verl.registry.ROLLOUT_BACKENDS`, declared as import paths
and imported on first use, so ``import verl.rollout`` never pulls in a backend's
dependencies (vLLM, SGLang, or even transformers' generation code). An entry may declare
``needs_cuda`` and the ``package`` it needs (and how to ``install`` it); config validation
checks both, and the worker calls the class's ``check_available()`` before loading a model.
A new backend is one ``register_rollout`` call or decorator, and ``rollout.name=<it>`` then
works with no other edit (its class must be importable in the worker processes on the Ray backend: give a
``"module:attr"`` string, or register it in a module the workers import).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from verl.registry import ROLLOUT_BACKENDS, UnknownNameError
from verl.rollout.base import RolloutEngine

__all__ = ["available_rollouts", "build_rollout", "get_rollout_engine", "register_rollout"]

E = TypeVar("E", bound=type[RolloutEngine])


def register_rollout(
    name: str,
    engine: type[RolloutEngine] | str | None = None,
    *,
    override: bool = False,
    needs_cuda: bool = False,
    package: str | None = None,
    install: str | None = None,
) -> Callable[[E], E] | None:
    """Register ``engine`` (a class or ``"module:attr"``) as ``name``; usable as a decorator.

    A name already bound to another engine raises ``ValueError`` unless ``override=True``.
    ``needs_cuda`` / ``package``: what config validation checks before a run starts;
    ``install``: how to get the package (the validation error's hint).
    """
    needs = {"needs_cuda": needs_cuda, "package": package, "install": install}
    if engine is None:
        return ROLLOUT_BACKENDS.register(name, override=override, **needs)
    ROLLOUT_BACKENDS.add(name, engine, override=override, **needs)
    return None


def available_rollouts() -> list[str]:
    """Names of registered backends (registered, not necessarily usable on this machine)."""
    return ROLLOUT_BACKENDS.names()


def get_rollout_engine(name: str) -> type[RolloutEngine]:
    """The engine class registered as ``name`` (imports it on first use)."""
    try:
        return ROLLOUT_BACKENDS.get(name)
    except UnknownNameError as exc:
        raise UnknownNameError(f"{exc} (set rollout.name to one of them)") from None


def build_rollout(name: str, module: Any, tokenizer: Any = None, **cfg: Any) -> RolloutEngine:
    """Construct backend ``name`` over ``module`` (the actor's model) and ``tokenizer``.

    ``cfg`` goes to the engine's constructor (e.g. ``compaction=False`` for ``native``).
    """
    return get_rollout_engine(name)(module, tokenizer, **cfg)
