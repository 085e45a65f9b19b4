"""The engine and rollout options of a role, read from the config (the edge of the workers).

:mod:`verl.workers.specs` builds each worker's spec with these; they read the
``TrainerConfig`` (its precision keys resolved by :mod:`verl.config.precision`) and return
plain values:

- :func:`engine_options`: the FSDP2 / offload fields of a role's ``fsdp_config``;
- :func:`precision_options`: the precision fields of a role (autocast or FSDP2 mixed
  precision for a trained role, the stored dtype for an inference role);
- :func:`rollout_options`: the rollout backend's constructor keywords;
- :func:`dynamic_precision_threshold`: an inference role's free-memory threshold.

``engine_options`` and ``precision_options`` return :class:`~verl.engine.options.EngineOptions`
fields as a dict: a role's engine options are their merge.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = [
    "dynamic_precision_threshold",
    "engine_options",
    "precision_options",
    "rollout_options",
]


def engine_options(
    strategy: str,
    fsdp_config: Any,
    sequence_parallel_size: int = 1,
    tensor_parallel_size: int = 1,
) -> dict[str, Any]:
    """``EngineOptions`` fields of ``strategy`` from a role's ``fsdp_config`` (and its
    ``ulysses_sequence_parallel_size`` and ``tensor_parallel_size``, fsdp2 only).

    ``param_offload`` / ``optimizer_offload`` keep that state in host memory between uses
    (the engine moves it to the device for each train/eval/generate block). On fsdp2,
    ``param_offload`` is FSDP2's ``CPUOffloadPolicy`` instead (sharded parameters,
    gradients and optimizer state live on the host; the optimizer steps there), so
    ``optimizer_offload`` adds nothing to it. The worker makes sure an fsdp2 engine's
    process group exists (``verl.workers.common.ensure_process_group``).
    """
    params = bool(getattr(fsdp_config, "param_offload", False))
    optim = bool(getattr(fsdp_config, "optimizer_offload", False))
    if strategy != "fsdp2":
        options = {"offload_params": params, "offload_optimizer": optim}
        if sequence_parallel_size != 1:  # the single engine refuses it, naming the key
            options["sequence_parallel_size"] = sequence_parallel_size
        if tensor_parallel_size != 1:  # as above
            options["tensor_parallel_size"] = tensor_parallel_size
        return options
    mp = getattr(fsdp_config, "mixed_precision", None)
    return {
        "reshard_after_forward": fsdp_config.reshard_after_forward,
        "shard_dim": getattr(fsdp_config, "shard_dim", 0),
        "mixed_precision": None if mp is None else dataclasses.asdict(mp),
        "cpu_offload": params,
        "offload_optimizer": optim and not params,
        "sequence_parallel_size": sequence_parallel_size,
        "tensor_parallel_size": tensor_parallel_size,
    }


def precision_options(config: Any, role: str, strategy: str, fsdp_options: dict) -> dict:
    """``EngineOptions`` precision fields of ``role`` (actor, critic, reference).

    From the role's precision key (``verl.config.precision.role_precision``, which the
    trainer-wide keys fill), merged over ``fsdp_options`` (:func:`engine_options`):

    - trainable roles keep fp32 master weights and optimizer state; bf16/fp16 compute is
      ``torch.autocast`` on the single engine and FSDP2's ``MixedPrecisionPolicy``
      (``param_dtype``, ``reduce_dtype`` = ``trainer.gradient_precision``, fp32 buffers) on
      fsdp2, unless ``fsdp_config.mixed_precision`` is set (validation made them agree).
      fp16 gets dynamic loss scaling unless ``trainer.use_gradient_scaling=false``;
    - inference roles store and compute in fp32/bf16/fp16 (``param_dtype``); fp8 is applied
      (or int4) to the module by ``verl.workers.common.apply_inference_precision`` before
      the engine is built.
    """
    from verl.config.precision import TRAINABLE_ROLES, gradient_scaling, role_precision

    prec = role_precision(config, role)
    logger.info("%s computes in %s (strategy %s)", role, prec, strategy)
    opts = dict(fsdp_options)
    t = config.trainer
    if role in TRAINABLE_ROLES:
        opts["max_consecutive_nonfinite"] = t.max_consecutive_nonfinite_steps
        opts["grad_scaling"] = gradient_scaling(config, role)  # fp16 only (a no-op elsewhere)
        if prec in ("bf16", "fp16"):
            if strategy == "fsdp2":
                if opts.get("mixed_precision") is None:
                    opts["mixed_precision"] = {
                        "param_dtype": prec,
                        "reduce_dtype": t.gradient_precision,
                        "buffer_dtype": "fp32",
                    }
            else:
                opts["autocast_dtype"] = prec
    elif prec in ("fp32", "bf16", "fp16"):
        opts["param_dtype"] = prec
    return opts


def rollout_options(config: Any, rollout_cls: Any) -> dict[str, Any]:
    """Constructor keywords of the rollout backend ``rollout_cls``: its own
    ``config_options``, plus, for an engine that keeps its own weights (vllm, sglang), the
    actor's compute precision as ``dtype`` when it is bf16 / fp16 (``auto`` resolved), so the
    engine samples in the precision the trainer computes in. Otherwise the engine runs in
    the weights' storage dtype."""
    from verl.config.precision import role_precision

    options = dict(rollout_cls.config_options(config))
    compute = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(role_precision(config, "actor"))
    if rollout_cls.owns_weights and compute is not None:
        options["dtype"] = compute
    return options


def dynamic_precision_threshold(config: Any, role: str) -> float | None:
    """``trainer.dynamic_precision_min_free_gb`` when an inference role switches precision
    with the free memory (``trainer.dynamic_precision``; never for a role already in fp8 /
    int4), else ``None`` (see :mod:`verl.workers.dynamic_precision`)."""
    from verl.config.precision import role_precision

    t = config.trainer
    if not t.dynamic_precision or role_precision(config, role) in ("fp8", "int4"):
        return None
    return t.dynamic_precision_min_free_gb
