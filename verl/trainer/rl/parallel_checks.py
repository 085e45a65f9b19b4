"""Validation of a trained role's ``tensor_parallel_size`` (``verl.trainer.rl.config_checks``).

:func:`check_tensor_parallel` runs beside the sequence-parallel check of the same role
(``actor_rollout_ref.actor``, ``critic``; the reference follows the actor's size). It
refuses, naming the key and the reason:

- a size that does not divide the role's ranks together with its sequence-parallel size,
  or a combination with sequence parallelism (no ``(data, sequence, tensor)`` mesh);
- the single engine (``strategy=single`` runs one process);
- what the engine's tensor-parallel plan does not cover: a LoRA (peft) actor or critic, a
  reference in a weight-only format (fp8 / int4 layers have no plan);
- a rollout other than native / hf (only they generate from the shards), a multi-turn or
  agent rollout (the tensor group's ranks generate in lock step), a sequence-parallel
  reference, and on-policy distillation (the teacher has no tensor-parallel layout);
- a model whose query heads, key/value heads, intermediate size or vocabulary do not split
  evenly, when its ``config.json`` is in a local directory (otherwise the engine checks
  them when it is built, with the same message).
"""

from __future__ import annotations

import json
import os
from typing import Any

from verl.config.precision import WEIGHT_ONLY, active_roles, role_precision
from verl.trainer.config_checks import Checks, divisors
from verl.utils.tensor_split import model_split_problem

__all__ = ["check_tensor_parallel"]


def _model_config(path: str | None) -> dict[str, Any] | None:
    """The ``config.json`` of a local model directory, or ``None`` (no such file)."""
    file = os.path.join(path, "config.json") if path else None
    if file is None or not os.path.isfile(file):
        return None
    try:
        with open(file) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None  # the model loader reports an unreadable config


def check_tensor_parallel(
    c: Checks,
    cfg: Any,
    prefix: str,
    role: Any,
    role_name: str,
    ranks: int,
    rank_keys: tuple[str, ...],
) -> None:
    """``{prefix}.tensor_parallel_size`` of ``role`` (a trained role's config section) on
    the ``ranks`` ranks of ``role_name`` (``rank_keys``: the keys that set them)."""
    size = role.tensor_parallel_size
    if size <= 1:
        return
    key = f"{prefix}.tensor_parallel_size"
    sp = role.ulysses_sequence_parallel_size
    if sp > 1:
        c.error(
            (key, f"{prefix}.ulysses_sequence_parallel_size"),
            f"{key}={size} with {prefix}.ulysses_sequence_parallel_size={sp}: a (data, "
            "sequence, tensor) mesh is not implemented; set one of them to 1",
        )
    elif ranks % size:
        c.error(
            (key, *rank_keys),
            f"{key}={size}: tensor parallelism splits each layer over {size} ranks, which "
            f"must divide the {ranks} ranks of {role_name}; use one of {divisors(ranks)}",
        )
    if role.strategy == "single":
        c.error(
            (key, f"{prefix}.strategy"),
            f"{key}={size}: tensor parallelism needs the fsdp2 engine, but "
            f"{prefix}.strategy=single runs one process; use fsdp2 (or auto)",
        )
    if role_name == "critic":
        _check_critic(c, cfg, key, size)
    else:
        _check_actor(c, cfg, key, size)
    path_key = "critic.model.path" if role_name == "critic" else "actor_rollout_ref.model.path"
    path = cfg.actor_rollout_ref.model.path
    if role_name == "critic" and cfg.critic.model.path:
        path = cfg.critic.model.path
    model_config = _model_config(path)
    problem = None if model_config is None else model_split_problem(model_config, key, size)
    if problem is not None:
        c.error((key, path_key), problem)


def _check_critic(c: Checks, cfg: Any, key: str, size: int) -> None:
    lora = cfg.critic.model.lora_rank
    if lora > 0:
        c.error(
            (key, "critic.model.lora_rank"),
            f"{key}={size} with critic.model.lora_rank={lora}: the LoRA adapters' layers "
            "have no tensor-parallel plan; set one of them to 0 / 1",
        )


def _check_actor(c: Checks, cfg: Any, key: str, size: int) -> None:
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.name not in ("native", "hf"):
        c.error(
            (key, "actor_rollout_ref.rollout.name"),
            f"{key}={size} with actor_rollout_ref.rollout.name={rollout.name}: only the "
            "native and hf rollouts generate from the actor's tensor-parallel shards; "
            f"use one of them, or {key}=1 (a vLLM engine splits over worker processes "
            "of its own: rollout.vllm.tensor_parallel_size)",
        )
    ref_sp = cfg.actor_rollout_ref.ref.ulysses_sequence_parallel_size
    if ref_sp is not None and ref_sp > 1:
        c.error(
            (key, "actor_rollout_ref.ref.ulysses_sequence_parallel_size"),
            f"{key}={size} with actor_rollout_ref.ref.ulysses_sequence_parallel_size={ref_sp}: "
            "the reference follows the actor's tensor parallelism, and a (data, sequence, "
            "tensor) mesh is not implemented; set the reference's to 1 (or null)",
        )
    for loop in ("multi_turn", "agent"):
        if getattr(rollout, loop).enable:
            c.error(
                (key, f"actor_rollout_ref.rollout.{loop}.enable"),
                f"{key}={size} with actor_rollout_ref.rollout.{loop}.enable=true: the ranks "
                "of a tensor group generate in lock step, which a per-rank agent loop does "
                "not keep; set one of them off",
            )
    if cfg.algorithm.distill.enable:
        c.error(
            (key, "algorithm.distill.enable"),
            f"{key}={size} with algorithm.distill.enable=true: the teacher has no "
            "tensor-parallel layout (it scores each rank's own rows while the actor's tensor "
            "group shares them); set one of them off",
        )
    model = cfg.actor_rollout_ref.model
    if model.lora_rank > 0:
        c.error(
            (key, "actor_rollout_ref.model.lora_rank"),
            f"{key}={size} with actor_rollout_ref.model.lora_rank={model.lora_rank}: the "
            "LoRA adapters' layers have no tensor-parallel plan; set one of them to 0 / 1",
        )
    for name in ("actor", "reference"):
        precision = role_precision(cfg, name) if name in active_roles(cfg) else None
        if precision in WEIGHT_ONLY:
            c.error(
                key,
                f"{key}={size}: the {name} computes in {precision}, whose quantized linear "
                "layers have no tensor-parallel plan (the reference follows the actor's "
                f"tensor_parallel_size); use another precision for it or set {key}=1",
            )
