"""The training clock both sides of ``bench_convergence_vs_trl.py`` stop by.

Standard library only: TRL's side imports it in its own virtual environment, where verl is
not installed (a script in ``bench/`` has this directory on ``sys.path``).

The clock starts when training starts and counts wall time, except the time spent inside
:meth:`BudgetClock.paused` (saving a snapshot of the policy at a mark), so that taking
snapshots costs neither side training time. It is read at step boundaries only: a step is
never cut, so a side stops at the first step end at or past the budget, and a mark's
snapshot is taken at the first step end at or past the mark (one snapshot covers every mark
the step passed).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager


class BudgetClock:
    """Training seconds since :meth:`start`, pauses excluded.

    Args:
        budget_s: training stops at the first step end with ``elapsed() >= budget_s``.
        marks_s: training times (seconds, ascending, each in ``(0, budget_s]``) at which a
            snapshot is due.
        now: the time source (seconds); tests pass a fake one.
    """

    def __init__(
        self,
        budget_s: float,
        marks_s: Sequence[float],
        now: Callable[[], float] = time.perf_counter,
    ) -> None:
        if budget_s <= 0:
            raise ValueError(f"budget_s={budget_s}: the training budget must be positive")
        marks = [float(m) for m in marks_s]
        if any(b <= a for a, b in itertools.pairwise(marks)):
            raise ValueError(f"marks_s={marks}: marks must be strictly ascending")
        if marks and (marks[0] <= 0 or marks[-1] > budget_s):
            raise ValueError(f"marks_s={marks}: each mark must lie in (0, budget_s={budget_s}]")
        self.budget_s = float(budget_s)
        self._pending = marks
        self._now = now
        self._start: float | None = None
        self._paused_s = 0.0

    def start(self) -> None:
        """Start counting (once; later calls are ignored)."""
        if self._start is None:
            self._start = self._now()

    @property
    def paused_s(self) -> float:
        """Seconds spent inside :meth:`paused` so far."""
        return self._paused_s

    def elapsed(self) -> float:
        """Training seconds so far (0 before :meth:`start`)."""
        if self._start is None:
            return 0.0
        return self._now() - self._start - self._paused_s

    def due_marks(self) -> list[float]:
        """The marks reached since the last call (ascending; each returned once)."""
        t = self.elapsed()
        due = [m for m in self._pending if m <= t]
        self._pending = self._pending[len(due) :]
        return due

    def done(self) -> bool:
        """Whether the budget is spent (read at a step end)."""
        return self.elapsed() >= self.budget_s

    @contextmanager
    def paused(self) -> Iterator[None]:
        """A block whose wall time does not count as training time."""
        t0 = self._now()
        try:
            yield
        finally:
            self._paused_s += self._now() - t0
