"""The training loop of :class:`~verl.trainer.ppo_trainer.RLTrainer`: what drives the parts.

``RLTrainer`` builds the parts of a run and holds the phases of one step (rollout, scoring,
log-prob passes, advantages, updates); this module runs them in order::

    fit(trainer):      resume, validate before training, train_loop, validate, export
    train_loop:        for each step: train_step, log, validate, checkpoint, stop on signal
    train_step:        collect the step's data (dynamic sampling, PF-PPO), update, metrics

Every call goes through the trainer's attributes (``trainer.train_step``,
``trainer.update_policy`` ...), so a subclass or a test that replaces one of them changes
what the loop runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from verl.algorithms.pf_ppo import pf_ppo_indices
from verl.protocol import DataProto
from verl.trainer.dynamic_sampling import collect_informative_groups
from verl.trainer.metrics import compute_data_metrics, compute_throughput_metrics, timer
from verl.trainer.progress import advance
from verl.trainer.samples import generation_samples, write_samples
from verl.trainer.stopping import RunInterrupted, diverged_error, loss_not_finite

if TYPE_CHECKING:
    from verl.trainer.ppo_trainer import RLTrainer

logger = logging.getLogger(__name__)

__all__ = [
    "async_generated",
    "batch_stream",
    "collect_step_data",
    "fit",
    "train_loop",
    "train_step",
    "validate_and_log",
    "validate_only",
]


def fit(trainer: RLTrainer) -> dict[str, Any]:
    """Train for ``total_steps`` steps; returns the last step's metrics and validation.

    First resumes as ``trainer.resume_mode`` says (a resumed run skips
    ``val_before_train``: the run it continues validated already, and a sampled
    validation here would move the random streams the continuation must share).
    """
    cfg = trainer.config.trainer
    results: dict[str, Any] = {}
    progress = None
    try:
        trainer.run_lock.acquire()  # released by close()
        trainer._stop.__enter__()  # SIGTERM / SIGINT: stop after the current step
        trainer.resume()
        if cfg.val_only:
            return validate_only(trainer)
        if cfg.val_before_train and trainer.val_dataset is not None:
            if trainer.resumed_from is None:
                results["val_before"] = validate_and_log(trainer, step=0)
            else:
                logger.info("resumed at step %d: val_before_train skipped", trainer.global_step)
        progress = tqdm(
            total=trainer.total_steps,
            initial=trainer.global_step,
            desc="training",
            unit="step",
            dynamic_ncols=True,
        )
        trainer._train_loop(progress)
        if trainer.val_dataset is not None and (
            not trainer.validation_history
            or trainer.validation_history[-1]["step"] != trainer.global_step
        ):
            validate_and_log(trainer, trainer.global_step)
        results["last_metrics"] = trainer.history[-1] if trainer.history else {}
        if trainer.validation_history:
            results["val_after"] = {
                k: v for k, v in trainer.validation_history[-1].items() if k != "step"
            }
        if trainer.last_checkpoint is not None:
            results["checkpoint"] = str(trainer.last_checkpoint)
        results["hf_dir"] = str(trainer.save_hf(trainer.ckpt_dir / "huggingface"))
    finally:
        trainer._stop.__exit__()
        if progress is not None:
            progress.close()
        trainer.close()
    return results


def validate_only(trainer: RLTrainer) -> dict[str, Any]:
    """``trainer.val_only``: one validation of the model as resumed (or as loaded), logged
    at its step; no training, no checkpoint, no export."""
    if trainer.val_dataset is None:
        raise ValueError(
            "trainer.val_only=true needs validation data: set data.val_files (or the "
            "built-in data's data.arithmetic.val_size > 0)"
        )
    val = validate_and_log(trainer, trainer.global_step)
    return {"val_only": val, "resumed_from": trainer.resumed_from}


def validate_and_log(trainer: RLTrainer, step: int) -> dict[str, float]:
    """A validation outside the step loop: recorded in ``validation_history`` and logged at
    ``step``; returns its metrics."""
    val = trainer.validate()
    trainer.validation_history.append({"step": step, **val})
    trainer.tracker.log(val, step=step)
    return val


def train_loop(trainer: RLTrainer, progress: tqdm) -> None:
    """Steps ``global_step + 1 .. total_steps``: each trained, logged, validated every
    ``test_freq`` steps and checkpointed every ``save_freq`` steps (and when a stop signal
    arrived, after which :class:`RunInterrupted` ends the run)."""
    cfg = trainer.config.trainer
    batches = trainer._batch_stream()
    while trainer.global_step < trainer.total_steps:
        trainer.global_step += 1
        step = lambda: trainer.train_step(next(batches), lambda: next(batches))  # noqa: E731
        metrics = trainer.profiler.run(trainer.global_step, step)  # trace, stage table
        metrics["training/epoch"] = trainer.train_loader.epoch
        # Prompts over data.max_prompt_length removed / shortened at load (data.truncation).
        metrics["data/dropped_prompts"] = float(trainer.train_dataset.num_dropped)
        metrics["data/truncated_prompts"] = float(trainer.train_dataset.num_truncated)
        last = trainer.global_step == trainer.total_steps
        if cfg.test_freq > 0 and (trainer.global_step % cfg.test_freq == 0 or last):
            with timer("testing", metrics):
                val = trainer.validate()
            metrics |= val
            trainer.validation_history.append({"step": trainer.global_step, **val})
        trainer.tracker.log(metrics, step=trainer.global_step)
        trainer.history.append(metrics)
        advance(progress, metrics)
        broken = loss_not_finite(metrics)  # never checkpointed; the end if final
        if broken and last:
            raise diverged_error(trainer.global_step, metrics, trainer.last_checkpoint)
        if cfg.save_freq > 0 and (
            trainer.global_step % cfg.save_freq == 0 or last or trainer._stop.requested
        ):
            if broken:
                logger.warning("step %d: non-finite actor loss, not saved", trainer.global_step)
            else:
                trainer.save_checkpoint()
        if trainer._stop.requested:
            saved = trainer.last_checkpoint if cfg.save_freq > 0 else None
            raise RunInterrupted(trainer._stop.signum, trainer.global_step, saved)


def batch_stream(trainer: RLTrainer) -> Iterator[DataProto]:
    """Training prompt batches, epoch after epoch. Every batch drawn (dynamic sampling's
    extra ones too) advances the loader: its state points after the last one used."""
    while True:
        yield from trainer.train_loader


def train_step(
    trainer: RLTrainer, batch: DataProto, next_batch: Callable[[], DataProto] | None = None
) -> dict[str, Any]:
    """Collect one step's data from ``batch``, update critic and actor; return metrics.

    ``next_batch`` draws further prompt batches from the loader: DAPO dynamic sampling
    (``algorithm.filter_groups``) uses it when ``batch`` alone has too few informative
    groups.
    """
    start = time.perf_counter()
    gen, metrics = trainer._collect_step_data(batch, next_batch)
    algo = trainer.config.algorithm
    if algo.use_pf_ppo:  # PF-PPO: redraw the responses by score
        scores = gen.batch["token_level_scores"].sum(-1)
        seed = trainer.config.trainer.seed * 1_000_003 + trainer.global_step
        rows, pf_metrics = pf_ppo_indices(
            scores, algo.pf_ppo.reweight_method, algo.pf_ppo.weight_pow, seed=seed
        )
        gen, metrics = gen[rows], metrics | pf_metrics
    metrics |= trainer.update_policy(gen)
    step_seconds = time.perf_counter() - start
    metrics["timing_s/step"] = step_seconds
    if trainer.rollout_data_dir is not None:  # outside the step's time
        scores = gen.batch["token_level_scores"].sum(-1).tolist()
        rows = generation_samples(gen, scores, trainer.tokenizer, len(gen))
        write_samples(trainer.rollout_data_dir, trainer.global_step, rows)
    metrics |= compute_data_metrics(gen, trainer.config.data.max_response_length)
    metrics |= compute_throughput_metrics(gen, step_seconds)
    return metrics


def collect_step_data(
    trainer: RLTrainer, batch: DataProto, next_batch: Callable[[], DataProto] | None
) -> tuple[DataProto, dict[str, Any]]:
    """:meth:`RLTrainer.collect_data`, or with dynamic sampling, only informative prompt
    groups; the old-log-prob pass as ``trainer.old_log_prob_pass`` says."""
    fg = trainer.config.algorithm.filter_groups
    if trainer.async_rollout is not None:
        gen, metrics = async_generated(trainer, batch, next_batch)
        gen, metrics = trainer.score_responses(gen, metrics)
    elif not fg.enable:
        gen, metrics = trainer.generate_and_score(batch)
    elif next_batch is None:
        raise ValueError(
            "algorithm.filter_groups.enable=true: train_step needs next_batch to draw "
            "more prompt batches"
        )
    else:
        gen, metrics = collect_informative_groups(
            batch,
            next_batch,
            trainer.generate_and_score,
            metric=fg.metric,
            num_prompts=trainer.config.data.train_batch_size,
            max_num_gen_batches=fg.max_num_gen_batches,
            pad_token_id=trainer.tokenizer.pad_token_id,
        )
    gen, more = trainer.prepare_update(gen, trainer.old_log_prob_pass)
    return gen, metrics | more


def async_generated(
    trainer: RLTrainer, batch: DataProto, next_batch: Callable[[], DataProto] | None
) -> tuple[DataProto, dict[str, Any]]:
    """``trainer.async_rollout=true``: queue ``batch`` (and, at the start, more from
    ``next_batch``) for generation with the current weights, and return the oldest queued
    batch's responses to train on now (:mod:`verl.trainer.async_rollout`)."""
    pipe = trainer.async_rollout
    version = trainer.global_step - 1  # actor updates so far: this step trains on v_{k-1}
    drawn = [batch]

    def next_prompts() -> DataProto:
        if drawn:
            return drawn.pop()
        if next_batch is None:
            raise ValueError("trainer.async_rollout: train_step needs next_batch to fill the queue")
        return next_batch()

    pipe.fill(next_prompts, version)
    metrics: dict[str, Any] = {}
    with timer("gen", metrics):  # the wait for the rollout thread (it generated meanwhile)
        gen, more = pipe.pop(version)
    return gen, metrics | more
