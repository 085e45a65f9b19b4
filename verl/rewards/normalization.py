"""Running mean and standard deviation of rewards across batches (Welford / Chan et al.).

`RunningMeanStd.update(batch)` merges a whole batch at once with the parallel form of
Welford's algorithm, which is exact and numerically stable; `normalize(x)` returns
`(x - mean) / (std + eps)` with the population std. State round-trips through
`state_dict()` / `load_state_dict()` so a resumed run normalises exactly like an
uninterrupted one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


class RunningMeanStd:
    """Mean and population variance of every value seen so far, in float64."""

    def __init__(self, eps: float = 1e-8) -> None:
        self.eps = eps
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0  # sum of squared deviations from the mean

    @property
    def var(self) -> float:
        return self.m2 / self.count if self.count else 0.0

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    def update(self, values: np.ndarray) -> None:
        """Merge a batch of values (any shape; flattened) into the running statistics."""
        batch = np.asarray(values, dtype=np.float64).ravel()
        if batch.size == 0:
            return
        batch_count = int(batch.size)
        batch_mean = float(batch.mean())
        batch_m2 = float(((batch - batch_mean) ** 2).sum())
        total = self.count + batch_count
        delta = batch_mean - self.mean
        self.mean += delta * batch_count / total
        self.m2 += batch_m2 + delta * delta * self.count * batch_count / total
        self.count = total

    def normalize(self, values: np.ndarray) -> np.ndarray:
        """`(values - mean) / (std + eps)`, in float64."""
        return (np.asarray(values, dtype=np.float64) - self.mean) / (self.std + self.eps)

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, "m2": self.m2}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = {"count", "mean", "m2"} - set(state)
        if missing:
            raise KeyError(f"reward normaliser state is missing {sorted(missing)}")
        self.count = int(state["count"])
        self.mean = float(state["mean"])
        self.m2 = float(state["m2"])
