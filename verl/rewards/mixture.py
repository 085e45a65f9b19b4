"""A weighted mixture of reward sources as one source: ``score = sum_i w_i * score_i``.

    scorer = MixtureScorer({"rules": (RuleSource(manager), 0.5), "judge": (judge, 0.5)})
    reward = SourceReward(scorer, shaper=rules_manager)

The sources are scored concurrently (one thread each: the judge and a remote service wait
on the network, not on this process), each on the whole batch, then summed with their
weights; the result is shaped once, by the :class:`~verl.rewards.sources.SourceReward`
around the mixture. A response failed when any source failed on it (the first failing
source's kind is its ``failure``; each source's own kinds are all counted), so the failure
bound holds for the mixture as for one source. Per-source metrics: each source's own
(``rules/...``, ``judge/...``, ``remote/...``, ``model/...``) and
``reward/source/<name>/score_mean`` (raw) and ``.../weighted_mean`` (times its weight).
``acc`` comes from the first source that reports one (in the given order).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from verl.rewards.sources import SampleScorer, SourceScores

__all__ = ["MIXTURE_SOURCES", "MixtureScorer"]

MIXTURE_SOURCES = ("rules", "model", "judge", "remote")


class MixtureScorer(SampleScorer):
    """``sources``: name -> (source, weight), in the order their ``acc`` is looked for."""

    name = "mixture"
    hint = "fix the failing source named in the failure kind"

    def __init__(self, sources: Mapping[str, tuple[SampleScorer, float]]) -> None:
        if not sources:
            raise ValueError("a reward mixture needs at least one source")
        for name, (_, weight) in sources.items():
            if not isinstance(weight, int | float) or not np.isfinite(weight):
                raise ValueError(f"reward_model.mixture.{name}={weight!r} must be a finite number")
        self.sources = dict(sources)
        self._pool = ThreadPoolExecutor(len(self.sources), thread_name_prefix="reward-mixture")

    def score(self, batch: Any) -> SourceScores:
        futures = {n: self._pool.submit(s.score, batch) for n, (s, _) in self.sources.items()}
        parts = {name: future.result() for name, future in futures.items()}
        size = len(batch)
        total = np.zeros(size)
        failures: list[str | None] = [None] * size
        messages: list[str | None] = [None] * size
        extras: dict[str, np.ndarray] = {}
        counts: dict[str, float] = {}
        latencies: list[float] = []
        for name, part in parts.items():
            weight = float(self.sources[name][1])
            total += weight * part.scores
            for i, (kind, message) in enumerate(zip(part.failures, part.messages)):
                if kind is not None and failures[i] is None:
                    failures[i], messages[i] = kind, message
            if "acc" in part.extras and "acc" not in extras:
                extras["acc"] = part.extras["acc"]
            # each source's own counters, and its scores kept for its metrics
            counts |= {k: v for k, v in part.counts.items()}
            extras[f"source_score/{name}"] = part.scores.astype(np.float64)
            kinds = np.empty(size, dtype=object)
            kinds[:] = list(part.failures)
            extras[f"source_failure/{name}"] = kinds
            latency = np.full(size, np.nan)
            extras[f"source_latency/{name}"] = latency
            latency[: min(size, len(part.latencies))] = part.latencies[:size]
        return SourceScores(total, failures, messages, extras, latencies, counts)

    def metrics(self, scores: SourceScores) -> dict[str, float]:
        metrics = {"mixture/score_mean": float(scores.scores.mean()) if len(scores) else 0.0}
        for name, (source, weight) in self.sources.items():
            raw = scores.extras[f"source_score/{name}"]
            latency = scores.extras[f"source_latency/{name}"]
            part = SourceScores(
                raw,
                scores.extras[f"source_failure/{name}"],
                latencies=[float(t) for t in latency if not np.isnan(t)],
                counts={k: v for k, v in scores.counts.items() if k.startswith(f"{name}/")},
            )
            metrics |= source.metrics(part)
            mean = float(raw.mean()) if len(raw) else 0.0
            metrics[f"reward/source/{name}/score_mean"] = mean
            metrics[f"reward/source/{name}/weighted_mean"] = float(weight) * mean
        return metrics

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for source, _ in self.sources.values():
            source.close()
