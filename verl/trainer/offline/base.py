"""The skeleton shared by the offline trainers (SFT, DPO / IPO / KTO, reward models): set-up,
the step, its data and its model; the run around the step (lock, signals, resume, validation
schedule, logging, checkpoints, divergence, the final export) is :mod:`verl.trainer.lifecycle.driver`,
as for RL. A subclass supplies :meth:`OfflineTrainer.train_step` (its loss over one batch of
micro-batches) and :meth:`OfflineTrainer.evaluate`; checkpoints hold the engine, the data
position and the RNG, written and read by the RL trainer's
:class:`~verl.trainer.lifecycle.resume.RunCheckpointer` (:attr:`OfflineTrainer.checkpointer`,
:mod:`verl.trainer.offline.checkpoint`).

One process, or SPMD over the ranks of a ``torch.distributed`` group (``engine.strategy``
``fsdp2``, started by ``verl.trainer.offline.launch``): every rank builds the same trainer,
reads the same batches and takes its contiguous share of each step's micro-batches; rank 0
alone logs, holds the run lock and writes the files other than the engine shards.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from verl.config import DPOConfig, SFTConfig, to_dict
from verl.data import PromptDataLoader
from verl.engine import OptimSpec, TrainEngine, build_engine
from verl.models import checkpoint_if_configured, load_causal_lm, load_tokenizer
from verl.models.lora import apply_lora, lora_spec_from_config
from verl.models.precision import resolve_dtype
from verl.trainer.lifecycle import driver, final_export
from verl.trainer.lifecycle.checkpoint import CheckpointError, CheckpointManager
from verl.trainer.lifecycle.resume import RoleSettings, RunCheckpointer, resume_checkpoint_path
from verl.trainer.lifecycle.run_lock import RunLock
from verl.trainer.lifecycle.setup import NotSupportedYet, seed_everything
from verl.trainer.lifecycle.stopping import StepHealth, StopRequests, nonfinite_error
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.offline.checkpoint import OFFLINE_IDENTITY_KEYS, POLICY_ROLE, LocalEngineRole
from verl.trainer.offline.config_checks import ranks_named
from verl.utils.device import resolve_device
from verl.workers.common import save_hf_model

logger = logging.getLogger(__name__)

__all__ = ["MicroBatchCollate", "OfflineTrainer"]


class OfflineTrainer:
    """Shared skeleton of the offline trainers (SFT, DPO): set-up, loop, logging, saving.

    A subclass sets :attr:`kind`, builds ``self.train_loader`` (yielding lists of
    micro-batches) in :meth:`build_data`, and implements :meth:`train_step` and
    :meth:`evaluate` (and :meth:`prepare`, run at the end of ``__init__``, if it needs the
    built model; :meth:`build_model` if it trains something other than a causal LM).

    Args:
        config: an :class:`~verl.config.SFTConfig` or :class:`~verl.config.DPOConfig`.
        model: an ``nn.Module`` to train instead of loading ``model.path``.
        tokenizer: a tokenizer to use instead of loading one from the model path.
        tracker: where metrics go (default: built from ``trainer.logger``).
    """

    kind = "offline"
    # sequences one row of data.micro_batch_size_per_device is (a preference pair: two)
    sequences_per_row = 1
    console_keys: tuple[str, ...] = ("train/loss", "train/grad_norm", "train/lr")

    def __init__(
        self,
        config: SFTConfig | DPOConfig,
        *,
        model: torch.nn.Module | None = None,
        tokenizer: Any = None,
        tracker: Tracker | None = None,
    ) -> None:
        config.validate(registries=self.registries())
        self.rank, self.world_size = _dist_layout()
        self.strategy = self._check_strategy(config)
        self.config = config
        t = config.trainer
        seed_everything(t.seed)
        if t.num_threads:
            torch.set_num_threads(t.num_threads)
        names = {"project_name": t.project_name, "experiment_name": t.experiment_name}
        self.output_dir = Path(os.path.expanduser(t.default_local_dir.format(**names)))
        self.log_dir = Path(os.path.expanduser(t.log_dir.format(**names)))
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # One run per directory (rank 0 holds the lock for all ranks): fail now if another
        # run holds it; train() takes it.
        self.run_lock = RunLock([self.output_dir, self.log_dir]) if self.rank == 0 else None
        if self.run_lock is not None:
            self.run_lock.check()
        self.checkpoints = CheckpointManager(self.output_dir, t.max_ckpt_to_keep)
        self.device = resolve_device(t.device)

        m = config.model
        self.tokenizer = tokenizer or load_tokenizer(
            m.tokenizer_path or m.path, trust_remote_code=m.trust_remote_code
        )
        if self.tokenizer.pad_token_id is None:
            raise ValueError(
                "the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token"
            )

        self.val_dataset: Any = None  # build_data sets it when there is validation data
        with self.rank0_first():  # the built-in data is written once
            self.build_data()
        steps_per_epoch = len(self.train_loader)
        self.total_steps = t.total_training_steps or steps_per_epoch * t.total_epochs

        model = self.build_model(model)
        checkpoint_if_configured(
            model,
            m.enable_gradient_checkpointing,
            self.sequences_per_row
            * config.data.micro_batch_size_per_device
            * config.data.max_length,
            "model.enable_gradient_checkpointing",
        )
        self.engine: TrainEngine = build_engine(
            self.strategy,
            module=model,
            optim=OptimSpec.from_config(config.optim, total_steps=self.total_steps),
            grad_clip=config.engine.grad_clip,
            device=self.device,
            **self.engine_overrides(),
        )
        # The console line is written here (offline metrics are not in Tracker's PPO keys).
        self.is_main_rank = self.rank == 0  # logs, shows the progress bar
        self._console = "console" in t.logger and self.rank == 0
        backends = [b for b in t.logger if b != "console"] if self.rank == 0 else []
        self.tracker = tracker or Tracker(
            backends,
            log_dir=self.log_dir,
            project=t.project_name,
            experiment=t.experiment_name,
            config=to_dict(config),
        )
        self.global_step = 0
        self.history: list[dict[str, Any]] = []
        self.validation_history: list[dict[str, Any]] = []
        self._batches: Any = None  # the loader's batches, epoch after epoch (run_step)
        self.resumed_from: Path | None = None
        self.last_checkpoint: Path | None = None
        self._resume_checked = False
        self._stop = StopRequests()
        # Several ranks: the launcher's stop requests (the driver's signals), polled by rank 0
        # after each step and broadcast, so every rank stops after the same step.
        self.stop_source: Callable[[], int | None] | None = None
        self.prepare()

    # ------------------------------------------------------------------ hooks
    def registries(self) -> dict[str, list[str]]:
        """Registry-backed config keys and their allowed names (checked by ``validate``)."""
        return {}

    def build_data(self) -> None:
        """Set ``self.train_loader`` (and any validation data)."""
        raise NotImplementedError

    def build_model(self, model: torch.nn.Module | None) -> torch.nn.Module:
        """The module to train: ``model``, or ``model.path`` loaded as a causal LM; with
        LoRA adapters when ``model.lora_rank > 0``."""
        m = self.config.model
        if model is None:
            model = load_causal_lm(
                m.path,
                dtype=resolve_dtype(m.dtype),
                trust_remote_code=m.trust_remote_code,
                override_config=m.override_config,
            )
        lora = lora_spec_from_config(m)
        if lora is not None:  # only the adapters train; DPO's reference is the initial model
            model = apply_lora(model, lora)
        return model

    def engine_overrides(self) -> dict[str, Any]:
        """Fields of :class:`~verl.engine.options.EngineOptions` this trainer sets beyond
        the shared ones (grad_clip, device), e.g. its autocast dtype."""
        return {}

    def prepare(self) -> None:
        """Work done once the model is built, before any update (e.g. reference log-probs)."""

    def train_step(self, micro_batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
        """One optimizer step over a batch given as micro-batches; returns its metrics."""
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:
        """Validation metrics (``val/...``), or {} without validation data."""
        return {}

    # ------------------------------------------------------------------ set-up helpers
    def _check_strategy(self, config: SFTConfig | DPOConfig) -> str:
        """The engine strategy: single in one process, fsdp2 over a process group of
        ``trainer.nnodes x trainer.n_gpus_per_node`` ranks (``verl.trainer.offline.launch``
        starts it)."""
        if config.trainer.world_size != self.world_size:
            raise ValueError(
                f"{ranks_named(config.trainer)} but this process is one of "
                f"{self.world_size}: start several ranks with "
                "verl.trainer.offline.launch.train_on_ranks (or python -m "
                "verl.trainer.main_sft / main_dpo), or set trainer.n_gpus_per_node=1"
            )
        strategy = config.engine.strategy
        if strategy == "auto":
            strategy = "fsdp2" if self.world_size > 1 else "single"
        if strategy == "fsdp2" and self.world_size == 1 and not dist.is_initialized():
            # FSDP2 over one rank shards nothing: one process's training, as upstream's
            # torchrun --nproc-per-node=1 with engine.strategy=fsdp2 trains
            logger.warning(
                "engine.strategy=fsdp2 on one rank trains as engine.strategy=single (FSDP2 "
                "over one rank shards nothing; the same training)"
            )
            strategy = "single"
        if strategy == "fsdp2" and not dist.is_initialized():
            raise NotSupportedYet(
                "engine.strategy=fsdp2 runs in a torch.distributed process group; "
                "set trainer.n_gpus_per_node (the ranks run on Ray workers), or use "
                "engine.strategy=single (or auto) in one process"
            )
        if strategy == "single" and self.world_size > 1:
            raise ValueError(
                f"engine.strategy=single on {self.world_size} ranks: each rank would train "
                "its own copy; use engine.strategy=fsdp2 (or auto)"
            )
        return strategy

    def make_loader(
        self, dataset: Any, collate: Any, batch_size: int, shuffle: bool, seed: int
    ) -> PromptDataLoader:
        """A resumable loader of full batches (the remainder carries into the next epoch)."""
        if len(dataset) < batch_size:
            raise ValueError(
                f"the training set has {len(dataset)} rows/sequences, fewer than "
                f"data.train_batch_size={batch_size}: no full step can be made; lower the "
                "batch size or add data"
            )
        return PromptDataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=True,
            collate_fn=collate,
        )

    def builtin_dir(self) -> Path:
        return self.output_dir / "data"

    def data_files(
        self, write_builtin: Callable[..., tuple[Any, Any]], what: str
    ) -> tuple[list[str], list[str]]:
        """``(train files, validation files)``: ``data.train_files`` / ``data.val_files``, or
        with ``data.builtin=arithmetic`` and no train files the built-in set ``what``, written
        by ``write_builtin(dir, train_size, val_size, digits, ops, seed)`` under
        :meth:`builtin_dir` (its validation file unless ``data.val_files`` names one)."""
        d = self.config.data
        train_files, val_files = list(d.train_files), list(d.val_files)
        if not train_files and d.builtin == "arithmetic":
            a = d.arithmetic
            train_path, val_path = write_builtin(
                self.builtin_dir(), a.train_size, a.val_size, a.digit_range, list(a.ops), d.seed
            )
            logger.info("built-in arithmetic %s: %s, %s", what, train_path, val_path)
            train_files = [train_path]
            if not val_files and val_path is not None:
                val_files = [val_path]
        return train_files, val_files

    # ------------------------------------------------------------------ ranks
    @contextlib.contextmanager
    def rank0_first(self) -> Iterator[None]:
        """Rank 0 runs the block before the others (e.g. writes files they then read)."""
        if self.world_size > 1 and self.rank != 0:
            dist.barrier()
        yield
        if self.world_size > 1 and self.rank == 0:
            dist.barrier()

    def local_share(self, micro_batches: list[Any], scales: list[float]) -> tuple[list, list]:
        """This rank's contiguous share of a step's micro-batches, with their loss scales
        multiplied by the world size (FSDP2 averages gradients over the ranks, so the sum
        over all ranks of ``scale_i * loss_i`` is the step's loss)."""
        per_rank = len(micro_batches) // self.world_size
        lo = self.rank * per_rank
        return (
            micro_batches[lo : lo + per_rank],
            [s * self.world_size for s in scales[lo : lo + per_rank]],
        )

    def all_sum(self, value: float) -> float:
        """``value`` summed over the ranks (itself in one process)."""
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` in rank order (``[obj]`` in one process)."""
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (``obj`` itself in one process)."""
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    # ------------------------------------------------------------------ the run
    def train(self) -> dict[str, Any]:
        """Resume (``trainer.resume_mode``), train to ``total_steps`` optimizer steps with
        checkpoints every ``trainer.save_freq`` steps, validate, save; return the results
        (:func:`verl.trainer.lifecycle.driver.run`, the run lifecycle RL shares).

        Results: ``history`` (metrics per step of this process's run: a resumed run starts
        after its checkpoint), ``val_history``, ``last_metrics``, ``val_before`` (not when
        resumed) / ``val_after`` (when there is validation data), ``checkpoint`` (the last
        one saved), ``hf_dir`` and ``resumed_from``.
        """
        results = driver.run(self)
        results["resumed_from"] = str(self.resumed_from) if self.resumed_from else None
        results["history"] = self.history
        results["val_history"] = self.val_history
        results["last_metrics"] = self.history[-1] if self.history else {}
        return results

    # the driver's hooks (verl.trainer.lifecycle.driver.Trainee)
    def run_step(self) -> dict[str, Any]:
        """One optimizer step over the loader's next batch (epoch after epoch)."""
        if self._batches is None:
            self._batches = driver.epochs(self.train_loader)
        micro_batches = next(self._batches)
        start = time.perf_counter()
        metrics = self.train_step(micro_batches)
        metrics["timing_s/step"] = time.perf_counter() - start
        metrics["train/epoch"] = self.train_loader.epoch
        return metrics

    def step_health(self) -> StepHealth:
        """A step whose loss is not finite is never checkpointed, and ends the run when it
        is the final one (the model would be neither validated nor exported)."""
        return StepHealth(
            lambda metrics: not math.isfinite(metrics.get("train/loss", 0.0)), _nonfinite_error
        )

    def has_validation(self) -> bool:
        return self.val_dataset is not None

    def validate(self) -> dict[str, float]:
        return self.evaluate()

    def stop_requests(self) -> StopRequests | None:
        """One process handles SIGTERM / SIGINT itself; several ranks get the launcher's
        forwarded requests through :meth:`stop_signum`."""
        return self._stop if self.world_size == 1 else None

    def stop_signum(self) -> int | None:
        """The signal that asked the run to stop after this step, or None; every rank
        gets rank 0's answer."""
        if self.world_size == 1:
            return self._stop.signum
        return self.broadcast(self.stop_source() if self.stop_source is not None else None)

    @property
    def val_history(self) -> list[dict[str, Any]]:
        """The validations of this run (``{"step": N, "val/...": ...}``)."""
        return self.validation_history

    def export(self) -> dict[str, Any]:
        """The model as a HF directory in ``{default_local_dir}/huggingface``. In one
        process a failed export saves a checkpoint instead (:mod:`verl.trainer.lifecycle.final_export`);
        on several ranks the export is collective and a failure ends the run."""
        out_root = self.output_dir
        if self.world_size > 1:
            return {"hf_dir": str(self.save_hf(out_root / "huggingface"))}
        need = final_export.estimated_export_bytes(self.config.model)
        return final_export.export_final_model(self, out_root, need)

    def close(self) -> None:
        """Flush the trackers and release the run lock (idempotent)."""
        self.tracker.close()
        if self.run_lock is not None:
            self.run_lock.release()

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Send ``metrics`` to the trackers and, with the console logger, one line to logging."""
        self.tracker.log(metrics, step)
        if self._console:
            keys = [k for k in self.console_keys if k in metrics]
            keys += [k for k in metrics if k.startswith("val/") and k not in keys]
            shown = " ".join(f"{k}={metrics[k]:.4g}" for k in keys)
            logging.getLogger("verl.metrics").info("step %d | %s", step, shown)

    # ------------------------------------------------------------------ checkpoints
    def resume(self) -> Path | None:
        """Load the checkpoint ``trainer.resume_mode`` asks for; returns its path, or None
        for a fresh start. Runs once (``train`` calls it); rank 0 picks the checkpoint
        (removing temporary directories of interrupted saves) and every rank loads it."""
        if self._resume_checked:
            return self.resumed_from
        self._resume_checked = True
        path, error = None, None
        if self.rank == 0:
            try:
                self.checkpoints.clean_stale_temporaries()
                path = resume_checkpoint_path(self.config, self.checkpoints)
            except CheckpointError as err:
                error = err
        found = self.broadcast(None if error else (str(path) if path else ""))
        if error is not None:
            raise error
        if found is None:
            raise CheckpointError("rank 0 could not find the checkpoint to resume from")
        if found:
            self.load_checkpoint(found, verify=False)  # resume_checkpoint_path verified it
        return self.resumed_from

    def load_checkpoint(self, path: str | Path, verify: bool = True) -> None:
        """Restore the state saved by :meth:`save_checkpoint` at ``path`` (every file checked
        against the manifest's CRC-32 unless ``verify=False``). Collective."""
        self.checkpointer.load(path, verify=verify)
        self.resumed_from = Path(path)
        self._resume_checked = True
        # Metric rows of steps after the checkpoint belong to the rolled-back steps.
        self.tracker.rewind(self.global_step)

    def save_checkpoint(self) -> Path:
        """Save the complete run state after step ``global_step`` to
        ``{trainer.default_local_dir}/global_step_{N}`` (atomically); returns that path.
        Collective."""
        self.last_checkpoint = self.checkpointer.save(self.global_step)
        return self.last_checkpoint

    @property
    def checkpointer(self) -> RunCheckpointer:
        """The run's stateful parts, composed for saving and loading as the RL trainer's
        are: the progress (this trainer), the data loader, the policy engine in the actor's
        place; the ranks save and load together."""
        policy = LocalEngineRole(
            self.engine, self.tokenizer, rank=self.rank, world_size=self.world_size
        )
        return RunCheckpointer(
            self.config,
            self.checkpoints,
            progress=self,
            components={"dataloader": self.train_loader},
            roles={POLICY_ROLE: policy},
            role_settings={POLICY_ROLE: RoleSettings(self.strategy, "engine.strategy")},
            kind=self.kind,
            identity_keys=OFFLINE_IDENTITY_KEYS,
            drivers=self,
        )

    def state_dict(self) -> dict[str, Any]:
        """The run's progress (the checkpoint's top-level counters)."""
        return {
            "global_step": self.global_step,
            "total_steps": self.total_steps,
            "epoch": self.train_loader.epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step = int(state["global_step"])

    def save_hf(self, out_dir: str | Path) -> Path:
        """Save the model and tokenizer as a HF directory (atomically: temp dir + rename).
        Collective: rank 0 writes the weights every rank gathers."""
        full = self.engine.state_dict_for_save() if self.strategy == "fsdp2" else None
        path = Path(out_dir)
        if self.rank == 0:
            save_hf_model(self.engine.module, self.tokenizer, out_dir, state_dict=full)
            logger.info("saved the model to %s", path)
        if self.world_size > 1:
            dist.barrier()
        return path

    def to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) for k, v in batch.items()}


class MicroBatchCollate:
    """Picklable collate: a list of items -> a list of collated micro-batches."""

    def __init__(self, collate: Any, micro_batch_size: int, **kwargs: Any) -> None:
        self.collate = collate
        self.micro_batch_size = micro_batch_size
        self.kwargs = kwargs

    def __call__(self, items: list[dict[str, Any]]) -> list[dict[str, torch.Tensor]]:
        size = self.micro_batch_size
        return [
            self.collate(items[i : i + size], **self.kwargs) for i in range(0, len(items), size)
        ]


def _nonfinite_error(step: int, metrics: dict[str, Any], checkpoint: Path | None) -> Exception:
    """The error that ends an offline run whose final step's loss was not finite."""
    fix = "Lower optim.lr or clip gradients harder (engine.grad_clip)."
    return nonfinite_error(step, "the loss", "train/loss", metrics, checkpoint, fix)


def _dist_layout() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
