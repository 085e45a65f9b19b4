"""safe_call and the worker pool: every failure kind becomes score 0 and a count."""

from __future__ import annotations

import logging
import math
import os
import time

import numpy as np
import pytest
import torch

from verl.rewards.isolation import FailureTracker, safe_call
from verl.rewards.results import FAILURE_KINDS, coerce_result, failed
from verl.rewards.worker_pool import RewardWorkerPool

TIMEOUT_S = 0.5


def _raise(**kwargs):
    raise RuntimeError("boom: " + kwargs["solution_str"])


def _hang(**kwargs):
    while True:
        pass


def _sleep_then_score(x):
    if x < 0:
        time.sleep(30)
    if x == 99:
        raise ValueError("ninety-nine")
    return {"score": float(x), "acc": 1.0}


@pytest.mark.parametrize(
    ("raw", "score", "extra"),
    [
        (1, 1.0, {}),
        (0.25, 0.25, {}),
        (True, 1.0, {}),
        (np.float32(0.5), 0.5, {}),
        (np.int64(3), 3.0, {}),
        (torch.tensor(2.0), 2.0, {}),
        (np.array(0.75), 0.75, {}),
        ({"score": 1, "acc": 0.0, "pred": "7"}, 1.0, {"acc": 0.0, "pred": "7"}),
    ],
)
def test_coerce_valid(raw, score, extra):
    result = coerce_result(raw)
    assert result.ok and result.score == score and result.extra == extra


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (float("nan"), "non_finite"),
        (float("inf"), "non_finite"),
        (-math.inf, "non_finite"),
        ({"score": float("nan")}, "non_finite"),
        ("1.0", "invalid_type"),
        (None, "invalid_type"),
        ([1.0], "invalid_type"),
        (torch.tensor([1.0, 2.0]), "invalid_type"),
        ({"acc": 1.0}, "invalid_type"),
        ({"score": "high"}, "invalid_type"),
    ],
)
def test_coerce_invalid(raw, kind):
    result = coerce_result(raw)
    assert result.failure == kind and result.score == 0.0


def test_safe_call_inline_failures_are_counted_by_kind():
    tracker = FailureTracker()
    kw = {"solution_str": "x"}
    assert safe_call(lambda **k: 0.5, kw, tracker=tracker).score == 0.5
    r = safe_call(_raise, kw, tracker=tracker)
    assert (r.score, r.failure, r.message) == (0.0, "errors", "RuntimeError: boom: x")
    assert safe_call(lambda **k: float("nan"), kw, tracker=tracker).failure == "non_finite"
    assert safe_call(lambda **k: "0.9", kw, tracker=tracker).failure == "invalid_type"
    assert safe_call(lambda **k: {"acc": 1}, kw, tracker=tracker).failure == "invalid_type"
    # calling with the wrong keywords is the function's error too, not the loop's
    assert safe_call(lambda a: a, kw, tracker=tracker).failure == "errors"
    assert tracker.metrics() == {
        "reward/errors": 2.0,
        "reward/timeouts": 0.0,
        "reward/non_finite": 1.0,
        "reward/invalid_type": 2.0,
        "reward/out_of_bound": 0.0,
    }
    tracker.reset()
    assert sum(tracker.metrics().values()) == 0.0
    assert tracker.totals["errors"] == 2  # run totals survive a reset


def test_sys_exit_propagates_inline_and_kills_only_a_worker():
    # SystemExit is how SIGTERM reaches the loop on Ray: it must stop the run, never be
    # counted as a reward error (issue 20, item 8).
    with pytest.raises(SystemExit):
        safe_call(lambda **k: exit(3), {}, tracker=FailureTracker())
    with pytest.raises(KeyboardInterrupt):
        safe_call(lambda **k: (_ for _ in ()).throw(KeyboardInterrupt), {})
    # in a worker process the same exit only ends that worker, which counts as an error
    result = safe_call(lambda **k: exit(3), {}, timeout_s=5.0, tracker=FailureTracker())
    assert result.failure == "errors" and "exit code 3" in result.message


def test_safe_call_hang_times_out_fast():
    tracker = FailureTracker()
    start = time.monotonic()
    result = safe_call(_hang, {"solution_str": ""}, timeout_s=TIMEOUT_S, tracker=tracker)
    elapsed = time.monotonic() - start
    assert result.failure == "timeouts" and result.score == 0.0
    assert TIMEOUT_S <= elapsed < TIMEOUT_S + 2.0
    assert tracker.counts["timeouts"] == 1


def test_safe_call_with_timeout_runs_lambdas_and_reports_errors():
    # fork start: closures and lambdas need no pickling
    offset = 0.25
    assert safe_call(lambda **k: offset + 1, {}, timeout_s=5.0).score == 1.25
    r = safe_call(_raise, {"solution_str": "y"}, timeout_s=5.0, tracker=FailureTracker())
    assert (r.failure, r.message) == ("errors", "RuntimeError: boom: y")
    r = safe_call(lambda **k: os._exit(7), {}, timeout_s=5.0, tracker=FailureTracker())
    assert r.failure == "errors" and "exit code 7" in r.message


def test_tracker_logs_first_failures_then_only_counts(caplog):
    tracker = FailureTracker(max_logged_per_kind=2)
    with caplog.at_level(logging.WARNING, logger="verl.rewards.isolation"):
        for i in range(5):
            tracker.record(failed("errors", f"problem {i}"), context=f"sample {i}")
    messages = [r.getMessage() for r in caplog.records]
    assert any("problem 0" in m and "sample 0" in m for m in messages)
    assert any("problem 1" in m for m in messages)
    assert not any("problem 2" in m or "problem 4" in m for m in messages)
    assert any("only counted" in m for m in messages)
    assert tracker.counts["errors"] == 5


def test_failed_rejects_unknown_kind():
    with pytest.raises(ValueError, match="'oops'"):
        failed("oops", "x")
    assert FAILURE_KINDS == ("errors", "timeouts", "non_finite", "invalid_type", "out_of_bound")


def test_pool_mixed_batch_keeps_order_and_replaces_hung_worker():
    xs = [0, 1, -1, 3, 99, 5, 6, 7]
    with RewardWorkerPool(_sleep_then_score, num_workers=2, timeout_s=TIMEOUT_S) as pool:
        start = time.monotonic()
        results = pool.map([{"x": x} for x in xs])
        elapsed = time.monotonic() - start
        # the other worker kept scoring while one was stuck: one timeout, not several
        assert elapsed < TIMEOUT_S + 2.0
        assert [r.score for r in results] == [0.0, 1.0, 0.0, 3.0, 0.0, 5.0, 6.0, 7.0]
        assert [r.failure for r in results] == [
            None,
            None,
            "timeouts",
            None,
            "errors",
            None,
            None,
            None,
        ]
        assert results[1].extra == {"acc": 1.0}
        assert pool.num_restarts == 1
        # the replacement worker serves the next batch normally
        again = pool.map([{"x": x} for x in range(20)])
        assert [r.score for r in again] == [float(x) for x in range(20)]


def test_pool_unpicklable_arguments_and_results():
    with RewardWorkerPool(lambda **k: {"score": 1.0, "f": open(os.devnull)}, timeout_s=5.0) as pool:
        bad_args, ok = pool.map([{"x": lambda: 0}, {"x": 1}])
    assert bad_args.failure == "errors" and "cannot send" in bad_args.message
    assert ok.ok and ok.score == 1.0 and ok.extra == {}  # unpicklable extras dropped


def test_pool_validates_arguments():
    with pytest.raises(ValueError, match="num_workers=0"):
        RewardWorkerPool(_hang, num_workers=0)
    with pytest.raises(ValueError, match="timeout_s=0"):
        RewardWorkerPool(_hang, timeout_s=0)


def _private_mib_after_full_collection(**_) -> float:
    import gc

    gc.collect()
    with open("/proc/self/smaps_rollup") as f:
        kib = sum(int(line.split()[1]) for line in f if line.startswith("Private_"))
    return kib / 1024


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="Linux only")
def test_pool_worker_does_not_copy_the_parents_objects_when_it_collects():
    """A garbage collection in a forked worker would write the header of every object it
    inherited (copy-on-write: the trainer's Python heap, copied per worker); the inherited
    objects are frozen out of the worker's collections."""
    inherited = [{"i": i, "s": str(i)} for i in range(400_000)]  # ~100 MiB of objects
    try:
        with RewardWorkerPool(_private_mib_after_full_collection, timeout_s=30.0) as pool:
            (result,) = pool.map([{}])
        assert result.ok
        assert (
            result.score < 20.0
        )  # 3.5 MiB frozen, 47 without, f"worker holds {result.score:.0f} MiB of its own"
    finally:
        del inherited
    # the timeout is still enforced in a worker that froze its inherited objects
    with RewardWorkerPool(_hang, timeout_s=0.5) as pool:
        (hung,) = pool.map([{}])
    assert hung.failure == "timeouts"
