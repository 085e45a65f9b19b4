"""Building the parts of an RL run from its config: tokenizer, data, rewards, KL
controller and the role worker groups with their models.

``RLTrainer.__init__`` (``verl/trainer/rl/trainer.py``) calls these in a fixed order (the
order random numbers are drawn in is part of what makes a run reproducible); the loop
itself lives in the trainer. Every function takes the validated
:class:`~verl.config.TrainerConfig` and returns plain objects.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from verl.algorithms import get_kl_controller
from verl.config import TrainerConfig
from verl.controller import ClassWithInitArgs
from verl.data import PromptDataLoader, RLHFDataset, collate_fn
from verl.data.lazy_dataset import LazyRLHFDataset
from verl.data.rl_dataset import scan_first_rows_by_source
from verl.data.rollout_file import RolloutFileDataset, collate_rollout_items
from verl.data.vision_dataset import VisionRLHFDataset, collate_vision_fn
from verl.models import load_tokenizer, resolve_model_path
from verl.protocol import DataProto
from verl.rewards import (
    OverlongBuffer,
    RewardFunction,
    RewardManager,
    as_reward_function,
    get_reward_manager,
    load_reward_function,
)
from verl.tools import tool_schemas
from verl.tools.interaction import load_interaction
from verl.trainer.lifecycle.setup import prepare_data_files
from verl.trainer.rl.offline_rollouts import OfflineRolloutSource, StoredScoreReward
from verl.trainer.rl.placement import Placement, place_roles
from verl.trainer.rl.reward_loop import uses_rules
from verl.workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker
from verl.workers.specs import (
    actor_rollout_ref_spec,
    critic_spec,
    reward_model_spec,
    teacher_pool_spec,
)
from verl.workers.teacher_worker import TeacherWorker

logger = logging.getLogger(__name__)

__all__ = [
    "RLData",
    "build_data",
    "build_kl_controller",
    "build_processor",
    "build_reward_manager",
    "build_roles",
    "build_tokenizer",
    "check_data_sources",
    "load_compute_score",
    "module_source",
    "module_tokenizer",
    "optimizer_steps_per_step",
]


def build_tokenizer(
    cfg: TrainerConfig, tokenizer: Any = None, module: torch.nn.Module | None = None
) -> Any:
    """``tokenizer`` (or the one at the model's tokenizer path), left-padding.

    With an actor ``module`` built outside the config (the Python API's ``actor_model``),
    the tokenizer must be the module's own, never silently the default model's
    (:func:`module_tokenizer`).
    """
    if module is not None:
        tokenizer = module_tokenizer(cfg, module, tokenizer)
    if tokenizer is None:
        tokenizer = load_tokenizer(
            cfg.tokenizer_path, trust_remote_code=cfg.actor_rollout_ref.model.trust_remote_code
        )
    tokenizer.padding_side = "left"
    return tokenizer


def module_source(obj: Any) -> str | None:
    """Where a model or tokenizer object was loaded from: its ``name_or_path`` (for a model
    also ``config._name_or_path``); ``None`` when it does not say."""
    name = getattr(obj, "name_or_path", None) or getattr(
        getattr(obj, "config", None), "_name_or_path", None
    )
    return str(name) if isinstance(name, str | Path) and str(name) else None


def _same_source(a: str, b: str) -> bool:
    """Whether two model paths name one model (local directories and the embedded model's
    names compared as resolved directories, anything else as text)."""
    try:
        return resolve_model_path(a) == resolve_model_path(b)
    except OSError:
        return a.rstrip("/") == b.rstrip("/")


def module_tokenizer(cfg: TrainerConfig, module: torch.nn.Module, tokenizer: Any = None) -> Any:
    """The tokenizer of an actor ``module`` passed as an object: ``tokenizer`` when given,
    else the configured tokenizer path's when the config names one, else the one saved
    where the module came from (its ``name_or_path``).

    Raises ``ValueError`` naming both sources when the module's ``name_or_path`` and the
    tokenizer's source (the ``tokenizer`` object's, or the configured path) differ, and
    naming what to pass when the tokenizer cannot be known: without this, a module with a
    vocabulary of its own would train with the default model's tokenizer whenever its
    embedding table is at least as large (the only check, ``check_vocab_covers_tokenizer``,
    catches the opposite case only).
    """
    model = cfg.actor_rollout_ref.model
    source = module_source(module)
    pass_one = (
        "pass tokenizer=<the model's tokenizer>, or set actor_rollout_ref.model.path (or "
        "model.tokenizer_path) to the directory the model and its tokenizer were saved to"
    )
    if tokenizer is not None:
        given = module_source(tokenizer)
        if source and given and not _same_source(source, given):
            raise ValueError(
                f"actor model name_or_path={source!r} but the tokenizer's name_or_path="
                f"{given!r}: a model and a tokenizer from two sources need not share token "
                "ids; pass the tokenizer saved with the model"
            )
        return tokenizer
    configured = model.tokenizer_path is not None or model.path != type(model)().path
    if configured:
        key = "model.tokenizer_path" if model.tokenizer_path else "model.path"
        if source and not _same_source(source, cfg.tokenizer_path):
            raise ValueError(
                f"actor model name_or_path={source!r} but the tokenizer would be loaded from "
                f"actor_rollout_ref.{key}={cfg.tokenizer_path!r}: a model and a tokenizer "
                f"from two sources need not share token ids; {pass_one}"
            )
        return None  # the configured path's tokenizer
    if source is None:
        raise ValueError(
            "the actor model object has no name_or_path and no tokenizer or model path is "
            f"configured: its tokenizer cannot be known (the default model's, "
            f"{model.path!r}, need not match its token ids); {pass_one}"
        )
    try:
        loaded = load_tokenizer(source, trust_remote_code=model.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ValueError(
            f"the actor model's name_or_path={source!r} names no loadable tokenizer "
            f"({exc}); {pass_one}"
        ) from exc
    logger.info("tokenizer: the actor model's own, from its name_or_path %s", source)
    return loaded


def build_processor(cfg: TrainerConfig) -> Any:
    """The processor of a vision-language actor (``model.path`` a Qwen2-VL-family
    directory: :func:`verl.models.vision_processor.load_vision_processor`), else None."""
    from verl.models.vision_model import is_vision_model_dir
    from verl.models.vision_processor import load_vision_processor

    path = cfg.actor_rollout_ref.model.path
    if not is_vision_model_dir(path):
        return None
    processor = load_vision_processor(str(resolve_model_path(path)))
    processor.tokenizer.padding_side = "left"
    return processor


class _Collate:
    """Picklable collate: left-pads a list of dataset items into a ``DataProto`` (with their
    stored responses when ``rollouts``: :func:`verl.data.rollout_file.collate_rollout_items`;
    with their images when ``vision``: :func:`verl.data.vision_dataset.collate_vision_fn`)."""

    def __init__(self, pad_token_id: int, rollouts: bool = False, vision: bool = False) -> None:
        self.pad_token_id = pad_token_id
        self.rollouts = rollouts
        self.vision = vision

    def __call__(self, items: list[dict[str, Any]]) -> DataProto:
        if self.rollouts:
            return collate_rollout_items(items, pad_token_id=self.pad_token_id)
        if self.vision:
            return collate_vision_fn(items, pad_token_id=self.pad_token_id)
        return collate_fn(items, pad_token_id=self.pad_token_id)


def _vision_datasets(
    cfg: TrainerConfig, processor: Any, train_files: Any, val_files: Any
) -> tuple[VisionRLHFDataset, VisionRLHFDataset | None]:
    """The image prompt datasets of a vision-language actor."""
    from transformers import AutoConfig

    dcfg = cfg.data
    if dcfg.rollout_files:
        raise ValueError(
            "data.rollout_files (stored rollouts) does not take a vision-language model "
            f"(actor_rollout_ref.model.path={cfg.actor_rollout_ref.model.path!r}) yet"
        )
    model_config = AutoConfig.from_pretrained(
        str(resolve_model_path(cfg.actor_rollout_ref.model.path)), local_files_only=True
    )
    kwargs = dict(
        processor=processor,
        model_config=model_config,
        max_prompt_length=dcfg.max_prompt_length,
        truncation=dcfg.truncation,
        prompt_key=dcfg.prompt_key,
    )
    val = VisionRLHFDataset(val_files, **kwargs) if val_files else None
    return VisionRLHFDataset(train_files, **kwargs), val


@dataclass
class RLData:
    """The prompt data of a run: datasets, the collate function, the resumable loader and
    the number of trainer steps it supports."""

    train_dataset: RLHFDataset | LazyRLHFDataset | RolloutFileDataset | VisionRLHFDataset
    val_dataset: RLHFDataset | VisionRLHFDataset | None
    collate: Callable[[list[dict[str, Any]]], DataProto]
    train_loader: PromptDataLoader
    total_steps: int


def build_data(cfg: TrainerConfig, tokenizer: Any, run_dir: Path) -> RLData:
    """Datasets of ``data.train_files`` / ``val_files`` (or the built-in data, written
    under ``run_dir``) and the training loader; ``total_steps`` is
    ``trainer.total_training_steps`` or ``total_epochs`` epochs of full batches."""
    train_files, val_files = prepare_data_files(cfg, run_dir)
    dcfg = cfg.data
    ds_kwargs = dict(
        tokenizer=tokenizer,
        max_prompt_length=dcfg.max_prompt_length,
        truncation=dcfg.truncation,
        apply_chat_template=dcfg.apply_chat_template,
        prompt_key=dcfg.prompt_key,
    )
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    if multi_turn.enable and multi_turn.tools:
        ds_kwargs["tools"] = tool_schemas(multi_turn.tools)  # the prompts list the tools
    if multi_turn.enable and multi_turn.interaction.path is not None:
        # a bad path or name fails here, before any worker starts
        load_interaction(multi_turn.interaction.path, multi_turn.interaction.name)
    processor = build_processor(cfg)
    vision = processor is not None
    collate = _Collate(tokenizer.pad_token_id, vision=vision)
    train_dataset: Any
    val_dataset: Any = None
    if not vision and val_files:
        val_dataset = RLHFDataset(val_files, **ds_kwargs)
    if vision:  # a vision-language actor: prompts with images (verl.data.vision_dataset)
        train_dataset, val_dataset = _vision_datasets(cfg, processor, train_files, val_files)
    elif dcfg.rollout_files:  # pre-generated rollouts (verl.trainer.rl.offline_rollouts)
        train_dataset = RolloutFileDataset(
            dcfg.rollout_files,
            n=cfg.actor_rollout_ref.rollout.n,
            max_prompt_length=dcfg.max_prompt_length,
            max_response_length=dcfg.max_response_length,
            temperature=_logprob_temperature(cfg),
            pad_token_id=tokenizer.pad_token_id,
        )
    elif dcfg.dataloader_num_workers > 0:  # rows read and tokenized in the loader's workers
        train_dataset = LazyRLHFDataset(train_files, **ds_kwargs)
    else:
        train_dataset = RLHFDataset(train_files, **ds_kwargs)
    train_loader = PromptDataLoader(
        train_dataset,
        batch_size=dcfg.train_batch_size,
        shuffle=dcfg.shuffle,
        seed=dcfg.seed,
        drop_last=True,
        collate_fn=_Collate(
            tokenizer.pad_token_id, rollouts=bool(dcfg.rollout_files), vision=vision
        ),
        num_workers=dcfg.dataloader_num_workers,
        persistent_workers=dcfg.persistent_workers,
        prefetch_factor=dcfg.prefetch_factor,
    )
    steps_per_epoch = len(train_loader)
    if steps_per_epoch == 0:
        raise ValueError(
            f"the training set has {len(train_dataset)} prompts, fewer than "
            f"data.train_batch_size={dcfg.train_batch_size}: no full step can be made"
        )
    total_steps = cfg.trainer.total_training_steps or (steps_per_epoch * cfg.trainer.total_epochs)
    return RLData(train_dataset, val_dataset, collate, train_loader, total_steps)


def _first_rows_by_source(dataset: Any) -> dict[str, str] | None:
    """``{data_source: its first row}`` of a prompt dataset; None for another kind."""
    if isinstance(dataset, RLHFDataset | VisionRLHFDataset):
        return dataset.first_rows_by_source()
    if isinstance(dataset, LazyRLHFDataset):
        return scan_first_rows_by_source(dataset.data_files)
    return None


def check_data_sources(
    cfg: TrainerConfig, train_dataset: Any, val_dataset: Any, reward_fn: Any, val_reward_fn: Any
) -> None:
    """Every ``data_source`` of the data files has a scorer, checked at start-up (before any
    model loads) rather than at the first scoring, after generation.

    A dataset is checked only when the rules score it: its reward manager uses the
    built-in scorers (no ``custom_reward_function``, no reward function passed in Python),
    and, for the training set, no reward model replaces them and the scores are not the
    stored ones of ``data.rollout_files``.

    Raises:
        UnknownDataSourceError: naming the data key, the file and row of the first row with
            the unknown source, the known sources and the fixes.
    """
    from difflib import get_close_matches

    from verl.rewards import UnknownDataSourceError, get_scorer, known_data_sources

    checks = [("data.val_files", val_dataset, val_reward_fn)]
    if uses_rules(cfg):  # the rules score training (no reward model, judge or service alone)
        checks.insert(0, ("data.train_files", train_dataset, reward_fn))
    for key, dataset, manager in checks:
        if dataset is None or not getattr(manager, "builtin", False):
            continue
        first = _first_rows_by_source(dataset)
        for source, where in (first or {}).items():
            try:
                get_scorer(source)
            except UnknownDataSourceError:
                known = known_data_sources()
                close = get_close_matches(source, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise UnknownDataSourceError(
                    f"{key}: {where} has data_source={source!r}{hint}, which no reward "
                    f"scorer knows (known: {', '.join(known)}); fix the data_source column, "
                    "register a scorer with @verl.rewards.register_scorer(name), or set "
                    "custom_reward_function.path to a function that scores it"
                ) from None


def load_compute_score(cfg: TrainerConfig) -> Callable[..., Any] | None:
    """The ``custom_reward_function`` of the config, or None for the built-in scorers."""
    if not cfg.custom_reward_function.path:
        return None
    return load_reward_function(cfg.custom_reward_function.path, cfg.custom_reward_function.name)


def build_reward_manager(
    cfg: TrainerConfig, tokenizer: Any, compute_score: Callable[..., Any] | None, train: bool
) -> RewardFunction:
    """A :class:`RewardManager` over ``compute_score`` (default: the built-in scorers), or
    the registered ``reward_model.reward_manager``, in the reward contract.

    Training rewards get the configured shaping (overlong penalty, normalisation,
    clipping); validation rewards are raw scores, comparable across runs. Training from
    ``data.rollout_files`` takes the stored scores through that shaping
    (:class:`~verl.trainer.rl.offline_rollouts.StoredScoreReward`).
    """
    manager = as_reward_function(_reward_manager(cfg, tokenizer, compute_score, train))
    if train and cfg.data.rollout_files:  # the stored scores, shaped by the manager
        return StoredScoreReward(manager)
    return manager


def _reward_manager(
    cfg: TrainerConfig, tokenizer: Any, compute_score: Callable[..., Any] | None, train: bool
) -> Any:
    rcfg = cfg.reward_model
    overlong = None
    if train and rcfg.overlong_buffer.enable:
        overlong = OverlongBuffer(
            buffer_len=rcfg.overlong_buffer.len,
            penalty_factor=rcfg.overlong_buffer.penalty_factor,
            max_response_length=cfg.data.max_response_length,
        )
    manager_cls = get_reward_manager(rcfg.reward_manager)
    guards = {}
    if issubclass(manager_cls, RewardManager):  # a custom manager may not take these
        guards = {
            "max_abs_reward": rcfg.max_abs_reward,
            "max_failure_rate": rcfg.max_failure_rate if train else rcfg.val_max_failure_rate,
        }
    return manager_cls(
        tokenizer,
        compute_score=compute_score,
        timeout_s=rcfg.timeout_s,
        normalize=rcfg.normalize and train,
        clip_range=tuple(rcfg.clip_range) if (rcfg.clip_range and train) else None,
        overlong_buffer=overlong,
        **guards,
    )


def build_kl_controller(cfg: TrainerConfig) -> Any:
    """The in-reward KL coefficient controller of ``algorithm.kl_ctrl``."""
    akl = cfg.algorithm.kl_ctrl
    return get_kl_controller(
        akl.type,
        kl_coef=akl.kl_coef,
        target_kl=akl.target_kl,
        horizon=akl.horizon,
        final_kl_coef=akl.final_kl_coef,
        schedule_steps=akl.schedule_steps,
    )


def optimizer_steps_per_step(cfg: TrainerConfig, role_cfg: Any) -> int:
    """Optimizer steps a role takes per trainer step: one per mini-batch, per PPO epoch.

    The learning-rate schedule is counted in optimizer steps, so its length is
    ``total_steps * optimizer_steps_per_step``.
    """
    mini_batches = math.ceil(cfg.data.train_batch_size / role_cfg.ppo_mini_batch_size)
    return role_cfg.ppo_epochs * mini_batches


def build_roles(
    cfg: TrainerConfig,
    *,
    use_reference: bool,
    use_critic: bool,
    tokenizer: Any,
    total_steps: int,
    actor_module: torch.nn.Module | None = None,
    critic_module: torch.nn.Module | None = None,
) -> Placement:
    """The role worker groups, placed on devices by the device map (``cfg.resource_pool``),
    with their models built (the learning-rate schedules sized for ``total_steps`` trainer
    steps). On failure every worker started so far is shut down."""
    specs = {
        "actor_rollout_ref": ClassWithInitArgs(
            ActorRolloutRefWorker,
            spec=actor_rollout_ref_spec(
                cfg, role="actor_rollout_ref" if use_reference else "actor_rollout"
            ),
            module=actor_module,
            tokenizer=tokenizer,
        )
    }
    if use_critic:
        specs["critic"] = ClassWithInitArgs(
            CriticWorker, spec=critic_spec(cfg), module=critic_module, tokenizer=tokenizer
        )
    if cfg.reward_model.enable:
        specs["reward_model"] = ClassWithInitArgs(
            RewardModelWorker, spec=reward_model_spec(cfg), actor_tokenizer=tokenizer
        )
    if "teacher" in cfg.placed_roles:  # algorithm.distill.teacher_pool=separate
        specs["teacher"] = ClassWithInitArgs(
            TeacherWorker, spec=teacher_pool_spec(cfg), tokenizer=tokenizer
        )
    placement = place_roles(cfg, specs)
    roles = placement.roles
    try:
        actor_cfg = cfg.actor_rollout_ref.actor
        roles["actor_rollout_ref"].init_model(
            total_steps=total_steps * optimizer_steps_per_step(cfg, actor_cfg)
        )
        if "critic" in roles:
            roles["critic"].init_model(
                total_steps=total_steps * optimizer_steps_per_step(cfg, cfg.critic)
            )
        if "reward_model" in roles:
            roles["reward_model"].init_model()
        if "teacher" in roles:
            roles["teacher"].init_model()
    except BaseException:
        placement.shutdown()
        raise
    if cfg.data.rollout_files:  # training batches answered from the stored rollouts
        roles["actor_rollout_ref"] = OfflineRolloutSource(
            roles["actor_rollout_ref"],
            pad_token_id=tokenizer.pad_token_id,
            max_response_length=cfg.data.max_response_length,
            temperature=_logprob_temperature(cfg),
        )
    return placement


def _logprob_temperature(cfg: TrainerConfig) -> float:
    """The temperature of the rollout's log-probs (1.0 for greedy), as the worker reports it."""
    temperature = cfg.actor_rollout_ref.rollout.temperature
    return float(temperature) if temperature > 0 else 1.0
