"""Scoring overlapped with generation: the same scores, in the same order, as scoring the
same responses after generation, and less wall time with a slow reward."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from verl.protocol import DataProto
from verl.rewards import RewardManager
from verl.rewards.http import HttpSettings
from verl.rewards.overlap import RewardOverlap, chunk_bounds
from verl.rewards.remote import RemoteScorer
from verl.rewards.sources import RuleSource, SourceReward

from .reward_loop_helpers import CharTokenizer, JsonServer, gen_batch


def _prompts(truths: list[int]) -> DataProto:
    return DataProto.from_dict(
        non_tensors={"truth": np.array(truths, dtype=object)}, meta_info={"k": 1}
    )


class FakeRollout:
    """n=2 responses per prompt ("<truth>" and "<truth + 1>"), ``seconds`` per prompt;
    records which thread generated and when."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.calls: list[int] = []

    def __call__(self, prompts: DataProto) -> DataProto:
        self.calls.append(len(prompts))
        time.sleep(self.seconds * len(prompts))
        truths = [int(t) for t in prompts.non_tensor_batch["truth"]]
        responses = [str(t + d) for t in truths for d in (0, 1)]
        return gen_batch(responses, [t for t in truths for _ in (0, 1)])


def test_chunk_bounds_cover_the_batch_in_order():
    assert chunk_bounds(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert chunk_bounds(2, 4) == [(0, 1), (1, 2)]
    assert chunk_bounds(5, 1) == [(0, 5)]
    with pytest.raises(ValueError):
        chunk_bounds(5, 0)


def test_overlapped_scores_equal_scores_after_generation():
    truths = list(range(10))
    shaper = RewardManager(CharTokenizer(), normalize=True)
    reward = SourceReward(RuleSource(RewardManager(CharTokenizer())), shaper=shaper)
    rollout = FakeRollout()
    overlap = RewardOverlap(reward, num_chunks=3, num_workers=2)
    gen = overlap.generate(rollout, _prompts(truths))
    scores, metrics, extras = reward(gen, update_stats=True)
    assert rollout.calls == [4, 3, 3]

    after_shaper = RewardManager(CharTokenizer(), normalize=True)
    after = SourceReward(RuleSource(RewardManager(CharTokenizer())), shaper=after_shaper)
    whole = FakeRollout()(_prompts(truths))
    scores_after, metrics_after, extras_after = after(whole, update_stats=True)
    assert len(gen) == 20
    assert np.array_equal(gen.batch["responses"].numpy(), whole.batch["responses"].numpy())
    assert scores.tolist() == scores_after.tolist()  # same scores, same order, shaped once
    assert extras["score"].tolist() == [1.0, 0.0] * 10
    assert extras["acc"].tolist() == extras_after["acc"].tolist()
    assert metrics["reward/running_mean"] == metrics_after["reward/running_mean"]
    assert shaper.normalizer.count == after_shaper.normalizer.count  # stats moved once
    overlap.close()
    reward.close()
    after.close()


def test_a_prescored_batch_is_used_once_and_only_for_that_batch():
    calls = []

    class Counting(RuleSource):
        def score(self, batch):
            calls.append(len(batch))
            return super().score(batch)

    reward = SourceReward(Counting(RewardManager(CharTokenizer())))
    overlap = RewardOverlap(reward, num_chunks=2)
    gen = overlap.generate(FakeRollout(), _prompts([1, 2, 3, 4]))
    other = FakeRollout()(_prompts([5]))
    reward(other)  # another batch (ReMax's greedy baseline): scored itself
    # (the chunks may still be scoring in the background: look for the batch, not the order)
    assert 2 in calls
    reward(gen)
    assert sorted(calls) == [2, 4, 4]  # two chunks of 4 responses, plus the other batch
    overlap.close()


def test_overlap_hides_a_slow_reward_behind_generation():
    """Generation 100 ms per prompt, scoring 50 ms per response over HTTP (one at a time),
    8 prompts x 2: 0.8 s + 0.8 s one after the other; overlapped in 4 chunks, scoring
    starts after the first chunk (0.2 s) and ends about 0.8 s later."""

    def slow(path, body):
        time.sleep(0.05)
        return 200, {"score": float(body["response"] == body["ground_truth"])}

    truths = list(range(8))
    with JsonServer(slow) as server:

        def run(num_chunks: int) -> tuple[float, list[float]]:
            settings = HttpSettings(concurrency=1, timeout_s=5)
            reward = SourceReward(RemoteScorer(server.url, CharTokenizer(), settings))
            overlap = RewardOverlap(reward, num_chunks=num_chunks)
            start = time.perf_counter()
            gen = overlap.generate(FakeRollout(0.1), _prompts(truths))
            scores, _, _ = reward(gen)
            elapsed = time.perf_counter() - start
            overlap.close()
            reward.close()
            return elapsed, scores.sum(-1).tolist()

        after_s, after_scores = run(1)
        overlap_s, overlap_scores = run(4)
    assert overlap_scores == after_scores == [1.0, 0.0] * 8
    assert overlap_s < after_s * 0.85, (overlap_s, after_s)  # about 1.0 s vs 1.6 s
    assert threading.active_count() < 50


def test_overlap_refuses_a_reward_it_cannot_split():
    with pytest.raises(TypeError, match="per-response reward source"):
        RewardOverlap(RewardManager(CharTokenizer()), num_chunks=2)
