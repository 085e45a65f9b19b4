"""Isolate reward functions from the training loop: failures become score 0 and a count.

A reward function can fail five ways, each counted under its own metric:

| kind | metric | when |
|---|---|---|
| errors | `reward/errors` | it raised (or its worker process died) |
| timeouts | `reward/timeouts` | it ran longer than `timeout_s` |
| non_finite | `reward/non_finite` | it returned NaN or +-inf |
| invalid_type | `reward/invalid_type` | it returned something other than a number or a dict with a numeric "score" |
| out_of_bound | `reward/out_of_bound` | it returned a number outside the finite bound (`|r| <= max_abs`, default `DEFAULT_MAX_ABS_REWARD` = 1e6, `reward_model.max_abs_reward`) or an int too big for a float (`10**400`) |

Accepted values: `float`, `int` and `bool` (True = 1.0: `return answer == truth` is the
usual way to write a 0/1 reward, and a bool cannot break the run), numpy scalars and 0-d
arrays/tensors of those, or a dict with such a "score". A huge reward is a failure, not a
clipped value: 1e39 is finite but turns the advantages into NaN, so it must be seen, not
silently used.

Every failure scores 0.0. Only `Exception`s are failures: `SystemExit` and
`KeyboardInterrupt` raised during an inline call propagate, because they are how a SIGTERM
(Ray installs a handler that raises `SystemExit`) or Ctrl-C reach the training loop; they
say the run must stop, not that the reward function is wrong. (In a worker process the
same exit kills the worker, which is then counted as an error.) The first `max_logged_per_kind` failures of each kind are logged
with the function's name (`callable_name`), the sample and the message; later ones are only
counted. The catalogue of bad inputs and their messages is `docs/errors.md`.

How calls run (`safe_call`):

- `timeout_s=None`: called directly in this process with exceptions caught. This is the
  fast path for the built-in scorers, which are pure and bounded; it cannot stop a hang.
- `timeout_s` set: the call runs in a forked worker process (`RewardWorkerPool`) that is
  killed when the deadline passes. Processes, not threads, because a Python thread cannot be
  killed: a hung call would keep burning CPU for the rest of the run, and a call stuck in C
  code that holds the GIL (a catastrophic `re` backtrack, a big sympy simplification) would
  freeze the whole trainer, timeout included. `safe_call` starts a one-shot worker per call
  (tens of ms); the reward manager keeps a persistent pool for whole batches.
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

ERROR = "errors"
TIMEOUT = "timeouts"
NON_FINITE = "non_finite"
INVALID_TYPE = "invalid_type"
OUT_OF_BOUND = "out_of_bound"
FAILURE_KINDS = (ERROR, TIMEOUT, NON_FINITE, INVALID_TYPE, OUT_OF_BOUND)
DEFAULT_MAX_ABS_REWARD = 1e6
MAX_OUTPUT_CHARS = 4096  # of one call's print()ed stdout + stderr; the rest is dropped


class RewardFailureError(RuntimeError):
    """Too many calls of a reward function failed in one step: the run must stop."""


@dataclass
class RewardResult:
    """Outcome of one reward call: the score to use and what went wrong, if anything."""

    score: float
    extra: dict[str, Any] = field(default_factory=dict)  # other keys of a dict result
    failure: str | None = None  # one of FAILURE_KINDS, None on success
    message: str | None = None  # why it failed

    @property
    def ok(self) -> bool:
        return self.failure is None


def failed(kind: str, message: str) -> RewardResult:
    """A score-0 result for a failure of `kind` (one of FAILURE_KINDS)."""
    if kind not in FAILURE_KINDS:
        raise ValueError(f"failure kind {kind!r} is not one of {FAILURE_KINDS}")
    return RewardResult(score=0.0, failure=kind, message=message)


def _to_float(value: Any) -> float | None:
    if isinstance(value, numbers.Real):  # includes bool, numpy floats and ints
        return float(value)
    # 0-d torch tensors / numpy arrays
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        item = value.item()
        if isinstance(item, numbers.Real):
            return float(item)
    return None


def coerce_result(raw: Any, max_abs: float | None = None) -> RewardResult:
    """Validate what a reward function returned and turn it into a `RewardResult`.

    `max_abs` bounds `|score|` (None: any finite float; the reward manager applies its
    configured bound with `check_bound` on results that come back from worker processes).
    """
    extra: dict[str, Any] = {}
    value = raw
    if isinstance(raw, Mapping):
        if "score" not in raw:
            keys = sorted(str(k) for k in raw)
            return failed(INVALID_TYPE, f"reward dict has no 'score' key (keys: {keys})")
        value = raw["score"]
        extra = {str(k): v for k, v in raw.items() if k != "score"}
    try:
        number = _to_float(value)
    except OverflowError:  # an int (or Fraction) beyond the float range, e.g. 10**400
        return failed(OUT_OF_BOUND, f"reward {_short(value)} is too large for a float")
    if number is None:
        return failed(
            INVALID_TYPE,
            f"reward must be a number or a dict with a numeric 'score', got "
            f"{type(value).__name__}: {_short(value)}",
        )
    if not math.isfinite(number):
        return failed(NON_FINITE, f"reward is {number}")
    return check_bound(RewardResult(score=number, extra=extra), max_abs)


def check_bound(result: RewardResult, max_abs: float | None) -> RewardResult:
    """`result`, or an `out_of_bound` failure if its score is outside `[-max_abs, max_abs]`."""
    if max_abs is None or not result.ok or abs(result.score) <= max_abs:
        return result
    return failed(
        OUT_OF_BOUND,
        f"reward {result.score:g} is outside the bound |r| <= {max_abs:g} "
        "(reward_model.max_abs_reward)",
    )


def _short(value: Any) -> str:
    try:
        shown = repr(value)
    except ValueError:  # int too big to print (sys.set_int_max_str_digits)
        bits = value.bit_length() if isinstance(value, int) else "?"
        return f"<{type(value).__name__} of {bits} bits>"
    return shown if len(shown) <= 80 else shown[:77] + "..."


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


def call_inline(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> RewardResult:
    """Call `fn(**kwargs)` in this process; exceptions become `errors` results.

    `SystemExit` and `KeyboardInterrupt` propagate (see the module docstring).
    """
    try:
        with capped_output(MAX_OUTPUT_CHARS):
            raw = fn(**kwargs)
    except Exception as exc:
        return failed(ERROR, f"{type(exc).__name__}: {exc}")
    return coerce_result(raw)


class _CappedStream:
    """A text stream forwarding the first `budget.left` characters, then counting drops."""

    def __init__(self, target: Any, budget: list[int]) -> None:
        self._target = target
        self._budget = budget  # [chars left, chars dropped], shared by stdout and stderr

    def write(self, text: str) -> int:
        keep = text[: max(self._budget[0], 0)]
        if keep:
            self._target.write(keep)
        self._budget[0] -= len(keep)
        self._budget[1] += len(text) - len(keep)
        return len(text)

    def flush(self) -> None:
        self._target.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno ...
        return getattr(self._target, name)


@contextlib.contextmanager
def capped_output(max_chars: int):
    """Cap what the body writes through `sys.stdout` / `sys.stderr` to `max_chars` in
    total, then one line saying how much was dropped. Writes that bypass these objects
    (`sys.stdout.buffer`, `os.write(1, ...)`, C extensions) are not seen; a reward function
    in a worker process still shares the trainer's descriptors."""
    out, err = sys.stdout, sys.stderr
    if out is None or err is None:
        yield
        return
    budget = [max_chars, 0]
    sys.stdout, sys.stderr = _CappedStream(out, budget), _CappedStream(err, budget)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
        if budget[1]:
            with contextlib.suppress(Exception):
                err.write(
                    f"\n[verl: reward function output truncated, {budget[1]} characters "
                    f"dropped after the first {max_chars}]\n"
                )


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
