"""The bad-input catalogue (docs/errors.md) for rewards: failing reward functions, an
unparseable ground truth and code rewards, each scored 0, counted and named in a warning."""

from __future__ import annotations

import logging
import textwrap

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.rewards import RewardManager, load_reward_function
from verl.rewards.scorers import code

PAD = 0


@pytest.fixture(scope="module")
def tokenizer():
    from verl.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


def make_batch(tokenizer, texts, sources, truths, **non_tensors):
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(x) for x in ids)
    responses = torch.tensor([x + [PAD] * (width - len(x)) for x in ids])
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
    return DataProto.from_dict(
        tensors={"responses": responses, "response_mask": mask},
        non_tensors={"data_source": sources, "ground_truth": truths, **non_tensors},
    )


REWARD_FILE = """
import math, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    kind = extra_info["kind"]
    if kind == "raise":
        raise ZeroDivisionError("no answer to divide")
    if kind == "hang":
        time.sleep(60)
    return {"ok": 1.0, "nan": math.nan, "inf": math.inf, "str": "one"}[kind]
"""


def test_failing_reward_function_is_scored_0_counted_and_named(tmp_path, tokenizer, caplog):
    path = tmp_path / "my_reward.py"
    path.write_text(textwrap.dedent(REWARD_FILE))
    fn = load_reward_function(str(path))
    kinds = ["ok", "raise", "nan", "inf", "str", "hang"]
    batch = make_batch(
        tokenizer, ["x"] * 6, ["custom"] * 6, ["1"] * 6, extra_info=[{"kind": k} for k in kinds]
    )
    with (
        caplog.at_level(logging.WARNING, logger="verl.rewards.isolation"),
        RewardManager(tokenizer, compute_score=fn, timeout_s=1.0, max_failure_rate=None) as manager,
    ):
        scores, metrics, _ = manager(batch)
    assert scores.sum(-1).tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert metrics["reward/errors"] == 1.0
    assert metrics["reward/non_finite"] == 2.0
    assert metrics["reward/invalid_type"] == 1.0
    assert metrics["reward/timeouts"] == 1.0
    messages = [r.getMessage() for r in caplog.records]
    named = f"function compute_score ({path})"
    expected = {
        "errors": "sample 1, data_source='custom'): ZeroDivisionError: no answer to divide",
        "non_finite": "sample 2, data_source='custom'): reward is nan",
        "invalid_type": "reward must be a number or a dict with a numeric 'score', got str: 'one'",
        "timeouts": "reward function did not return within 1 s",
    }
    for kind, text in expected.items():
        hits = [m for m in messages if m.startswith(f"reward function failure [{kind}]")]
        assert hits, f"no warning for {kind}: {messages}"
        assert named in hits[0] and text in hits[0], hits[0]


def test_builtin_scorer_failure_names_the_scorer(tokenizer, caplog):
    from verl.rewards import register_scorer

    @register_scorer("test_bad_input_raises", override=True)
    def explode(solution_str, ground_truth, extra_info=None):
        raise KeyError("boom")

    batch = make_batch(tokenizer, ["x"], ["test_bad_input_raises"], ["1"])
    with caplog.at_level(logging.WARNING, logger="verl.rewards.isolation"):
        _, metrics, _ = RewardManager(tokenizer, max_failure_rate=None)(batch)
    assert metrics["reward/errors"] == 1.0
    assert "test_builtin_scorer_failure_names_the_scorer.<locals>.explode" in caplog.text
    assert "KeyError: 'boom'" in caplog.text


def test_unparseable_ground_truth_warning_names_the_sample(tokenizer, caplog):
    batch = make_batch(
        tokenizer,
        ["#### 4", "#### 4"],
        ["gsm8k", "gsm8k"],
        ["4", "four"],
        index=np.array([10, 11], dtype=object),
    )
    with caplog.at_level(logging.WARNING, logger="verl.rewards.manager"):
        scores, metrics, _ = RewardManager(tokenizer)(batch)
    assert scores.sum(-1).tolist() == [1.0, 0.0]
    assert metrics["reward/invalid_ground_truth"] == 1.0
    assert (
        "unparseable ground truth 'four' (sample 1, dataset row index 11, "
        "data_source='gsm8k'): scored 0 and counted in reward/invalid_ground_truth"
    ) in caplog.text


# ---------------------------------------------------------------------- code rewards
def test_code_scorer_passes_and_fails_cases():
    truth = {"inputs": ["2 3\n", "10 -1\n"], "outputs": ["5\n", "9"]}
    right = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    wrong = "```python\na, b = map(int, input().split())\nprint(a * b)\n```"
    assert code.compute_score(right, truth)["score"] == 1.0
    out = code.compute_score(wrong, truth)
    assert (out["score"], out["passed"], out["total"]) == (0.0, 0, 2)
    asserts = '{"tests": "assert add(2, 3) == 5"}'
    assert code.compute_score("def add(a, b):\n    return a + b", asserts)["acc"] == 1.0


def test_code_scorer_limits_score_0():
    truth = {"tests": "assert True"}
    loop = code.compute_score("while True:\n    pass", truth, timeout_s=1.0)
    assert (loop["score"], loop["timeouts"]) == (0.0, 1)
    hog = code.compute_score("x = bytearray(4 * 1024**3)", truth, memory_mb=512)
    assert (hog["score"], hog["memory_errors"]) == (0.0, 1)


@pytest.mark.parametrize("truth", ["not json", {"inputs": ["1"]}, {"tests": ""}, 42])
def test_code_scorer_unparseable_ground_truth(truth):
    assert code.compute_score("print(1)", truth) == {
        "score": 0.0,
        "acc": 0.0,
        "invalid_ground_truth": 1.0,
    }


def test_code_data_source_through_the_manager(tokenizer):
    truth = '{"inputs": ["3\\n"], "outputs": ["9"]}'
    batch = make_batch(tokenizer, ["print(int(input()) ** 2)"], ["code"], [truth])
    scores, metrics, extras = RewardManager(tokenizer)(batch)
    assert scores.sum().item() == 1.0 and metrics["reward/acc/code"] == 1.0
    assert extras["timeouts"].tolist() == [0]


def test_safe_call_warning_names_the_function(caplog):
    from verl.rewards import FailureTracker, safe_call

    def my_scorer(**kwargs):
        raise ValueError("cannot parse")

    with caplog.at_level(logging.WARNING, logger="verl.rewards.isolation"):
        result = safe_call(my_scorer, {}, tracker=FailureTracker(), context="sample 7")
    assert result.score == 0.0 and result.failure == "errors"
    assert (
        "reward function failure [errors] (function "
        f"{__name__}.test_safe_call_warning_names_the_function.<locals>.my_scorer, sample 7): "
        "ValueError: cannot parse"
    ) in caplog.text
