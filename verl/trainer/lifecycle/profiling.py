"""Where a step's time goes: the torch profiler on chosen steps, a stage table every step.

``trainer.profile_steps=[2, 5]`` records steps 2 and 5 with ``torch.profiler`` (CPU
activity, plus CUDA when a GPU is in use) and writes each as a Chrome trace,
``{trainer.log_dir}/profile_step_N.json`` (open it in ``chrome://tracing`` or Perfetto). The
trace covers the processes of the driver: everything with the ``local`` backend; with the
``ray`` backend the workers run elsewhere and the driver's trace shows the calls' spans.

Every step, the stage timings the loop records (``timing_s/gen``, ``timing_s/old_log_prob``,
``timing_s/update_actor``, ..., ``timing_s/step``) are logged as one line at INFO, each
stage with its share of the step, and ``timing_s/other`` (the step minus its stages: the
loop's own overhead) is added to the metrics.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

# stages nested inside another stage's timer: not added again to the step's sum
_NESTED = frozenset({"timing_s/testing"})


class StepProfiler:
    """Runs training steps, profiling those in ``steps`` into ``out_dir``."""

    def __init__(self, steps: Iterable[int], out_dir: str | Path) -> None:
        steps = list(steps)
        bad = [s for s in steps if not isinstance(s, int) or isinstance(s, bool) or s < 1]
        if bad:
            raise ValueError(
                f"trainer.profile_steps={steps}: {bad} are not step numbers; give training "
                "steps counted from 1, e.g. [2, 5]"
            )
        self.steps = frozenset(steps)
        self.out_dir = Path(out_dir)
        self.traces: list[Path] = []

    def run(self, step: int, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """``fn()`` (one training step returning its metrics), profiled when ``step`` is in
        ``steps``; adds ``timing_s/other`` and logs the stage table."""
        with self._profile(step):
            metrics = fn()
        add_overhead(metrics)
        logger.info("step %d: %s", step, timing_table(metrics))
        return metrics

    @contextlib.contextmanager
    def _profile(self, step: int):
        if step not in self.steps:
            yield
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            yield
        path = self.out_dir / f"profile_step_{step}.json"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        self.traces.append(path)
        logger.info("step %d: torch profiler trace written to %s", step, path)


def add_overhead(metrics: dict[str, Any]) -> None:
    """``timing_s/other``: the step's time outside its timed stages (when it has a step)."""
    if "timing_s/step" not in metrics:
        return
    stages = sum(
        v
        for k, v in metrics.items()
        if k.startswith("timing_s/") and k not in _NESTED and k not in ("timing_s/step",)
    )
    metrics["timing_s/other"] = max(metrics["timing_s/step"] - stages, 0.0)


def timing_table(metrics: dict[str, Any]) -> str:
    """``gen 9.80s (25%) | update_actor 23.80s (61%) | ... | step 39.10s``."""
    step = metrics.get("timing_s/step")
    parts = []
    for key, value in metrics.items():
        if not key.startswith("timing_s/") or key == "timing_s/step":
            continue
        share = f" ({100 * value / step:.0f}%)" if step else ""
        parts.append(f"{key.removeprefix('timing_s/')} {value:.2f}s{share}")
    if step is not None:
        parts.append(f"step {step:.2f}s")
    return " | ".join(parts)
