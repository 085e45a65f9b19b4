"""Rewards from a scoring service over HTTP (a server on 127.0.0.1 in a thread): scores in
both modes, the concurrency limit, timeouts, retries with backoff, the rate limit, every
failure counted by kind, and the failure bound."""

from __future__ import annotations

import time

import pytest

from verl.rewards import RewardFailureError
from verl.rewards.http import HttpSettings, JsonPoster, RateLimiter, bearer_headers
from verl.rewards.remote import RemoteScorer
from verl.rewards.sources import SourceReward

from .reward_loop_helpers import CharTokenizer, JsonServer, gen_batch


def _exact(path, body):
    return 200, {"score": float(body["response"] == body["ground_truth"]), "acc": 1.0}


def _scorer(server, **settings):
    mode = settings.pop("mode", "sample")
    batch_size = settings.pop("batch_size", 32)
    settings.setdefault("timeout_s", 5)
    return RemoteScorer(
        f"{server.url}/score", CharTokenizer(), HttpSettings(**settings), mode, batch_size
    )


def test_sample_mode_scores_each_response_in_order():
    with JsonServer(_exact) as server:
        scorer = _scorer(server)
        scores = scorer.score(
            gen_batch(["1", "2", "3", "4"], [1, 0, 3, 0], ["q1", "q2", "q3", "q4"])
        )
        scorer.close()
        sent = sorted(server.requests, key=lambda r: r[1]["question"])[0][1]
    assert scores.scores.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert scores.extras["acc"].tolist() == [1.0] * 4
    assert sent == {
        "data_source": "arithmetic",
        "question": "q1",
        "response": "1",
        "ground_truth": "1",
        "extra_info": None,
    }


def test_batch_mode_posts_batches_and_checks_their_length():
    def handler(path, body):
        scores = [float(s["response"] == s["ground_truth"]) for s in body["samples"]]
        if len(body["samples"]) == 1:  # the last, short batch: answered wrongly
            scores.append(1.0)
        return 200, {"scores": scores}

    with JsonServer(handler) as server:
        scorer = _scorer(server, mode="batch", batch_size=2)
        scores = scorer.score(gen_batch(["1", "2", "3", "4", "5"], [1, 0, 3, 4, 5]))
        scorer.close()
        assert len(server.requests) == 3
    assert scores.scores.tolist() == [1.0, 0.0, 1.0, 1.0, 0.0]
    assert scores.failures.tolist() == [None] * 4 + ["remote/malformed"]


def test_concurrency_limit_holds():
    def slow(path, body):
        time.sleep(0.05)
        return 200, {"score": 1.0}

    with JsonServer(slow) as server:
        scorer = _scorer(server, concurrency=3)
        scores = scorer.score(gen_batch(["x"] * 12, [1] * 12))
        scorer.close()
    assert scores.scores.tolist() == [1.0] * 12
    assert server.max_in_flight == 3


def test_timeouts_retries_and_kinds_are_counted():
    calls: dict[str, int] = {}

    def flaky(path, body):
        q = body["question"]
        calls[q] = calls.get(q, 0) + 1
        if q == "slow":
            time.sleep(0.6)
            return 200, {"score": 1.0}
        if q == "503 once" and calls[q] == 1:
            return 503, {"error": "busy"}
        if q == "400":
            return 400, {"error": "bad sample"}
        if q == "not json":
            return 200, b"<html>oops</html>"
        if q == "no score":
            return 200, {"value": 1}
        return 200, {"score": 0.5}

    questions = ["ok", "slow", "503 once", "400", "not json", "no score"]
    with JsonServer(flaky) as server:
        scorer = _scorer(server, timeout_s=0.3, max_retries=2, backoff_s=0.01)
        reward = SourceReward(scorer, max_failure_rate=None)
        _, metrics, extras = reward(gen_batch(["r"] * 6, [0] * 6, questions))
        reward.close()
    assert extras["score"].tolist() == [0.5, 0.0, 0.5, 0.0, 0.0, 0.0]
    assert extras["failure"].tolist() == [
        None,
        "remote/timeouts",
        None,
        "remote/http_status",
        "remote/malformed",
        "remote/malformed",
    ]
    assert calls["slow"] == 3  # a timeout is retried (twice)
    assert calls["503 once"] == 2  # a 503 is retried, then succeeds
    assert calls["400"] == 1 and calls["not json"] == 1  # neither is retried
    assert metrics["remote/timeouts"] == 1.0 and metrics["remote/http_status"] == 1.0
    assert metrics["remote/malformed"] == 2.0 and metrics["remote/errors"] == 0.0
    assert metrics["remote/retries"] == 3.0
    assert metrics["reward/failure_rate"] == pytest.approx(4 / 6)


def test_connection_refused_is_an_error_and_stops_the_run():
    with JsonServer(_exact) as server:
        url = server.url
    scorer = RemoteScorer(
        url, CharTokenizer(), HttpSettings(timeout_s=2, max_retries=1, backoff_s=0)
    )
    reward = SourceReward(scorer, max_failure_rate=0.5)
    with pytest.raises(RewardFailureError, match=r"remote failed on 2 of 2.*remote/errors"):
        reward(gen_batch(["1", "2"], [1, 2]))
    reward.close()


def test_rate_limit_spaces_requests():
    with JsonServer(lambda path, body: (200, {"score": 1.0})) as server:
        scorer = _scorer(server, concurrency=4, rate_limit=20.0)
        start = time.monotonic()
        scorer.score(gen_batch(["x"] * 8, [1] * 8))
        elapsed = time.monotonic() - start
        scorer.close()
        times = sorted(t for t, _ in server.requests)
    assert elapsed >= 7 / 20 * 0.95
    # The k-th request is sent no earlier than k intervals after the start, so the k-th
    # arrival (in arrival order) is no earlier either; gaps between arrivals themselves
    # shrink when a late-scheduled send catches up under load.
    for k, arrived in enumerate(times):
        assert arrived - start >= k / 20 * 0.95, (k, arrived - start)


def test_rate_limiter_and_backoff_are_bounded():
    now = [0.0]
    slept: list[float] = []
    limiter = RateLimiter(4.0, clock=lambda: now[0], sleep=slept.append)
    for _ in range(3):
        limiter.wait()
    assert slept == [0.25, 0.5]
    with JsonPoster(HttpSettings(backoff_s=0.5, max_backoff_s=2.0), seed=0) as poster:
        waits = [poster.backoff(a) for a in range(5)]
    for attempt, wait in enumerate(waits):
        cap = min(2.0, 0.5 * 2**attempt)
        assert cap * 0.5 <= wait <= cap


def test_api_key_comes_from_the_environment():
    assert bearer_headers("MY_KEY", {"MY_KEY": "s3cret"}) == {"Authorization": "Bearer s3cret"}
    assert bearer_headers(None) == {}
    with pytest.raises(KeyError, match="MY_KEY is not set"):
        bearer_headers("MY_KEY", {})


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="must be an http"):
        RemoteScorer("ftp://x", CharTokenizer())
    with pytest.raises(ValueError, match="concurrency=0"):
        HttpSettings(concurrency=0)
