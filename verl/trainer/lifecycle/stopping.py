"""How a run ends early: by a signal, or because its training diverged.

SIGTERM and SIGINT stop a training run cleanly, at the end of the current step; a
validation under way stops at its next batch (:class:`ValidationStopped`) and is not
recorded, and a run stopped before its first step saves nothing.

The first signal asks the run to stop: the step under way finishes, a final checkpoint is
saved when the run saves checkpoints (``trainer.save_freq > 0``), the run's processes are
released, and ``fit()`` raises :class:`RunInterrupted`, which the command-line entry points
turn into exit code 128 + the signal number (143 for SIGTERM, 130 for SIGINT). No
HuggingFace export is written for a stopped run. A second signal stops at once (the same
exception, raised wherever the run is; saves are atomic, so at worst the save under way is
discarded).

Handlers are installed only while a run is in progress and only from the main thread
(Python delivers signals there); elsewhere the process keeps its existing handlers.

A step whose actor update had a non-finite loss is never checkpointed, and one in the
final step ends the run with :func:`diverged_error` (the model it would validate and
export is broken; the previous export stays).

A run can also diverge with finite numbers (a learning rate of 10: the weights grow 28-fold
and the gradient norm reaches 1.6e6, or the policy collapses onto one token). The
:class:`DivergenceGuard` flags a step whose pre-clip gradient norm (actor or critic) is
above ``trainer.divergence_max_grad_norm`` or whose update moved the policy by more than
``trainer.divergence_max_policy_kl`` nats per token (``|actor/approx_kl|``). A flagged step
is never checkpointed, and ``trainer.max_consecutive_divergent_steps`` of them in a row, or
one in the final step, end the run with :class:`TrainingDivergedError` naming the metric,
its bound and the last checkpoint, which holds the last step that was not flagged. The
bounds are orders of magnitude above sane values (docs/reliability.md).
"""

from __future__ import annotations

import logging
import math
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from verl.engine.base import NonFiniteLossError

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by a signal. ``exit_code`` is the conventional 128 + signal number."""

    def __init__(
        self, signum: int, step: int | None, checkpoint: Path | None, during: str | None = None
    ) -> None:
        name = signal.Signals(signum).name
        if during is not None:
            where = f"during {during}"
        else:
            where = f"after step {step}" if step is not None else "in the middle of a step"
        saved = f"; checkpoint: {checkpoint}" if checkpoint is not None else "; no checkpoint"
        super().__init__(f"run stopped by {name} {where}{saved}")
        self.signum = signum
        self.step = step
        self.checkpoint = checkpoint
        self.exit_code = 128 + signum


class ValidationStopped(Exception):
    """A stop signal arrived during a validation: raised between its batches, so that the
    run does not wait for the rest (the caller decides what is saved)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"validation stopped by {signal.Signals(signum).name}")
        self.signum = signum


class StopRequests:
    """``with StopRequests() as stop:`` ... ``if stop.requested: ...`` (see module doc)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None:
            raise RunInterrupted(signum, step=None, checkpoint=None)
        self.signum = signum
        logger.warning(
            "%s received: stopping after the current step (send it again to stop now)",
            signal.Signals(signum).name,
        )

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def loss_not_finite(metrics: dict[str, Any]) -> bool:
    """Whether a step's actor update had a non-finite loss (``actor/nonfinite_loss_steps``)."""
    return metrics.get("actor/nonfinite_loss_steps", 0.0) > 0


def nonfinite_error(
    step: int, loss: str, metric: str, metrics: dict[str, Any], checkpoint: Path | None, fix: str
) -> NonFiniteLossError:
    """The error that ends a run whose final step's ``loss`` was not finite (``metric``
    shows it); ``fix`` says what to change."""
    kept = f"the last checkpoint is {checkpoint}" if checkpoint else "no checkpoint was saved"
    return NonFiniteLossError(
        f"{loss} was not finite in the final step {step} ({metric}={metrics.get(metric)}): "
        f"the training diverged, so the model is neither validated nor exported; {kept}. "
        f"{fix}"
    )


def diverged_error(step: int, metrics: dict[str, Any], checkpoint: Path | None) -> Exception:
    """The error that ends an RL run whose final step's actor loss was not finite."""
    return nonfinite_error(
        step,
        "the actor's loss",
        "actor/nonfinite_loss_steps",
        metrics,
        checkpoint,
        "Lower actor_rollout_ref.actor.optim.lr (and check weight_decay) or clip gradients harder.",
    )


class TrainingDivergedError(RuntimeError):
    """Training diverged while its numbers stayed finite (see :class:`DivergenceGuard`)."""


@dataclass
class DivergenceGuard:
    """Flags steps whose metrics show a finite divergence and counts them in a row.

    Args:
        max_grad_norm: bound on ``actor/grad_norm`` and ``critic/grad_norm`` (pre-clip
            global L2 norms); 0 = not checked.
        max_policy_kl: bound on ``|actor/approx_kl|``, the mean per-token KL (nats) between
            the policy that sampled the batch and the one the update left; 0 = not checked.
            It is 0 by construction when the update is one optimizer step (one mini-batch,
            one epoch), so then only the gradient norm is checked.
        patience: flagged steps in a row that stop the run (>= 1).
    """

    max_grad_norm: float
    max_policy_kl: float
    patience: int = 1
    streak: int = 0

    @classmethod
    def from_config(cls, run: Any) -> DivergenceGuard:
        """The guard of a ``trainer:`` section."""
        return cls(
            run.divergence_max_grad_norm,
            run.divergence_max_policy_kl,
            run.max_consecutive_divergent_steps,
        )

    def check(self, metrics: dict[str, Any]) -> str | None:
        """Why the step of ``metrics`` looks diverged (None when it does not); counts the
        flagged steps in a row. Non-finite values are the non-finite guard's business."""
        reasons = []
        if self.max_grad_norm > 0:
            for role in ("actor", "critic"):
                norm = metrics.get(f"{role}/grad_norm")
                if norm is not None and math.isfinite(norm) and norm > self.max_grad_norm:
                    reasons.append(
                        f"{role}/grad_norm={norm:.4g} > "
                        f"trainer.divergence_max_grad_norm={self.max_grad_norm:g}"
                    )
        kl = metrics.get("actor/approx_kl")
        if (
            self.max_policy_kl > 0
            and kl is not None
            and math.isfinite(kl)
            and abs(kl) > self.max_policy_kl
        ):
            reasons.append(
                f"|actor/approx_kl|={abs(kl):.4g} > "
                f"trainer.divergence_max_policy_kl={self.max_policy_kl:g}"
            )
        self.streak = self.streak + 1 if reasons else 0
        return "; ".join(reasons) or None

    @property
    def tripped(self) -> bool:
        """Whether the flagged steps in a row reached ``patience``."""
        return self.streak >= self.patience


def divergence_error(
    step: int, reason: str, guard: DivergenceGuard, checkpoint: Path | None
) -> TrainingDivergedError:
    """The error that ends a run the :class:`DivergenceGuard` flagged at ``step``."""
    kept = (
        f"the last checkpoint, of a step before the divergence, is {checkpoint}"
        if checkpoint
        else "no checkpoint was saved before it"
    )
    return TrainingDivergedError(
        f"training diverged at step {step}: {reason} ({guard.streak} step(s) in a row; "
        f"trainer.max_consecutive_divergent_steps={guard.patience}). The flagged steps were "
        f"not saved and the model is neither validated nor exported; {kept}. Lower "
        "actor_rollout_ref.actor.optim.lr (or critic.optim.lr), check the reward scale, or "
        "raise the bound (0 turns the check off) if the run is known to be sane."
    )


class StepHealth:
    """Whether a finished step may be saved and the run go on, from its metrics.

    Args:
        nonfinite: whether the step's update had a non-finite loss (its optimizer step was
            skipped, :mod:`verl.engine.base`).
        nonfinite_error: the error that ends a run whose final step was non-finite
            (``(step, metrics, last checkpoint) -> Exception``).
        guard: the finite-divergence check, or None.
    """

    def __init__(
        self,
        nonfinite: Callable[[dict[str, Any]], bool],
        nonfinite_error: Callable[[int, dict[str, Any], Path | None], Exception],
        guard: DivergenceGuard | None = None,
    ) -> None:
        self.nonfinite = nonfinite
        self.nonfinite_error = nonfinite_error
        self.guard = guard

    def check(
        self, step: int, metrics: dict[str, Any], last: bool, checkpoint: Path | None
    ) -> tuple[str | None, Exception | None]:
        """``(why the step must not be saved or None, the error that ends the run now or
        None)``; a non-finite final step and a tripped guard end it."""
        broken = self.nonfinite(metrics)
        diverging = self.guard.check(metrics) if self.guard is not None else None
        if diverging is not None:
            logger.warning("step %d looks diverged: %s", step, diverging)
        if broken and last:
            return "non-finite loss", self.nonfinite_error(step, metrics, checkpoint)
        if diverging is not None and (self.guard.tripped or last):
            return "looks diverged", divergence_error(step, diverging, self.guard, checkpoint)
        if broken:
            return "non-finite loss, not checkpointed", None
        if diverging is not None:
            return "looks diverged, not checkpointed", None
        return None, None
