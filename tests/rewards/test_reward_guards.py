"""Rewards that would break the run are refused loudly (issue 20, items 7 and 8): out-of-bound
and overflowing values, a failure rate above the threshold, a wrong signature, unbounded
output, and a SIGTERM that arrives during scoring."""

from __future__ import annotations

import os
import signal
import textwrap
import time

import pytest
import torch

from verl.protocol import DataProto
from verl.rewards import (
    RewardFailureError,
    RewardManager,
    RewardWorkerPool,
    load_reward_function,
    register_scorer,
)
from verl.rewards.manager import too_many_failures
from verl.rewards.results import MAX_OUTPUT_CHARS, call_inline, coerce_result


@pytest.fixture(scope="module")
def tokenizer():
    from verl.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


def make_batch(tokenizer, n, source="custom", **non_tensors):
    ids = tokenizer("x", add_special_tokens=False)["input_ids"]
    return DataProto.from_dict(
        tensors={"responses": torch.tensor([ids] * n), "response_mask": torch.ones(n, len(ids))},
        non_tensors={"data_source": [source] * n, "ground_truth": ["1"] * n, **non_tensors},
    )


def by_value(data_source, solution_str, ground_truth, extra_info):
    return extra_info["value"]


# ---------------------------------------------------------------------- bounds and types
@pytest.mark.parametrize("value", [1e39, 1e300, -2e6, 10**400, -(10**400), 10**7])
def test_values_outside_the_bound_are_out_of_bound_failures(value):
    result = coerce_result(value, max_abs=1e6)
    assert (result.failure, result.score) == ("out_of_bound", 0.0)


def test_bound_is_inclusive_and_bool_int_are_numbers():
    assert coerce_result(1e6, max_abs=1e6).score == 1e6
    assert coerce_result(-(10**6), max_abs=1e6).score == -1e6
    assert coerce_result(True, max_abs=1e6).score == 1.0
    assert coerce_result(1e300).ok  # no bound given: only finiteness is checked


def test_huge_int_does_not_kill_the_worker():
    # before: float(10**400) raised OverflowError in the worker, which died
    with RewardWorkerPool(lambda **k: 10**400, num_workers=1, timeout_s=10.0) as pool:
        (result,) = pool.map([{}])
        assert result.failure == "out_of_bound" and "too large for a float" in result.message
        assert pool.num_restarts == 0


def test_manager_counts_out_of_bound_per_call_with_the_configured_bound(tokenizer):
    values = [0.5, 1e39, 10**400, 20.0, -3.0]
    batch = make_batch(tokenizer, len(values), extra_info=[{"value": v} for v in values])
    with RewardManager(
        tokenizer, compute_score=by_value, max_abs_reward=10.0, max_failure_rate=None
    ) as manager:
        scores, metrics, extras = manager(batch)
    assert scores.sum(-1).tolist() == [0.5, 0.0, 0.0, 0.0, -3.0]
    assert metrics["reward/out_of_bound"] == 3.0
    assert metrics["reward/failure_rate"] == pytest.approx(0.6)
    assert extras["failure"].tolist() == [None] + ["out_of_bound"] * 3 + [None]


# ---------------------------------------------------------------------- failure rate stops
def test_too_many_failures_rule():
    assert too_many_failures(3, 4, 0.5) and not too_many_failures(2, 4, 0.5)
    assert too_many_failures(4, 4, 1.0) and not too_many_failures(3, 4, 1.0)
    assert too_many_failures(1, 4, 0.0) and not too_many_failures(0, 4, 0.0)
    assert not too_many_failures(4, 4, None) and not too_many_failures(0, 0, 0.5)


def test_failure_rate_above_threshold_stops_with_the_function_and_error(tokenizer):
    values = [float("nan"), float("nan"), "x", 1.0]
    batch = make_batch(tokenizer, 4, extra_info=[{"value": v} for v in values])
    with RewardManager(tokenizer, compute_score=by_value) as manager:
        with pytest.raises(RewardFailureError) as info:
            manager(batch)
        message = str(info.value)
        assert "reward function tests.rewards.test_reward_guards.by_value" in message
        assert "failed on 3 of 4 calls" in message and "max_failure_rate=0.5" in message
        assert "Most common failure: non_finite (2 calls), e.g. reward is nan" in message
        # exactly half failing is not above 0.5: scored, counted, no stop
        half = make_batch(tokenizer, 4, extra_info=[{"value": v} for v in [1, 1, "x", "y"]])
        _, metrics, _ = manager(half)
        assert metrics["reward/invalid_type"] == 2.0 and metrics["reward/failure_rate"] == 0.5


def test_validation_threshold_stops_only_when_every_call_failed(tokenizer):
    with RewardManager(tokenizer, compute_score=by_value, max_failure_rate=1.0) as manager:
        most = make_batch(tokenizer, 4, extra_info=[{"value": v} for v in ["a", "b", "c", 1]])
        assert manager(most)[1]["reward/invalid_type"] == 3.0
        every = make_batch(tokenizer, 2, extra_info=[{"value": "a"}, {"value": "b"}])
        with pytest.raises(RewardFailureError, match="failed on 2 of 2 calls"):
            manager(every)


def test_builtin_scorer_failing_everywhere_stops(tokenizer):
    @register_scorer("test_guards_all_fail", override=True)
    def always_raises(solution_str, ground_truth, extra_info=None):
        raise KeyError("no field")

    with pytest.raises(RewardFailureError, match=r"always_raises failed on 3 of 3.*KeyError"):
        RewardManager(tokenizer)(make_batch(tokenizer, 3, source="test_guards_all_fail"))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_abs_reward": 0.0}, "max_abs_reward=0.0 must be a finite number > 0"),
        ({"max_abs_reward": float("inf")}, "max_abs_reward=inf"),
        ({"max_failure_rate": 1.5}, r"max_failure_rate=1.5 must be in \[0, 1\]"),
    ],
)
def test_guard_arguments_are_validated(tokenizer, kwargs, match):
    with pytest.raises(ValueError, match=match):
        RewardManager(tokenizer, **kwargs)


# ---------------------------------------------------------------------- signature at load
def test_wrong_signature_fails_when_the_manager_is_built(tokenizer, tmp_path):
    path = tmp_path / "bad_reward.py"
    path.write_text("def compute_score(solution, truth):\n    return 1.0\n")
    fn = load_reward_function(str(path))
    with pytest.raises(TypeError) as info:
        RewardManager(tokenizer, compute_score=fn)
    message = str(info.value)
    assert f"reward function compute_score ({path}) has signature (solution, truth)" in message
    assert "data_source=..., solution_str=..., ground_truth=..., extra_info=..." in message


@pytest.mark.parametrize(
    "fn",
    [
        lambda data_source, solution_str, ground_truth, extra_info=None: 1.0,
        lambda **kwargs: 1.0,
        lambda solution_str, ground_truth, *, data_source=None, extra_info=None, scale=2: 1.0,
    ],
)
def test_compatible_signatures_are_accepted(tokenizer, fn):
    with RewardManager(tokenizer, compute_score=fn, isolation="inline") as manager:
        assert manager(make_batch(tokenizer, 1))[0].sum().item() == 1.0


# ---------------------------------------------------------------------- output cap
def test_reward_output_is_capped_per_call(capsys):
    def chatty(**kwargs):
        print("y" * 1_000_000)
        print("more", file=__import__("sys").stderr)
        return 1.0

    assert call_inline(chatty, {}).score == 1.0
    out, err = capsys.readouterr()
    assert len(out) + len(err) < MAX_OUTPUT_CHARS + 200
    assert out == "y" * MAX_OUTPUT_CHARS
    assert "reward function output truncated, 995910 characters dropped" in err  # 1e6+1+5-4096


def test_reward_output_in_a_worker_is_capped(tmp_path):
    # the worker inherits the parent's descriptors: check what reaches them
    log = tmp_path / "out.txt"
    path = tmp_path / "loud_reward.py"
    path.write_text(
        textwrap.dedent(
            """
            def compute_score(data_source, solution_str, ground_truth, extra_info=None):
                print("z" * 10_000_000)
                return 1.0
            """
        )
    )
    import subprocess
    import sys

    script = (
        "from verl.rewards import load_reward_function, safe_call\n"
        f"fn = load_reward_function({str(path)!r})\n"
        "kw = dict(data_source='d', solution_str='s', ground_truth='g', extra_info=None)\n"
        "assert safe_call(fn, kw, timeout_s=30.0).score == 1.0\n"
    )
    with open(log, "wb") as f:
        subprocess.run([sys.executable, "-c", script], stdout=f, stderr=f, check=True, timeout=120)
    assert log.stat().st_size < MAX_OUTPUT_CHARS + 500


# ---------------------------------------------------------------------- SIGTERM
def test_sigterm_during_an_inline_builtin_scorer_stops_scoring(tokenizer):
    """Ray's workers turn SIGTERM into SystemExit; it must leave the manager, not be counted
    as a reward error with training going on."""

    @register_scorer("test_guards_sigterm", override=True)
    def slow(solution_str, ground_truth, extra_info=None):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler interrupts this
        return 1.0

    def ray_like_handler(signum, frame):
        raise SystemExit(signum)

    previous = signal.signal(signal.SIGTERM, ray_like_handler)
    try:
        manager = RewardManager(tokenizer, max_failure_rate=None)
        start = time.monotonic()
        with pytest.raises(SystemExit) as info:
            manager(make_batch(tokenizer, 2, source="test_guards_sigterm"))
        assert info.value.code == signal.SIGTERM
        assert time.monotonic() - start < 4
        assert manager.failures.totals["errors"] == 0  # not counted as a reward failure
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_config_keys_are_validated():
    from verl.config import ConfigError, load_config

    cfg = load_config(overrides=[])
    assert (cfg.reward_model.max_abs_reward, cfg.reward_model.max_failure_rate) == (1e6, 0.5)
    assert cfg.reward_model.val_max_failure_rate == 1.0
    bad = ["reward_model.max_failure_rate=1.5", "reward_model.max_abs_reward=0"]
    with pytest.raises(ConfigError) as info:
        load_config(overrides=bad)
    assert "reward_model.max_abs_reward=0.0: must be > 0" in str(info.value)
    assert "reward_model.max_failure_rate=1.5: must be in [0.0, 1.0]" in str(info.value)
