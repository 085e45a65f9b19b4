"""A weighted mixture of reward sources as one reward: the weights, per-source metrics,
failures, and the rules' shaping applied once."""

from __future__ import annotations

import numpy as np
import pytest

from verl.rewards import RewardFailureError, RewardManager
from verl.rewards.judge import JudgeScorer, ScriptedJudgeBackend
from verl.rewards.mixture import MixtureScorer
from verl.rewards.sources import RuleSource, SampleScorer, SourceReward, SourceScores

from .reward_loop_helpers import CharTokenizer, gen_batch


class Constant(SampleScorer):
    def __init__(self, name, value, fail_rows=()):
        self.name, self.value, self.fail_rows = name, value, set(fail_rows)

    def score(self, batch):
        n = len(batch)
        scores = np.full(n, self.value)
        fails = [f"{self.name}/errors" if i in self.fail_rows else None for i in range(n)]
        scores[list(self.fail_rows)] = 0.0
        return SourceScores(scores, fails, [f"row {i}" if f else None for i, f in enumerate(fails)])


def test_weights_sum_the_sources():
    rules = RuleSource(RewardManager(CharTokenizer()))  # built-in arithmetic scorer
    judge = JudgeScorer(ScriptedJudgeBackend(lambda p: "VERDICT: incorrect"), CharTokenizer())
    mixture = MixtureScorer(
        {"rules": (rules, 0.7), "judge": (judge, 0.3), "c": (Constant("c", 2.0), -0.5)}
    )
    reward = SourceReward(mixture)
    batch = gen_batch(["The answer is 5", "The answer is 4"], [5, 5])
    scores, metrics, extras = reward(batch)
    reward.close()
    # rules: 1, 0 (arithmetic); judge: 0, 0; constant: 2 -> 0.7*r + 0.3*j - 0.5*2
    assert scores.sum(-1).tolist() == pytest.approx([0.7 - 1.0, -1.0])
    assert metrics["reward/source/rules/score_mean"] == 0.5
    assert metrics["reward/source/rules/weighted_mean"] == pytest.approx(0.35)
    assert metrics["reward/source/judge/score_mean"] == 0.0
    assert metrics["judge/parse_failures"] == 0.0 and metrics["judge/mean_score"] == 0.0
    assert metrics["reward/source/c/weighted_mean"] == -1.0
    assert extras["acc"].tolist() == [1.0, 0.0]  # the first source with an acc: the rules


def test_a_failing_source_fails_its_rows_and_is_bounded():
    mixture = MixtureScorer(
        {"a": (Constant("a", 1.0), 1.0), "b": (Constant("b", 1.0, [1, 2]), 1.0)}
    )
    reward = SourceReward(mixture, max_failure_rate=0.5)
    _, metrics, extras = reward(gen_batch(["x"] * 4, [0] * 4))
    assert extras["failure"].tolist() == [None, "b/errors", "b/errors", None]
    assert extras["score"].tolist() == [2.0, 1.0, 1.0, 2.0]
    assert metrics["b/errors"] == 2.0 and metrics["reward/failure_rate"] == 0.5
    with pytest.raises(RewardFailureError, match=r"mixture failed on 3 of 4.*b/errors"):
        SourceReward(
            MixtureScorer({"b": (Constant("b", 1.0, [0, 1, 2]), 1.0)}), max_failure_rate=0.5
        )(gen_batch(["x"] * 4, [0] * 4))


def test_the_mixture_is_shaped_once_by_the_rules_manager():
    shaper = RewardManager(CharTokenizer(), clip_range=(-0.5, 0.5))
    reward = SourceReward(MixtureScorer({"c": (Constant("c", 2.0), 1.0)}), shaper=shaper)
    scores, metrics, extras = reward(gen_batch(["x", "y"], [0, 0]))
    assert scores.sum(-1).tolist() == [0.5, 0.5]
    assert extras["score"].tolist() == [2.0, 2.0] and metrics["reward/clip_ratio"] == 1.0


def test_bad_weights_are_refused():
    with pytest.raises(ValueError, match="must be a finite number"):
        MixtureScorer({"a": (Constant("a", 1.0), float("nan"))})
