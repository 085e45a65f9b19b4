"""Set-up of the hybrid actor worker's models: the policy, its reference and its teacher.

Contract: every function reads an :class:`~verl.workers.specs.ActorRolloutRefSpec` (never
the config tree) and is called by ``ActorRolloutRefWorker.init_model`` in this order, which
is the order the models draw random numbers in: :func:`load_policy` (the policy, LoRA
adapters seeded with ``spec.seed``), :func:`reference_module` (a frozen copy, quantized for
an fp8 / int4 reference), :func:`teacher_module`, then :func:`checkpoint_policy`.
``engine_of`` builds an engine of the worker's strategy on its device (and process group).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

import torch

from verl.engine.options import EngineOptions
from verl.models import (
    attention_implementation,
    check_vocab_covers_tokenizer,
    checkpoint_if_configured,
    load_causal_lm,
    load_tokenizer,
    resolve_dtype,
)
from verl.models.lora import apply_lora
from verl.models.vision_model import load_actor_model
from verl.workers.common import apply_inference_precision, dynamic_precision
from verl.workers.specs import ActorRolloutRefSpec, TeacherPoolSpec
from verl.workers.teacher import check_same_tokenizer

logger = logging.getLogger(__name__)

__all__ = [
    "checkpoint_policy",
    "load_policy",
    "policy_load_kwargs",
    "reference_dynamic_precision",
    "reference_module",
    "teacher_module",
]

EngineOf = Callable[[torch.nn.Module, Any, EngineOptions], Any]


def policy_load_kwargs(spec: ActorRolloutRefSpec, device: torch.device) -> dict[str, Any]:
    """``load_causal_lm`` keywords of the policy (``model.path``) on ``device``."""
    model = spec.model
    return dict(
        path=model.path,
        dtype=resolve_dtype(model.dtype),
        trust_remote_code=model.trust_remote_code,
        override_config=model.override_config,
        attn_implementation=attention_implementation(spec.use_flash_attention, device),
    )


def load_policy(
    spec: ActorRolloutRefSpec,
    module: torch.nn.Module | None,
    tokenizer: Any,
    device: torch.device,
) -> torch.nn.Module:
    """The policy: ``module`` or ``model.path`` loaded, checked against ``tokenizer``, with
    LoRA adapters when ``model.lora`` is set (drawn from ``spec.seed`` alone: every rank
    starts from one process's). A vision-language directory (Qwen2-VL family) loads as
    ``AutoModelForImageTextToText`` (``verl.models.vision_model``)."""
    if module is None:
        module = load_actor_model(**policy_load_kwargs(spec, device))
    check_vocab_covers_tokenizer(module, tokenizer, "actor_rollout_ref.model")
    if spec.model.lora is not None:
        module = apply_lora(module, spec.model.lora, seed=spec.seed)
    return module


def reference_module(spec: ActorRolloutRefSpec, module: torch.nn.Module) -> torch.nn.Module:
    """The reference: the initial policy, frozen; copied before any update, in its
    precision (fp8 / int4 quantized in place)."""
    ref_module = copy.deepcopy(module).eval().requires_grad_(False)
    return apply_inference_precision(spec.ref.precision, ref_module)


def reference_dynamic_precision(
    spec: ActorRolloutRefSpec, ref_module: torch.nn.Module, device: torch.device, given: bool
) -> Any:
    """The reference's :class:`~verl.workers.dynamic_precision.DynamicPrecision` (None when
    ``trainer.dynamic_precision`` is off for it). Its full-precision weights come back from
    ``model.path``, or, for a module given in memory (``given``), from a host copy."""
    load_kwargs = policy_load_kwargs(spec, device)
    return dynamic_precision(
        "reference",
        ref_module,
        device,
        spec.ref.dynamic_min_free_gb,
        reload=None if given else lambda: load_actor_model(**load_kwargs).state_dict(),
    )


def teacher_module(
    spec: ActorRolloutRefSpec | TeacherPoolSpec, tokenizer: Any, device: torch.device
) -> Any:
    """The distillation teacher: ``teacher.path`` loaded frozen (``requires_grad=False``,
    eval mode) in its precision, after checking that its tokenizer is the student's (the
    actor worker's spec, or the teacher pool's: both name ``teacher`` and ``model``)."""
    teacher, model = spec.teacher, spec.model
    teacher_tokenizer = load_tokenizer(teacher.path, trust_remote_code=model.trust_remote_code)
    check_same_tokenizer(tokenizer, teacher_tokenizer, model.tokenizer_path, teacher.path)
    precision = teacher.precision
    dtype = precision if precision in ("fp32", "bf16", "fp16") else None
    module = load_causal_lm(
        path=teacher.path,
        dtype=resolve_dtype(dtype or model.dtype),
        trust_remote_code=model.trust_remote_code,
        attn_implementation=attention_implementation(spec.use_flash_attention, device),
    )
    check_vocab_covers_tokenizer(module, tokenizer, "algorithm.distill.teacher_path")
    module = module.eval().requires_grad_(False)
    apply_inference_precision(precision, module)
    logger.info("distillation teacher %s (%s)", teacher.path, precision)
    return module


def checkpoint_policy(spec: ActorRolloutRefSpec, module: torch.nn.Module) -> None:
    """Activation checkpointing of the policy as ``model.gradient_checkpointing`` says
    (null: by the most tokens an update micro-batch computes)."""
    checkpoint_if_configured(
        module,
        spec.model.gradient_checkpointing,
        spec.actor.checkpoint_tokens,
        "actor_rollout_ref.model.enable_gradient_checkpointing",
    )
