"""The training loop of :class:`~verl.trainer.ppo_trainer.RLTrainer`: what drives the parts.

``RLTrainer`` builds the parts of a run and holds the phases of one step (rollout, scoring,
log-prob passes, advantages, updates); this module runs them in order::

    fit(trainer):      resume, validate before training, train_loop, validate, export
    train_loop:        for each step: trainer.train_step, log, validate, checkpoint,
                       stop on signal

The step itself is :meth:`RLTrainer.train_step`; the loop calls it through the trainer, so
a subclass or a test that replaces it changes what the loop runs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from verl.protocol import DataProto
from verl.trainer.final_export import export_final_model
from verl.trainer.metrics import timer
from verl.trainer.progress import advance
from verl.trainer.stopping import (
    DivergenceGuard,
    RunInterrupted,
    ValidationStopped,
    diverged_error,
    divergence_error,
    loss_not_finite,
)

if TYPE_CHECKING:
    from verl.trainer.ppo_trainer import RLTrainer

logger = logging.getLogger(__name__)

__all__ = ["batch_stream", "fit", "train_loop", "validate_and_log", "validate_only"]


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
        if trainer._stop.requested:  # arrived during val_before_train's last batch
            raise RunInterrupted(
                trainer._stop.signum, None, None, during="the validation before training"
            )
        progress = tqdm(
            total=trainer.total_steps,
            initial=trainer.global_step,
            desc="training",
            unit="step",
            dynamic_ncols=True,
        )
        train_loop(trainer, progress)
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
        results |= export_final_model(trainer)  # a failure saves a checkpoint instead
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
    try:
        val = trainer.validate()
    except ValidationStopped as stopped:
        saved = trainer.last_checkpoint if trainer.config.trainer.save_freq > 0 else None
        raise RunInterrupted(
            stopped.signum, step, saved, during=f"the validation at step {step}"
        ) from None
    trainer.validation_history.append({"step": step, **val})
    trainer.tracker.log(val, step=step)
    return val


def train_loop(trainer: RLTrainer, progress: tqdm) -> None:
    """Steps ``global_step + 1 .. total_steps``: each trained, logged, validated every
    ``test_freq`` steps and checkpointed every ``save_freq`` steps (and when a stop signal
    arrived, after which :class:`RunInterrupted` ends the run). A step with a non-finite
    loss or one the :class:`DivergenceGuard` flags is not checkpointed; in the final step,
    or flagged ``max_consecutive_divergent_steps`` times in a row, it ends the run."""
    cfg = trainer.config.trainer
    batches = batch_stream(trainer)
    guard = DivergenceGuard.from_config(cfg)  # finite divergence (stopping module doc)
    while trainer.global_step < trainer.total_steps:
        trainer.global_step += 1
        step = lambda: trainer.train_step(next(batches), lambda: next(batches))  # noqa: E731
        metrics = trainer.profiler.run(trainer.global_step, step)  # trace, stage table
        metrics["training/epoch"] = trainer.train_loader.epoch
        # Prompts over data.max_prompt_length removed / shortened at load (data.truncation).
        metrics["data/dropped_prompts"] = float(trainer.train_dataset.num_dropped)
        metrics["data/truncated_prompts"] = float(trainer.train_dataset.num_truncated)
        last = trainer.global_step == trainer.total_steps
        diverging = guard.check(metrics)  # never checkpointed; the end if tripped or final
        if diverging is not None:
            logger.warning("step %d looks diverged: %s", trainer.global_step, diverging)
        stop_diverged = diverging is not None and (guard.tripped or last)
        if (
            cfg.test_freq > 0
            and (trainer.global_step % cfg.test_freq == 0 or last)
            and not stop_diverged
        ):
            try:
                with timer("testing", metrics):
                    val = trainer.validate()
            except ValidationStopped:  # a stop signal: the stop below saves the step
                logger.warning("step %d: validation stopped, not recorded", trainer.global_step)
            else:
                metrics |= val
                trainer.validation_history.append({"step": trainer.global_step, **val})
        trainer.tracker.log(metrics, step=trainer.global_step)
        trainer.history.append(metrics)
        advance(progress, metrics)
        broken = loss_not_finite(metrics)  # never checkpointed; the end if final
        if broken and last:
            raise diverged_error(trainer.global_step, metrics, trainer.last_checkpoint)
        if stop_diverged:
            raise divergence_error(trainer.global_step, diverging, guard, trainer.last_checkpoint)
        if cfg.save_freq > 0 and (
            trainer.global_step % cfg.save_freq == 0 or last or trainer._stop.requested
        ):
            if broken:
                logger.warning("step %d: non-finite actor loss, not saved", trainer.global_step)
            elif diverging is not None:
                logger.warning("step %d: looks diverged, not saved", trainer.global_step)
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
