"""Metric trackers: console, jsonl file, tensorboard, wandb and mlflow behind one `Tracker`.

The trainer calls ``tracker.log(metrics, step)`` once per step; each backend decides how to
show it. Console output goes through ``logging`` (one compact line per step); the jsonl
backend appends one JSON object per step to ``metrics.jsonl``, which is what tests, scripts
and ``verl plot`` read back. TensorBoard, wandb and mlflow are optional extras, imported only
when asked for; a missing one names the extra that installs it.

``tracker.log_generations(samples, step)`` records validation samples (prompt, response,
score, ...) as a table: ``generations.jsonl`` lines, a tensorboard text table, a wandb
``Table``, an mlflow JSON artifact ``val_generations/step_N.json``.

mlflow writes to ``MLFLOW_TRACKING_URI`` when set, else to a local file store
``{log_dir}/mlruns`` (read it with ``mlflow ui --backend-store-uri {log_dir}/mlruns`` and
``MLFLOW_ALLOW_FILE_STORE=true``, which mlflow 3 asks for before it opens a file store).
On a file store ``/`` in a metric name becomes ``.`` (``critic.score.mean``): that store keeps
each name as a file path, where ``val/acc`` and ``val/acc/arith`` cannot both exist.

A backend that fails to write (``OSError``: a full disk, a lost mount, an unreachable
server) never ends the run: :class:`Tracker` logs one WARNING per backend naming it and the
reason, keeps training and keeps trying at the next steps (an INFO says when it works
again); :attr:`Tracker.failed_writes` counts what was lost. A ``metrics.jsonl`` row that did
not fit is cut back off the file, so the file never holds a torn row.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
import time
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

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        pass  # a table does not fit a log line; the other backends keep it

    def close(self) -> None:
        pass


class _Jsonl:
    """Appends one JSON line per record; a write that fails (a full disk) is cut back off
    the file before the error propagates, so no torn row stays behind."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh = open(path, "ab", buffering=0)  # noqa: SIM115 - closed in close()

    def _append(self, data: bytes) -> None:
        fd = self._fh.fileno()
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            try:
                os.ftruncate(fd, start)
            except OSError as err:  # pragma: no cover - the file system refuses a shrink
                logger.debug("could not cut a partial row off %s: %s", self.path, err)
            raise

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        record = {"step": step, **{k: _to_jsonable(v) for k, v in metrics.items()}}
        self._append((json.dumps(record) + "\n").encode("utf-8"))

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        for sample in samples:
            self.log(sample, step)

    def rewind(self, step: int) -> None:
        """Drop the rows of steps after ``step`` (and a row a kill cut short), atomically."""
        self._fh.close()
        try:
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
                logger.info(
                    "%s: dropped %d row(s) after step %d (resumed)", self.path, dropped, step
                )
        finally:
            self._fh = open(self.path, "ab", buffering=0)  # noqa: SIM115 - closed in close()

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

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        self._writer.add_text("val/generations", markdown_table(samples), step)
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

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        import wandb

        columns = _columns(samples)
        rows = [[_to_jsonable(s.get(c)) for c in columns] for s in samples]
        self._run.log({"val/generations": wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self._run.finish()


_MLFLOW_KEY_BAD = re.compile(r"[^A-Za-z0-9_\-. /]")


class _Mlflow:
    """One mlflow run (experiment = project, run name = experiment) through ``MlflowClient``:
    no process-global active run, so two trackers never write into each other's run."""

    def __init__(
        self, log_dir: Path, project: str, name: str, config: dict[str, Any] | None
    ) -> None:
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (log_dir / "mlruns").resolve().as_uri()
        self.file_store = uri.startswith("file:") or "://" not in uri
        if self.file_store:
            # mlflow 3 keeps the file store behind this switch; the default here is one
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as exc:
            raise ImportError(
                "trainer.logger includes 'mlflow' but mlflow is not installed: "
                "pip install 'verl[mlflow]' (mlflow-skinny) or pip install mlflow"
            ) from exc
        self.tracking_uri = uri
        self._client = MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name(project)
        experiment_id = (
            experiment.experiment_id if experiment else self._client.create_experiment(project)
        )
        self.run_id = self._client.create_run(experiment_id, run_name=name).info.run_id
        if config:
            from mlflow.entities import Param

            params = [Param(k, str(v)[:500]) for k, v in _flatten(config).items()]
            for start in range(0, len(params), 100):  # mlflow's limit per batch
                self._client.log_batch(self.run_id, params=params[start : start + 100])

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = []
        for key, value in metrics.items():
            value = _to_jsonable(value)
            if isinstance(value, int | float) and not isinstance(value, bool):
                batch.append(Metric(self.metric_name(key), float(value), now, step))
        for start in range(0, len(batch), 1000):  # mlflow's limit per batch
            self._client.log_batch(self.run_id, metrics=batch[start : start + 1000])

    def metric_name(self, key: str) -> str:
        """``key`` as mlflow accepts it: characters mlflow rejects become ``_``; on a file
        store ``/`` becomes ``.`` (it keeps each name as a path, so ``val/acc`` and
        ``val/acc/arith`` would be a file and a directory of one name)."""
        key = _MLFLOW_KEY_BAD.sub("_", key)
        return key.replace("/", ".") if self.file_store else key

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        columns = _columns(samples)
        table = {
            "columns": columns,
            "data": [[_to_jsonable(s.get(c)) for c in columns] for s in samples],
        }
        self._client.log_dict(self.run_id, table, f"val_generations/step_{step:06d}.json")

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out |= _flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _columns(samples: Sequence[Mapping[str, Any]]) -> list[str]:
    """The union of the samples' keys, in first-seen order."""
    return list(dict.fromkeys(k for s in samples for k in s))


def markdown_table(samples: Sequence[Mapping[str, Any]]) -> str:
    """``samples`` as a Markdown table (one row each; ``|`` and newlines escaped)."""
    columns = _columns(samples)

    def cell(value: Any) -> str:
        text = str(_to_jsonable(value))
        return text.replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(s.get(c, "")) for c in columns) + " |" for s in samples]
    return "\n".join(lines)


def _backend_name(backend: Any) -> str:
    if isinstance(backend, _Jsonl):
        return str(backend.path)
    return type(backend).__name__.lstrip("_").lower()


class Tracker:
    """Fan-out of metrics to the configured backends (a backend's ``OSError`` is a warning,
    never the end of the run: see the module docstring).

    Args:
        backends: names among ``console``, ``jsonl``, ``tensorboard``, ``wandb``, ``mlflow``.
        log_dir: directory for the jsonl files (``metrics.jsonl``, ``generations.jsonl``),
            tensorboard events and the default mlflow store (``mlruns/``).
        project / experiment: names used by wandb and mlflow (project = mlflow experiment).
        config: the resolved config as a plain dict (sent to wandb, mlflow parameters).
    """

    KNOWN = ("console", "jsonl", "tensorboard", "wandb", "mlflow")

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
        self.mlflow_run_id: str | None = None
        self.mlflow_tracking_uri: str | None = None
        self._backends: list[Any] = []
        self._generation_backends: list[Any] = []
        # backend name -> writes that failed (OSError); see _write
        self.failed_writes: dict[str, int] = {}
        self._warned: set[int] = set()
        self._failing: set[int] = set()
        for name in backends:
            if name == "console":
                self._backends.append(_Console())
            elif name == "jsonl":
                self.jsonl_path = log_dir / "metrics.jsonl"
                self._backends.append(_Jsonl(self.jsonl_path))
                # generations in their own file: metrics.jsonl stays one row per step
                self._generation_backends.append(_Jsonl(log_dir / "generations.jsonl"))
            elif name == "tensorboard":
                self._backends.append(_TensorBoard(log_dir / "tensorboard"))
            elif name == "wandb":
                self._backends.append(_Wandb(project, experiment, config))
            elif name == "mlflow":
                run = _Mlflow(log_dir, project, experiment, config)
                self.mlflow_run_id, self.mlflow_tracking_uri = run.run_id, run.tracking_uri
                self._backends.append(run)

    def _write(self, backend: Any, method: str, *args: Any) -> None:
        """``backend.method(*args)``; an ``OSError`` is reported (once per backend) and
        counted, never raised: a log line must not end the run."""
        key = id(backend)
        try:
            getattr(backend, method)(*args)
        except OSError as err:
            self.failed_writes[_backend_name(backend)] = (
                self.failed_writes.get(_backend_name(backend), 0) + 1
            )
            if key not in self._warned:
                self._warned.add(key)
                full = " (the disk is full)" if err.errno == errno.ENOSPC else ""
                logger.warning(
                    "logging to %s failed%s: %s. Training continues; what this backend "
                    "cannot write is lost (warned once; later failures are counted in "
                    "Tracker.failed_writes)",
                    _backend_name(backend),
                    full,
                    err,
                )
            self._failing.add(key)
            return
        if key in self._failing:
            self._failing.discard(key)
            logger.info("logging to %s works again", _backend_name(backend))

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        for backend in self._backends:
            self._write(backend, "log", metrics, step)

    def log_generations(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        """Record validation ``samples`` (dicts such as prompt / response / score) of ``step``
        as a table in every backend that keeps tables (see the module docstring)."""
        if not samples:
            return
        for backend in self._backends:
            if not isinstance(backend, _Jsonl):
                self._write(backend, "log_generations", samples, step)
        for backend in self._generation_backends:
            self._write(backend, "log_generations", samples, step)

    def rewind(self, step: int) -> None:
        """Forget what was logged after ``step`` where a backend can (the jsonl file): a run
        resumed from the checkpoint of ``step`` logs the later steps again."""
        for backend in self._backends + self._generation_backends:
            if hasattr(backend, "rewind"):
                self._write(backend, "rewind", step)

    def close(self) -> None:
        for backend in self._backends + self._generation_backends:
            self._write(backend, "close")
        self._backends = []
        self._generation_backends = []
