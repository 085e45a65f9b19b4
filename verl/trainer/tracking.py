"""Metric trackers: console, jsonl file, tensorboard and wandb behind one `Tracker`.

The trainer calls ``tracker.log(metrics, step)`` once per step; each backend decides how to
show it. Console output goes through ``logging`` (one compact line per step); the jsonl
backend appends one JSON object per step, which is what tests and scripts read back.
TensorBoard and wandb are optional extras, imported only when asked for.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from verl.utils.atomic_io import write_text_atomic

logger = logging.getLogger(__name__)

_CONSOLE_KEYS = (
    "critic/score/mean",
    "reward/acc",
    "response_length/mean",
    "actor/pg_loss",
    "actor/entropy",
    "actor/kl_loss",
    "actor/grad_norm",
    "critic/vf_loss",
    "timing_s/step",
)


def _to_jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class _Console:
    def __init__(self) -> None:
        self._log = logging.getLogger("verl.metrics")

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        shown = [f"{k}={metrics[k]:.4g}" for k in _CONSOLE_KEYS if k in metrics]
        shown += [f"{k}={v:.4g}" for k, v in metrics.items() if k.startswith("val/") and "acc" in k]
        self._log.info("step %d | %s", step, " ".join(shown))

    def close(self) -> None:
        pass


class _Jsonl:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        record = {"step": step, **{k: _to_jsonable(v) for k, v in metrics.items()}}
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()

    def rewind(self, step: int) -> None:
        """Drop the rows of steps after ``step`` (and a row a kill cut short), atomically."""
        self._fh.close()
        kept, dropped = [], 0
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                keep = int(json.loads(line)["step"]) <= step
            except (ValueError, KeyError, TypeError):
                keep = False
            if keep:
                kept.append(line)
            else:
                dropped += 1
        if dropped:
            write_text_atomic(self.path, "".join(f"{line}\n" for line in kept))
            logger.info("%s: dropped %d row(s) after step %d (resumed)", self.path, dropped, step)
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def close(self) -> None:
        self._fh.close()


class _TensorBoard:
    def __init__(self, log_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "trainer.logger includes 'tensorboard' but tensorboard is not installed: "
                "pip install 'verl[tracking]' or pip install tensorboard"
            ) from exc
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for key, value in metrics.items():
            value = _to_jsonable(value)
            if isinstance(value, int | float):
                self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class _Wandb:
    def __init__(self, project: str, name: str, config: dict[str, Any] | None) -> None:
        try:
            import wandb
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "trainer.logger includes 'wandb' but wandb is not installed: "
                "pip install 'verl[tracking]' or pip install wandb"
            ) from exc
        self._run = wandb.init(project=project, name=name, config=config)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        self._run.log({k: _to_jsonable(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self._run.finish()


class Tracker:
    """Fan-out of metrics to the configured backends.

    Args:
        backends: names among ``console``, ``jsonl``, ``tensorboard``, ``wandb``.
        log_dir: directory for the jsonl file (``metrics.jsonl``) and tensorboard events.
        project / experiment: names used by wandb.
        config: the resolved config as a plain dict (sent to wandb).
    """

    KNOWN = ("console", "jsonl", "tensorboard", "wandb")

    def __init__(
        self,
        backends: Sequence[str],
        log_dir: str | os.PathLike[str] = "outputs",
        project: str = "verl",
        experiment: str = "run",
        config: dict[str, Any] | None = None,
    ) -> None:
        unknown = [b for b in backends if b not in self.KNOWN]
        if unknown:
            raise ValueError(f"unknown logger(s) {unknown}; choose from {list(self.KNOWN)}")
        log_dir = Path(log_dir)
        self.jsonl_path: Path | None = None
        self._backends: list[Any] = []
        for name in backends:
            if name == "console":
                self._backends.append(_Console())
            elif name == "jsonl":
                self.jsonl_path = log_dir / "metrics.jsonl"
                self._backends.append(_Jsonl(self.jsonl_path))
            elif name == "tensorboard":
                self._backends.append(_TensorBoard(log_dir / "tensorboard"))
            elif name == "wandb":
                self._backends.append(_Wandb(project, experiment, config))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for backend in self._backends:
            backend.log(metrics, step)

    def rewind(self, step: int) -> None:
        """Forget what was logged after ``step`` where a backend can (the jsonl file): a run
        resumed from the checkpoint of ``step`` logs the later steps again."""
        for backend in self._backends:
            if hasattr(backend, "rewind"):
                backend.rewind(step)

    def close(self) -> None:
        for backend in self._backends:
            backend.close()
        self._backends = []
