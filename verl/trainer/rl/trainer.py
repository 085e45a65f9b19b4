"""The single-controller RL loop: PPO, GRPO and their relatives.

``RLTrainer.fit()`` is the whole algorithm, top to bottom, the way docs/concepts.md draws it
(the run's lifecycle is :mod:`verl.trainer.lifecycle.driver`; the step is :meth:`RLTrainer.train_step`)::

    for batch in loader:
        gen   = actor_rollout.generate_sequences(batch)      # n responses per prompt
        gen  |= reward(gen)                                  # rules / reward model
        (DAPO: drop groups with equal rewards, generate from more batches until full)
        gen  |= actor_rollout.compute_log_prob(gen)          # old policy, unless skipped
        gen  |= actor_rollout.compute_ref_log_prob(gen)      # if a KL term is used
        gen  |= actor_rollout.compute_teacher_log_prob(gen)  # on-policy distillation
        gen  |= critic.compute_values(gen)                   # if the estimator needs V
        gen  |= advantages(gen)                              # pure tensor functions
        (PF-PPO: redraw the responses with replacement, weighted by score)
        critic.update_critic(gen); actor_rollout.update_actor(gen)
        log, validate, save a checkpoint every trainer.save_freq steps

The first two lines (and DAPO's filter) are the step's batch source, chosen when the
trainer is built (:mod:`verl.trainer.rl.batch_source`): one batch, dynamic sampling, or with
``trainer.async_rollout=true`` a batch generated earlier on a copy of the policy while the
previous step trained (:mod:`verl.trainer.rl.async_rollout`).

Scoring comes before the log-prob passes so that dynamic sampling
(``algorithm.filter_groups``, :mod:`verl.trainer.rl.dynamic_sampling`) can drop groups before
any forward pass is spent on them.

The parts of a run (tokenizer, data, rewards, KL controller, the role worker groups and
their models) are built by :mod:`verl.trainer.rl.build`.
The driver holds no model: every tensor-heavy call goes through a worker group. Where the
workers run (in this process, or one Ray actor per device with FSDP2 sharding, roles
colocated or on pools of their own) is decided once, by ``verl.trainer.rl.placement`` from
the device map; nothing below depends on it. Rewards and advantages are cheap and
computed here, on the driver. Each worker method receives only the batch keys it declares
(``@register(reads=...)``), and returns its metrics.

Checkpoints (``verl.trainer.lifecycle.resume``) hold the complete state of the run (weights, optimizers,
schedules, data position, controllers, every rank's random generators), so ``fit()``
resumed from step k takes exactly the steps the uninterrupted run takes after k.
"""

from __future__ import annotations

import copy
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.algorithms import apply_kl_penalty
from verl.compat.device_map import apply_pending_device_map
from verl.config import TrainerConfig, to_dict
from verl.protocol import DataProto
from verl.rewards import RewardFunction, as_reward_function
from verl.trainer.lifecycle import driver, final_export
from verl.trainer.lifecycle.checkpoint import CheckpointManager
from verl.trainer.lifecycle.metrics import (
    RolloutGapWatch,
    compute_data_metrics,
    compute_rollout_mismatch_metrics,
    compute_throughput_metrics,
    timer,
)
from verl.trainer.lifecycle.profiling import StepProfiler
from verl.trainer.lifecycle.resume import RunCheckpointer, resume_checkpoint_path
from verl.trainer.lifecycle.run_lock import RunLock
from verl.trainer.lifecycle.setup import (
    check_supported,
    resolve_run_dirs,
    resolve_sample_dirs,
    seed_everything,
)
from verl.trainer.lifecycle.stopping import (
    DivergenceGuard,
    StepHealth,
    StopRequests,
    diverged_error,
    loss_not_finite,
)
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl import validation
from verl.trainer.rl.advantages import compute_advantages, pf_ppo_redraw
from verl.trainer.rl.async_rollout import AsyncRollout, build_async_rollout
from verl.trainer.rl.batch_source import build_batch_source, draws
from verl.trainer.rl.build import (
    build_data,
    build_kl_controller,
    build_reward_manager,
    build_roles,
    build_tokenizer,
    check_data_sources,
    load_compute_score,
)
from verl.trainer.rl.distill_mix import distill_kind_metrics, mixed_distill_source
from verl.trainer.rl.distill_pool import teacher_scorer
from verl.trainer.rl.passes import old_log_prob_pass
from verl.trainer.rl.reward_loop import build_overlap, build_training_reward
from verl.trainer.rl.samples import generation_samples, write_samples
from verl.trainer.rl.vision_checks import vision_run_config
from verl.workers.common import release_private_process_group

logger = logging.getLogger(__name__)

RewardFn = Callable[[DataProto], tuple[torch.Tensor, dict[str, Any], dict[str, Any]]]


class RLTrainer:
    """PPO-family trainer driven by one :class:`~verl.config.TrainerConfig`.

    Args:
        config: the validated run configuration.
        reward_fn: callable ``batch -> (token_level_scores, metrics, extras)``; by default a
            :class:`~verl.rewards.RewardManager` over the built-in scorers (or the
            ``custom_reward_function`` from the config).
        val_reward_fn: the same for validation (default: like ``reward_fn`` but without
            normalisation or clipping, so accuracy is comparable across runs).
        tracker: where metrics go (default: built from ``trainer.logger``).
        actor_module / critic_module: already-built ``nn.Module`` objects to train instead
            of loading ``actor_rollout_ref.model.path`` / ``critic.model.path``.
        tokenizer: a tokenizer to use instead of loading one from the model path. With an
            ``actor_module`` and no tokenizer: the configured model path's, else the one saved
            where the module was loaded from (its ``name_or_path``); a module and tokenizer
            from different sources are refused (:func:`verl.trainer.rl.build.module_tokenizer`).
    """

    def __init__(
        self,
        config: TrainerConfig,
        *,
        reward_fn: RewardFn | None = None,
        val_reward_fn: RewardFn | None = None,
        tracker: Tracker | None = None,
        actor_module: torch.nn.Module | None = None,
        critic_module: torch.nn.Module | None = None,
        tokenizer: Any = None,
    ) -> None:
        # set_device_map(dp_config) called alone: its map, for a config naming no devices
        config = apply_pending_device_map(config)
        config.validate()  # registry-backed keys against the live registries (user entries too)
        check_supported(config)
        config = vision_run_config(config)  # a vision-language actor: refused / adjusted keys
        self.config = cfg = config
        seed_everything(cfg.trainer.seed)
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        self.run_dir, self.ckpt_dir = resolve_run_dirs(cfg)
        self.rollout_data_dir, self.validation_data_dir = resolve_sample_dirs(cfg)
        self.profiler = StepProfiler(cfg.trainer.profile_steps, self.run_dir)
        # one-step-off and streaming sample with older weights on purpose
        self._gap_watch = None if cfg.trainer.async_rollout else RolloutGapWatch()
        # One run per directory: fail now if another run holds them; fit() takes the lock.
        self.run_lock = RunLock([self.ckpt_dir, self.run_dir])
        self._stop = StopRequests()
        self.run_lock.check()

        self.use_critic = cfg.critic_enabled  # critic.enable, or the estimator's needs_critic
        self.use_reference = cfg.ref_enabled
        self.old_log_prob_pass = old_log_prob_pass(cfg)

        # The parts of the run (verl.trainer.rl.build), built in this order.
        # with an actor module object, the module's own tokenizer (never the default model's)
        self.tokenizer = tokenizer = build_tokenizer(cfg, tokenizer, actor_module)
        data = build_data(cfg, tokenizer, self.run_dir)
        self.train_dataset, self.val_dataset = data.train_dataset, data.val_dataset
        self.collate, self.train_loader = data.collate, data.train_loader
        self.total_steps = data.total_steps
        compute_score = load_compute_score(cfg)
        self.reward_fn = reward_fn or self.build_reward_manager(compute_score, train=True)
        self.val_reward_fn = val_reward_fn or self.build_reward_manager(compute_score, train=False)
        # a data_source without a scorer fails now, before any model loads
        check_data_sources(
            cfg, self.train_dataset, self.val_dataset, self.reward_fn, self.val_reward_fn
        )
        self.kl_ctrl = build_kl_controller(cfg)
        # async: the rollout copy starts from the actor's initial module, copied before any update
        async_module = (
            copy.deepcopy(actor_module)
            if cfg.trainer.async_rollout and actor_module is not None
            else None
        )
        self.placement = build_roles(
            cfg,
            use_reference=self.use_reference,
            use_critic=self.use_critic,
            tokenizer=tokenizer,
            total_steps=self.total_steps,
            actor_module=actor_module,
            critic_module=critic_module,
        )
        self.actor_rollout_wg = self.placement.roles["actor_rollout_ref"]
        self.critic_wg = self.placement.roles.get("critic")
        self.rm_wg = self.placement.roles.get("reward_model")
        self.teacher = teacher_scorer(cfg, self.placement.roles)  # algorithm.distill
        try:  # the reward model, judge, scoring service or their mixture, shaped as rules
            self.reward_fn = build_training_reward(cfg, tokenizer, self.reward_fn, self.rm_wg)
            self.reward_overlap = build_overlap(cfg, self.reward_fn)  # reward_model.overlap
        except BaseException:
            self.placement.shutdown()
            raise
        self.async_rollout: AsyncRollout | None = None  # trainer.async_rollout (.async_rollout)
        if cfg.trainer.async_rollout:
            try:
                self.async_rollout = build_async_rollout(
                    cfg,
                    tokenizer,
                    async_module,
                    lambda group, prompts: self._generate(prompts, group),
                    self.actor_rollout_wg,
                    self.placement,
                )
            except BaseException:
                self.placement.shutdown()
                raise
        self.batch_source = build_batch_source(
            cfg,
            # late-bound: a subclass or test that replaces a phase changes what runs
            generate_and_score=lambda prompts: self.generate_and_score(prompts),
            score=lambda gen, metrics, prompts=None: self.score_responses(gen, metrics, prompts),
            pipeline=self.async_rollout,
            version=lambda: self.global_step - 1,
            pad_token_id=tokenizer.pad_token_id,
        )  # the steps algorithm.distill.fixed_fraction picks: the data's fixed responses
        self.batch_source = mixed_distill_source(cfg, self.batch_source, tokenizer, self)

        self.tracker = tracker or Tracker(
            cfg.trainer.logger,
            log_dir=self.run_dir,
            project=cfg.trainer.project_name,
            experiment=cfg.trainer.experiment_name,
            config=to_dict(cfg),
        )
        self.global_step = 0
        self.history: list[dict[str, Any]] = []
        self.validation_history: list[dict[str, Any]] = []
        self.checkpoints = CheckpointManager(self.ckpt_dir, cfg.trainer.max_ckpt_to_keep)
        self.resumed_from: Path | None = None
        self.last_checkpoint: Path | None = None
        self._resume_checked = False
        self._batches: Any = None  # the loader's batches, epoch after epoch (run_step)

    # ------------------------------------------------------------------ setup helpers
    @property
    def reward_fn(self) -> RewardFunction:
        """The training reward, in the one reward contract (:mod:`verl.rewards.contract`);
        any callable assigned here (``batch -> (scores, metrics, extras)``) is wrapped into
        it, so the step never asks which kind of reward it holds."""
        return self._reward_fn

    @reward_fn.setter
    def reward_fn(self, fn: RewardFn | RewardFunction) -> None:
        self._reward_fn = as_reward_function(fn)

    @property
    def val_reward_fn(self) -> RewardFunction:
        """The validation reward (raw scores), in the same contract as :attr:`reward_fn`."""
        return self._val_reward_fn

    @val_reward_fn.setter
    def val_reward_fn(self, fn: RewardFn | RewardFunction) -> None:
        self._val_reward_fn = as_reward_function(fn)

    def build_reward_manager(self, compute_score: Callable[..., Any] | None, train: bool):
        """A reward manager over ``compute_score`` (default: the built-in scorers); see
        :func:`verl.trainer.rl.build.build_reward_manager`."""
        return build_reward_manager(self.config, self.tokenizer, compute_score, train)

    @property
    def checkpointer(self) -> RunCheckpointer:
        """The run's stateful parts as they are now, composed for saving and loading
        (a subclass may replace ``reward_fn`` after construction)."""
        roles = {"actor_rollout_ref": self.actor_rollout_wg}
        if self.critic_wg is not None:
            roles["critic"] = self.critic_wg
        return RunCheckpointer(
            self.config,
            self.checkpoints,
            progress=self,
            components={
                "dataloader": self.train_loader,
                "kl_ctrl": self.kl_ctrl,
                "reward_fn": self.reward_fn,
                "val_reward_fn": self.val_reward_fn,
                **({} if self.async_rollout is None else {"async_rollout": self.async_rollout}),
            },
            roles=roles,
        )

    # ------------------------------------------------------------------ the algorithm
    def collect_data(self, batch: DataProto) -> tuple[DataProto, dict[str, Any]]:
        """Rollout, scoring and advantages for one batch of prompts.

        Returns ``(responses, metrics)``: the batch of ``len(batch) * rollout.n`` responses
        with every tensor the updates need (``old_log_probs`` always, for callers that read
        them, ``advantages``, ``returns`` ...) and the metrics of these phases.
        """
        gen, metrics = self.generate_and_score(batch)
        gen, more = self.prepare_update(gen)
        return gen, metrics | more

    def generate_and_score(self, batch: DataProto) -> tuple[DataProto, dict[str, Any]]:
        """Sample ``rollout.n`` responses per prompt and score them.

        Returns ``(responses, metrics)``. The responses gain ``token_level_scores``, the
        group id ``uid`` (one per prompt), the scorer's per-response ``score`` and ``acc``
        (NaN where it reports none) and, for ReMax, ``reward_baselines``.
        """
        metrics: dict[str, Any] = {}
        # One id per prompt: the n responses of a prompt share it (the GRPO group).
        batch.non_tensor_batch["uid"] = np.array(
            [str(uuid.uuid4()) for _ in range(len(batch))], dtype=object
        )
        with timer("gen", metrics):  # with reward_model.overlap, chunks are scored meanwhile
            overlap = self.reward_overlap
            gen = overlap.generate(self._generate, batch) if overlap else self._generate(batch)
        return self.score_responses(gen, metrics, prompts=batch)

    def score_responses(
        self, gen: DataProto, metrics: dict[str, Any], prompts: DataProto | None = None
    ) -> tuple[DataProto, dict[str, Any]]:
        """Score the responses ``gen`` (see :meth:`generate_and_score`), adding to
        ``metrics``; ReMax's greedy baseline regenerates from ``prompts``."""
        with timer("reward", metrics):
            scores, reward_metrics, extras = self.reward_fn(gen, update_stats=True)
            metrics |= reward_metrics
            gen.batch["token_level_scores"] = scores
            for key in ("score", "acc"):
                values = extras.get(key, np.full(len(gen), np.nan))
                gen.non_tensor_batch[key] = np.asarray(values, dtype=np.float64)
        if self.config.estimator_needs("needs_baseline"):
            # ReMax: the greedy response's score, from the same scorer and shaping, is the
            # baseline of the n sampled responses of its prompt.
            if prompts is None:
                raise ValueError("score_responses: the greedy baseline needs the prompts")
            with timer("gen_greedy_baseline", metrics):
                greedy = self._generate(validation.with_meta(prompts, do_sample=False, n=1))
                baseline, _, _ = self.reward_fn(greedy, update_stats=False)
            n = len(gen) // len(prompts)
            gen.batch["reward_baselines"] = baseline.sum(-1).repeat_interleave(n)
        return gen, metrics

    def _generate(self, prompts: DataProto, group: Any = None) -> DataProto:
        """The rollout of ``prompts`` with their per-sample fields joined back on, by the
        actor's worker group (or ``group``: the asynchronous rollout copy).

        Only the prompt tensors cross to the workers (``generate_sequences`` reads nothing
        else); the ground truths, data sources, group ids ... stay here and are repeated
        like the rollout repeats rows (``repeat_interleave``, ``n`` samples per prompt).
        """
        gen = (self.actor_rollout_wg if group is None else group).generate_sequences(prompts)
        n, rest = divmod(len(gen), len(prompts))
        if rest:
            raise ValueError(
                f"generate_sequences returned {len(gen)} rows for {len(prompts)} prompts"
            )
        kept = prompts.select(
            batch_keys=[k for k in prompts.batch if k not in gen.batch],
            non_tensor_keys=[k for k in prompts.non_tensor_batch if k not in gen.non_tensor_batch],
            meta_keys=[],
        )
        if kept.batch or kept.non_tensor_batch:
            gen.union(kept.repeat(n, interleave=True))
        return gen

    def prepare_update(
        self, gen: DataProto, old_log_prob_pass: bool = True
    ) -> tuple[DataProto, dict[str, Any]]:
        """Old, reference and teacher log-probs, values, the in-reward KL and advantages of
        ``gen`` (the teacher's with ``algorithm.distill.enable``).

        ``gen`` comes from :meth:`generate_and_score` (possibly filtered by dynamic
        sampling). Returns ``(gen with those tensors, the metrics of these phases)``. The
        training loop passes ``old_log_prob_pass=self.old_log_prob_pass`` (``.passes``).
        """
        cfg = self.config
        metrics: dict[str, Any] = {}
        if old_log_prob_pass:  # else the update's own log-probs are the old ones
            with timer("old_log_prob", metrics):
                gen = gen.union(self.actor_rollout_wg.compute_log_prob(gen))
            if "rollout_log_probs" in gen.batch:
                metrics |= compute_rollout_mismatch_metrics(gen)
        # Reference log-probs and values only read `gen`: submitted together, they run at
        # the same time when the critic has a pool of its own.
        with timer("ref_and_values", metrics):
            pending = []
            if self.use_reference:
                pending.append(self.actor_rollout_wg.compute_ref_log_prob.submit(gen))
            if self.teacher is not None:  # distillation: colocated or separate (.distill_pool)
                pending.append(self.teacher.submit(gen))
            if self.critic_wg is not None:
                pending.append(self.critic_wg.compute_values.submit(gen))
            for future in pending:
                gen = gen.union(future.result())
        scores = gen.batch["token_level_scores"]
        if cfg.algorithm.use_kl_in_reward:
            rewards, kl_metrics = apply_kl_penalty(
                scores,
                gen.batch["old_log_probs"],
                gen.batch["ref_log_probs"],
                gen.batch["response_mask"],
                kl_ctrl=self.kl_ctrl,
                kind=cfg.algorithm.kl_penalty,
            )
            metrics |= kl_metrics
        else:
            rewards = scores
        gen.batch["token_level_rewards"] = rewards
        with timer("adv", metrics):
            compute_advantages(gen, cfg)
        return gen, metrics

    def update_policy(self, gen: DataProto) -> dict[str, Any]:
        """Critic then actor updates on a batch from :meth:`collect_data`; the actor waits
        for the first ``trainer.critic_warmup`` steps of the loop (``global_step`` 1..N; the
        step-by-step API, which leaves ``global_step`` at 0, always updates both)."""
        metrics: dict[str, Any] = {}
        if self.critic_wg is not None:
            with timer("update_critic", metrics):
                metrics |= self.critic_wg.update_critic(gen)
        if 0 < self.global_step <= self.config.trainer.critic_warmup:
            metrics["actor/critic_warmup"] = 1.0
            return metrics
        with timer("update_actor", metrics):
            metrics |= self.actor_rollout_wg.update_actor(gen)
        return metrics

    # ------------------------------------------------------------------ the step
    def train_step(
        self, batch: DataProto, next_batch: Callable[[], DataProto] | None = None
    ) -> dict[str, Any]:
        """One RL step from the prompt batch ``batch``; returns its metrics.

        ``next_batch`` draws further prompt batches from the loader, for the batch sources
        that need more than one (dynamic sampling, filling the asynchronous queue).
        """
        start = time.perf_counter()
        # responses, scored: how they were made is the batch source's business
        draw = draws(batch, next_batch, "the batch source")
        gen, metrics = self.batch_source.next(draw)
        # old and reference log-probs, values, the in-reward KL, advantages
        gen, more = self.prepare_update(gen, self.old_log_prob_pass)
        metrics |= more
        if self.config.algorithm.use_pf_ppo:  # PF-PPO: redraw the responses by score
            gen, more = pf_ppo_redraw(gen, self.config, self.global_step)
            metrics |= more
        metrics |= self.update_policy(gen)  # critic, then actor
        metrics |= distill_kind_metrics(metrics)  # the distillation loss by kind of rows
        step_seconds = time.perf_counter() - start
        metrics["timing_s/step"] = step_seconds
        if self.rollout_data_dir is not None:  # outside the step's time
            scores = gen.batch["token_level_scores"].sum(-1).tolist()
            rows = generation_samples(gen, scores, self.tokenizer, len(gen))
            write_samples(self.rollout_data_dir, self.global_step, rows)
        metrics |= compute_data_metrics(gen, self.config.data.max_response_length)
        metrics |= compute_throughput_metrics(gen, step_seconds)
        return metrics

    # ------------------------------------------------------------------ the run
    def fit(self) -> dict[str, Any]:
        """Train for ``total_steps`` steps; returns the last step's metrics and validation
        (:func:`verl.trainer.lifecycle.driver.run`: resume, validate, train, validate, export; a
        resumed run skips ``val_before_train``: the run it continues validated already, and
        a sampled validation here would move the random streams the continuation shares)."""
        return driver.run(self)

    # the driver's hooks (verl.trainer.lifecycle.driver.Trainee)
    is_main_rank = True

    def run_step(self) -> dict[str, Any]:
        """Step ``global_step`` from the loader's next batches, profiled when asked
        (``trainer.profile_steps``), with the data position's metrics."""
        if self._batches is None:  # epoch after epoch; every batch drawn advances the loader
            self._batches = driver.epochs(self.train_loader)
        batches = self._batches
        step = lambda: self.train_step(next(batches), lambda: next(batches))  # noqa: E731
        metrics = self.profiler.run(self.global_step, step)  # trace, stage table
        metrics["training/epoch"] = self.train_loader.epoch
        if self._gap_watch is not None:
            self._gap_watch(metrics, self.global_step)
        # Prompts over data.max_prompt_length removed / shortened at load (data.truncation).
        metrics["data/dropped_prompts"] = float(self.train_dataset.num_dropped)
        metrics["data/truncated_prompts"] = float(self.train_dataset.num_truncated)
        return metrics

    def step_health(self) -> StepHealth:
        """Non-finite actor losses and finite divergence (:mod:`verl.trainer.lifecycle.stopping`)."""
        return StepHealth(
            loss_not_finite, diverged_error, DivergenceGuard.from_config(self.config.trainer)
        )

    def has_validation(self) -> bool:
        return self.val_dataset is not None

    def stop_requests(self) -> StopRequests:
        return self._stop

    def stop_signum(self) -> int | None:
        return self._stop.signum

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.tracker.log(metrics, step=step)

    def export(self) -> dict[str, Any]:
        """The actor as a HF directory in ``{default_local_dir}/huggingface``; a failed
        export saves a checkpoint instead (:mod:`verl.trainer.lifecycle.final_export`)."""
        model = self.config.actor_rollout_ref.model
        return final_export.export_final_model(
            self, self.ckpt_dir, final_export.estimated_export_bytes(model), what="the actor"
        )

    # ------------------------------------------------------------------ validation
    def validate(self) -> dict[str, float]:
        """Greedy (``rollout.val_kwargs``) generation on ``data.val_files``, scored by the
        validation reward (:func:`verl.trainer.rl.validation.validate`); the
        ``trainer.log_val_generations`` rows go to the tracker as a table."""
        if self.val_dataset is None:
            return {}
        metrics, table = validation.validate(
            self.config,
            self.val_dataset,
            self.collate,
            self._generate,
            self.val_reward_fn,
            self.tokenizer,
            stop=self._stop,
            sample_dir=self.validation_data_dir,
            step=self.global_step,
        )
        self.tracker.log_generations(table, step=self.global_step)
        return metrics

    # ------------------------------------------------------------------ checkpoints
    def resume(self) -> Path | None:
        """Load the checkpoint ``trainer.resume_mode`` asks for; returns its path, or None
        for a fresh start. Runs once (``fit`` calls it); temporary directories that
        interrupted saves left in ``default_local_dir`` are removed first."""
        if self._resume_checked:
            return self.resumed_from
        self._resume_checked = True
        with self.run_lock:
            self.checkpoints.clean_stale_temporaries()
            path = resume_checkpoint_path(self.config, self.checkpoints)
            if path is not None:
                self.load_checkpoint(path, verify=False)  # resume_checkpoint_path verified it
            elif self.config.trainer.resume_mode == "auto":
                # No complete checkpoint: the run starts over, so every row an attempt killed
                # before its first checkpoint logged belongs to a rolled-back step.
                self.tracker.rewind(-1)
        return path

    def load_checkpoint(self, path: str | Path, verify: bool = True) -> None:
        """Restore the complete run state saved by :meth:`save_checkpoint` at ``path``
        (every file checked against the manifest's CRC-32 unless ``verify=False``)."""
        self.checkpointer.load(path, verify=verify)
        self.resumed_from = Path(path)
        self._resume_checked = True
        # Metric rows of steps after the checkpoint belong to the rolled-back steps.
        self.tracker.rewind(self.global_step)

    def save_checkpoint(self) -> Path:
        """Save the complete run state after step ``global_step`` to
        ``{trainer.default_local_dir}/global_step_{N}`` (atomically); returns that path."""
        with self.run_lock:
            self.last_checkpoint = self.checkpointer.save(self.global_step)
        return self.last_checkpoint

    def state_dict(self) -> dict[str, Any]:
        """The run's progress (the checkpoint's top-level counters)."""
        return {
            "global_step": self.global_step,
            "total_steps": self.total_steps,
            "epoch": self.train_loader.epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step = int(state["global_step"])

    def close(self) -> None:
        """Release the async rollout, reward processes, loader and role workers, flush
        trackers (idempotent)."""
        if self.async_rollout is not None:
            self.async_rollout.close()
        for fn in (self.reward_overlap, self.reward_fn, self.val_reward_fn, self.train_loader):
            close = getattr(fn, "close", None)
            if close is not None:
                close()
        self.tracker.close()
        self.placement.shutdown()
        release_private_process_group()  # a one-rank FSDP2 run's group in this process
        self.run_lock.release()

    def save_hf(self, out_dir: str | Path) -> Path:
        """Save the actor as a HuggingFace model directory (``from_pretrained``-loadable)."""
        return Path(self.actor_rollout_wg.save_hf(str(out_dir))[0])
