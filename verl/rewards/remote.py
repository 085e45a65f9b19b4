"""Rewards from a scoring service of one's own, over HTTP (JSON in, JSON out).

    scorer = RemoteScorer("http://127.0.0.1:9000/score", tokenizer, HttpSettings(...))
    reward = SourceReward(scorer, shaper=rules_manager)

One sample per request (``mode="sample"``, the default)::

    POST url  {"data_source": ..., "question": ..., "response": ..., "ground_truth": ...,
               "extra_info": ...}
    -> {"score": 0.7, "acc": 1.0}           # "acc" optional

or a batch per request (``mode="batch"``, ``batch_size`` samples each)::

    POST url  {"samples": [<sample>, ...]}
    -> {"scores": [0.7, ...]}               # or {"results": [{"score": ...}, ...]}

Requests run through :class:`~verl.rewards.http.JsonPoster`: at most ``concurrency`` in
flight, each with ``timeout_s``, retried with backoff and jitter, spaced by ``rate_limit``.
Every failed sample scores 0 and is counted by kind: ``remote/timeouts``,
``remote/http_status``, ``remote/malformed`` (not JSON, no numeric ``score``, a non-finite
score, a score list of the wrong length) and ``remote/errors`` (connection failures); a
failed batch request fails each of its samples. Retries are counted in ``remote/retries``
and latencies per request in ``remote/latency_s_mean`` / ``_max``. Failures are bounded
like rule failures (:class:`~verl.rewards.sources.SourceReward`).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from verl.rewards.http import HttpOutcome, HttpSettings, JsonPoster
from verl.rewards.sources import SampleScorer, SourceScores, sample_texts

__all__ = ["REMOTE_MODES", "RemoteScorer"]

REMOTE_MODES = ("sample", "batch")


def _plain(value: Any) -> Any:
    """numpy values as JSON-writable Python ones."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


class RemoteScorer(SampleScorer):
    """A scoring service as a reward source (see the module docstring).

    Args:
        url: where to POST.
        tokenizer: the actor's tokenizer (decodes responses and prompts).
        settings: concurrency, timeout, retries, backoff, rate limit, headers.
        mode: "sample" (one sample per request) or "batch".
        batch_size: samples per request in batch mode.
    """

    name = "remote"
    hint = "check the scoring service at reward_model.remote.url (docs/judge.md)"

    def __init__(
        self,
        url: str,
        tokenizer: Any,
        settings: HttpSettings | None = None,
        mode: str = "sample",
        batch_size: int = 32,
    ) -> None:
        if not url or not url.startswith(("http://", "https://")):
            raise ValueError(f"reward_model.remote.url={url!r} must be an http(s):// URL")
        if mode not in REMOTE_MODES:
            raise ValueError(f"reward_model.remote.mode={mode!r} is not one of {REMOTE_MODES}")
        if batch_size < 1:
            raise ValueError(f"reward_model.remote.batch_size={batch_size} must be >= 1")
        self.url = url
        self.tokenizer = tokenizer
        self.mode = mode
        self.batch_size = batch_size
        self.poster = JsonPoster(settings)

    def samples(self, batch: Any) -> list[dict[str, Any]]:
        """The JSON sample of every response of ``batch``."""
        t = sample_texts(batch, self.tokenizer)
        return [
            {
                "data_source": _plain(s),
                "question": q,
                "response": r,
                "ground_truth": _plain(g),
                "extra_info": _plain(e),
            }
            for s, q, r, g, e in zip(
                t.data_sources, t.questions, t.responses, t.references, t.extra_infos
            )
        ]

    def score(self, batch: Any) -> SourceScores:
        samples = self.samples(batch)
        size = len(samples)
        scores = np.zeros(size)
        acc = np.full(size, np.nan, dtype=np.float32)
        failures: list[str | None] = [None] * size
        messages: list[str | None] = [None] * size

        def fail(i: int, kind: str, message: str | None) -> None:
            failures[i], messages[i] = f"remote/{kind}", message

        def take(i: int, result: Any) -> None:
            score = _number(result.get("score")) if isinstance(result, dict) else None
            if score is None:
                fail(i, "malformed", f"no finite numeric 'score' in {str(result)[:200]}")
                return
            scores[i] = score
            value = _number(result.get("acc"))
            if value is not None:
                acc[i] = value

        if self.mode == "sample":
            groups = [[i] for i in range(size)]
            outcomes = self.poster.post_many(self.url, samples)
        else:
            groups = [
                list(range(s, min(s + self.batch_size, size)))
                for s in range(0, size, self.batch_size)
            ]
            bodies = [{"samples": [samples[i] for i in g]} for g in groups]
            outcomes = self.poster.post_many(self.url, bodies)
        for rows, outcome in zip(groups, outcomes):
            self._read(rows, outcome, fail, take)
        extras = {} if np.isnan(acc).all() else {"acc": acc}
        retries = float(sum(o.attempts - 1 for o in outcomes))
        return SourceScores(
            scores,
            failures,
            messages,
            extras=extras,
            latencies=[o.latency_s for o in outcomes],
            counts={"remote/retries": retries},
        )

    def _read(self, rows: list[int], outcome: HttpOutcome, fail: Any, take: Any) -> None:
        if not outcome.ok:
            for i in rows:
                fail(i, outcome.failure, outcome.message)
            return
        body = outcome.body
        if self.mode == "sample":
            take(rows[0], body)
            return
        results = None
        if isinstance(body, dict) and isinstance(body.get("scores"), list):
            results = [{"score": s} for s in body["scores"]]
        elif isinstance(body, dict) and isinstance(body.get("results"), list):
            results = body["results"]
        if results is None or len(results) != len(rows):
            got = "no 'scores' or 'results' list" if results is None else f"{len(results)}"
            for i in rows:
                fail(i, "malformed", f"batch of {len(rows)} samples answered with {got}")
            return
        for i, result in zip(rows, results):
            take(i, result)

    def metrics(self, scores: SourceScores) -> dict[str, float]:
        metrics = super().metrics(scores)
        for kind in ("timeouts", "http_status", "malformed", "errors"):
            metrics.setdefault(f"remote/{kind}", 0.0)
        return metrics

    def close(self) -> None:
        self.poster.close()
