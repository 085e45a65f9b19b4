"""Isolate reward functions from the training loop: failures become score 0 and a count.

Contract: `safe_call(fn, kwargs, timeout_s)` never lets a failure of `fn` escape (only
`SystemExit` / `KeyboardInterrupt` of an inline call propagate: they say the run must
stop); it returns a `RewardResult` (score 0.0 on failure) and counts the failure in a
`FailureTracker`. What counts as a failure, and its five kinds (`reward/errors`,
`reward/timeouts`, `reward/non_finite`, `reward/invalid_type`, `reward/out_of_bound`),
is `verl.rewards.results`. The first `max_logged_per_kind` failures of each kind are
logged with the function's name (`callable_name`), the sample and the message; later ones
are only counted. The catalogue of bad inputs and their messages is `docs/errors.md`.
`RewardFailureError` is what the reward manager raises when too many calls of one step
failed.

How calls run (`safe_call`):

- `timeout_s=None`: called directly in this process with exceptions caught. This is the
  fast path for the built-in scorers, which are pure and bounded; it cannot stop a hang.
- `timeout_s` set: the call runs in a forked worker process (`RewardWorkerPool`) that is
  killed when the deadline passes. Processes, not threads, because a Python thread cannot be
  killed: a hung call would keep burning CPU for the rest of the run, and a call stuck in C
  code that holds the GIL (a catastrophic `re` backtrack, a big sympy simplification) would
  freeze the whole trainer, timeout included. `safe_call` starts a one-shot worker per call
  (tens of ms); the reward manager keeps a persistent pool for whole batches.

What a call returns (`RewardResult`, the failure kinds, the bound) is defined in
`verl.rewards.results`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from verl.rewards.results import (
    FAILURE_KINDS,
    RewardResult,
    call_inline,
)

__all__ = [
    "FailureTracker",
    "RewardFailureError",
    "callable_name",
    "default_tracker",
    "safe_call",
]

logger = logging.getLogger(__name__)


class RewardFailureError(RuntimeError):
    """Too many calls of a reward function failed in one step: the run must stop."""


class FailureTracker:
    """Counts failures by kind (per batch and for the whole run) and rate-limits their logs."""

    def __init__(self, max_logged_per_kind: int = 5) -> None:
        self.max_logged_per_kind = max_logged_per_kind
        self.counts: Counter[str] = Counter()  # since the last reset()
        self.totals: Counter[str] = Counter()  # since construction
        self._logged: Counter[str] = Counter()

    def record(self, result: RewardResult, context: str = "") -> None:
        """Count `result` if it failed; log it while under the per-kind log limit."""
        kind = result.failure
        if kind is None:
            return
        self.counts[kind] += 1
        self.totals[kind] += 1
        if self._logged[kind] < self.max_logged_per_kind:
            self._logged[kind] += 1
            where = f" ({context})" if context else ""
            logger.warning("reward function failure [%s]%s: %s", kind, where, result.message)
            if self._logged[kind] == self.max_logged_per_kind:
                logger.warning(
                    "logged %d reward failures of kind %r; further ones are only counted "
                    "in the reward/%s metric",
                    self.max_logged_per_kind,
                    kind,
                    kind,
                )

    def metrics(self) -> dict[str, float]:
        """`reward/<kind>` counts since the last reset, for every kind (0 when none)."""
        return {f"reward/{kind}": float(self.counts[kind]) for kind in FAILURE_KINDS}

    def reset(self) -> None:
        self.counts.clear()


_DEFAULT_TRACKER = FailureTracker()


def default_tracker() -> FailureTracker:
    """The tracker `safe_call` uses when none is passed."""
    return _DEFAULT_TRACKER


def callable_name(fn: Any) -> str:
    """A readable name for a reward function in warnings: `module.qualname` or `name (path)`."""
    path = getattr(fn, "path", None)
    if isinstance(path, str) and getattr(fn, "name", None):
        return f"{fn.name} ({path})"  # a FileRewardFunction
    base = getattr(fn, "func", fn)  # functools.partial
    name = getattr(base, "__qualname__", None) or type(base).__name__
    module = getattr(base, "__module__", None)
    return f"{module}.{name}" if module else name


def safe_call(
    fn: Callable[..., Any],
    kwargs: Mapping[str, Any],
    timeout_s: float | None = None,
    *,
    tracker: FailureTracker | None = None,
    context: str = "",
) -> RewardResult:
    """Call `fn(**kwargs)` so that no failure escapes: see the module docstring.

    Args:
        fn: the reward function (any callable; with `timeout_s` it runs in a forked process).
        kwargs: its keyword arguments.
        timeout_s: seconds before the call is abandoned and its process killed; None runs it
            directly in this process with no time limit.
        tracker: where failures are counted (default: a module-level tracker).
        context: short description for the log line, e.g. "sample 3, data_source=gsm8k".

    Returns:
        A `RewardResult`; `score` is 0.0 whenever `failure` is set.
    """
    if timeout_s is None:
        result = call_inline(fn, kwargs)
    else:
        from verl.rewards.worker_pool import RewardWorkerPool

        with RewardWorkerPool(fn, num_workers=1, timeout_s=timeout_s) as pool:
            result = pool.map([kwargs])[0]
    where = f"function {callable_name(fn)}" + (f", {context}" if context else "")
    (tracker or _DEFAULT_TRACKER).record(result, where)
    return result
