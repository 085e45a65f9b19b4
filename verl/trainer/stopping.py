"""How a run ends early: by a signal, or because its training diverged.

SIGTERM and SIGINT stop a training run cleanly, at the end of the current step.

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
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from verl.engine.base import NonFiniteLossError

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by a signal. ``exit_code`` is the conventional 128 + signal number."""

    def __init__(self, signum: int, step: int | None, checkpoint: Path | None) -> None:
        name = signal.Signals(signum).name
        where = f"after step {step}" if step is not None else "in the middle of a step"
        saved = f"; checkpoint: {checkpoint}" if checkpoint is not None else "; no checkpoint"
        super().__init__(f"run stopped by {name} {where}{saved}")
        self.signum = signum
        self.step = step
        self.checkpoint = checkpoint
        self.exit_code = 128 + signum


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


def diverged_error(step: int, metrics: dict[str, Any], checkpoint: Path | None) -> Exception:
    """The error that ends a run whose final step's actor loss was not finite."""
    kept = f"the last checkpoint is {checkpoint}" if checkpoint else "no checkpoint was saved"
    return NonFiniteLossError(
        f"the actor's loss was not finite in the final step {step} "
        f"(actor/nonfinite_loss_steps={metrics['actor/nonfinite_loss_steps']:g}): the "
        f"training diverged, so the model is neither validated nor exported; {kept}. "
        "Lower actor_rollout_ref.actor.optim.lr (and check weight_decay) or clip "
        "gradients harder."
    )
