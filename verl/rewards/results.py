"""What a reward call returns: a `RewardResult`, with a score or one of five failure kinds.

Contract: `coerce_result(raw, max_abs)` turns what a reward function returned into a
`RewardResult` and never raises; `call_inline(fn, kwargs)` calls a function in this
process and turns its exception into an `errors` result; `failed(kind, message)` makes a
score-0 result. `verl.rewards.isolation` counts the failures and runs calls with a
timeout; `verl.rewards.worker_pool` runs them in killable worker processes. Both build on
this module, which imports neither.

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
same exit kills the worker, which is then counted as an error.) What a call prints is
capped at `MAX_OUTPUT_CHARS` characters (`capped_output`).
"""

from __future__ import annotations

import contextlib
import math
import numbers
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_MAX_ABS_REWARD",
    "ERROR",
    "FAILURE_KINDS",
    "INVALID_TYPE",
    "MAX_OUTPUT_CHARS",
    "NON_FINITE",
    "OUT_OF_BOUND",
    "TIMEOUT",
    "RewardResult",
    "call_inline",
    "capped_output",
    "check_bound",
    "coerce_result",
    "failed",
]

ERROR = "errors"
TIMEOUT = "timeouts"
NON_FINITE = "non_finite"
INVALID_TYPE = "invalid_type"
OUT_OF_BOUND = "out_of_bound"
FAILURE_KINDS = (ERROR, TIMEOUT, NON_FINITE, INVALID_TYPE, OUT_OF_BOUND)
DEFAULT_MAX_ABS_REWARD = 1e6
MAX_OUTPUT_CHARS = 4096  # of one call's print()ed stdout + stderr; the rest is dropped


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
