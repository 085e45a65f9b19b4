"""The run driver: the lifecycle every trainer shares, around the trainer's own step.

RL (:class:`~verl.trainer.rl.trainer.RLTrainer`) and the offline trainers (SFT, DPO / IPO /
KTO, reward models: :class:`~verl.trainer.offline.base.OfflineTrainer`) differ in what one
step does; everything around the step is this module's :func:`run`::

    take the run lock; catch SIGTERM / SIGINT (stop after the current step)
    resume as trainer.resume_mode says
    trainer.val_only: validate once, stop
    validate before training (not when resumed)
    for each remaining step:
        metrics = trainer.run_step()                   # the trainer's step
        health: a non-finite loss or a finite divergence is never checkpointed, and ends
                the run in the final step (or after too many flagged steps in a row)
        validate every trainer.test_freq steps and after the last
        log; advance the progress bar
        checkpoint every trainer.save_freq steps, after the last, and on a stop signal
        a stop signal: raise RunInterrupted after the checkpoint
    validate (unless the last step did); export the model (a failed export saves a
    checkpoint instead: verl.trainer.lifecycle.final_export)
    release the run's processes and the lock

A trainer plays its part through the small :class:`Trainee` protocol below: its step, its
validation, its checkpoints and its export. Several ranks of an SPMD offline run all call
:func:`run`; the trainer's own hooks decide which rank logs and writes.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from tqdm.auto import tqdm

from verl.trainer.lifecycle.metrics import timer
from verl.trainer.lifecycle.progress import advance
from verl.trainer.lifecycle.run_lock import RunLock
from verl.trainer.lifecycle.stopping import (
    RunInterrupted,
    StepHealth,
    StopRequests,
    ValidationStopped,
)

logger = logging.getLogger(__name__)

__all__ = ["Trainee", "epochs", "run"]


class Trainee(Protocol):
    """What the driver needs of a trainer."""

    global_step: int
    total_steps: int
    history: list[dict[str, Any]]
    validation_history: list[dict[str, Any]]
    last_checkpoint: Path | None
    resumed_from: Path | None
    run_lock: RunLock | None  # None on the ranks that do not hold it
    is_main_rank: bool  # logs and shows the progress bar

    @property
    def config(self) -> Any: ...  # its ``trainer:`` section holds the run's schedule

    def stop_requests(self) -> StopRequests | None:
        """The signal handlers to install while the run trains (None: a launcher
        forwards the signals, see :meth:`stop_signum`)."""

    def stop_signum(self) -> int | None:
        """The signal that asked the run to stop after this step, or None."""

    def resume(self) -> Path | None: ...

    def has_validation(self) -> bool: ...

    def validate(self) -> dict[str, float]:
        """Validation metrics; raises :class:`ValidationStopped` on a stop signal."""

    def run_step(self) -> dict[str, Any]:
        """One training step at ``global_step`` (already advanced); its metrics."""

    def step_health(self) -> StepHealth: ...

    def log(self, metrics: dict[str, Any], step: int) -> None: ...

    def save_checkpoint(self) -> Path: ...

    def export(self) -> dict[str, Any]:
        """Write the trained model; the results' ``hf_dir``."""

    def close(self) -> None:
        """Release the run's processes (idempotent)."""


def epochs(loader: Iterable[Any]) -> Iterator[Any]:
    """``loader``'s batches, epoch after epoch (each epoch a new ``iter(loader)``, so a
    resumable loader's position advances with every batch drawn)."""
    return itertools.chain.from_iterable(itertools.repeat(loader))


def run(trainer: Trainee) -> dict[str, Any]:
    """Train ``trainer`` to ``total_steps`` steps; returns ``val_before`` (a fresh run with
    validation), ``last_metrics``, ``val_after``, ``checkpoint`` (the last one saved),
    ``hf_dir``, or with ``trainer.val_only`` ``val_only`` and ``resumed_from``."""
    cfg = trainer.config.trainer
    results: dict[str, Any] = {}
    progress = None
    stop = trainer.stop_requests()
    try:
        if trainer.run_lock is not None:
            trainer.run_lock.acquire()  # released by close()
        if stop is not None:
            stop.__enter__()
        trainer.resume()
        if getattr(cfg, "val_only", False):  # an RL key
            return _validate_only(trainer)
        if cfg.val_before_train and trainer.has_validation():
            if trainer.resumed_from is None:
                val = _validate_and_log(trainer, step=0)
                if val:
                    results["val_before"] = val
            else:
                logger.info("resumed at step %d: val_before_train skipped", trainer.global_step)
        signum = trainer.stop_signum()
        if signum is not None:  # arrived during val_before_train's last batch
            raise RunInterrupted(signum, None, None, during="the validation before training")
        progress = tqdm(
            total=trainer.total_steps,
            initial=trainer.global_step,
            desc="training",
            unit="step",
            dynamic_ncols=True,
            disable=not trainer.is_main_rank,
        )
        _train_loop(trainer, progress)
        if trainer.has_validation() and (
            not trainer.validation_history
            or trainer.validation_history[-1]["step"] != trainer.global_step
        ):
            _validate_and_log(trainer, trainer.global_step)
        results["last_metrics"] = trainer.history[-1] if trainer.history else {}
        if trainer.validation_history:
            results["val_after"] = {
                k: v for k, v in trainer.validation_history[-1].items() if k != "step"
            }
        if trainer.last_checkpoint is not None:
            results["checkpoint"] = str(trainer.last_checkpoint)
        results |= trainer.export()
    finally:
        if stop is not None:
            stop.__exit__()
        if progress is not None:
            progress.close()
        trainer.close()
    return results


def _validate_only(trainer: Trainee) -> dict[str, Any]:
    """One validation of the model as resumed (or as loaded), logged at its step; no
    training, no checkpoint, no export."""
    if not trainer.has_validation():
        raise ValueError(
            "trainer.val_only=true needs validation data: set data.val_files (or the "
            "built-in data's data.arithmetic.val_size > 0)"
        )
    val = _validate_and_log(trainer, trainer.global_step)
    return {"val_only": val, "resumed_from": trainer.resumed_from}


def _validate_and_log(trainer: Trainee, step: int) -> dict[str, float]:
    """A validation outside the step loop: recorded and logged at ``step``."""
    try:
        val = trainer.validate()
    except ValidationStopped as stopped:
        saved = trainer.last_checkpoint if trainer.config.trainer.save_freq > 0 else None
        raise RunInterrupted(
            stopped.signum, step, saved, during=f"the validation at step {step}"
        ) from None
    if val:
        trainer.validation_history.append({"step": step, **val})
        trainer.log(val, step)
    return val


def _train_loop(trainer: Trainee, progress: tqdm) -> None:
    """Steps ``global_step + 1 .. total_steps``, each checked, validated, logged and
    checkpointed on schedule (see the module docstring)."""
    cfg = trainer.config.trainer
    health = trainer.step_health()
    while trainer.global_step < trainer.total_steps:
        trainer.global_step += 1
        step = trainer.global_step
        metrics = trainer.run_step()
        last = step == trainer.total_steps
        unsaved, fatal = health.check(step, metrics, last, trainer.last_checkpoint)
        if unsaved is not None:
            logger.warning("step %d: %s", step, unsaved)
        if cfg.test_freq > 0 and (step % cfg.test_freq == 0 or last) and fatal is None:
            try:
                with timer("testing", metrics):
                    val = trainer.validate()
            except ValidationStopped:  # a stop signal: the stop below saves the step
                logger.warning("step %d: validation stopped, not recorded", step)
            else:
                metrics |= val
                if val:
                    trainer.validation_history.append({"step": step, **val})
        trainer.log(metrics, step)
        trainer.history.append(metrics)
        advance(progress, metrics)
        if fatal is not None:
            raise fatal
        signum = trainer.stop_signum()
        if cfg.save_freq > 0 and (step % cfg.save_freq == 0 or last or signum is not None):
            if unsaved is not None:
                logger.warning("step %d: not saved", step)
            else:
                trainer.save_checkpoint()
        if signum is not None:
            saved = trainer.last_checkpoint if cfg.save_freq > 0 else None
            raise RunInterrupted(signum, step, saved)
