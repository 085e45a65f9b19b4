"""Supervised fine-tuning: next-token loss on assistant tokens only, with optional packing.

``SFTTrainer(config).train()`` runs::

    for step in range(total_steps):
        micro_batches = next(loader)                     # right-padded (or packed) samples
        tokens_i = loss tokens of micro-batch i          # assistant tokens (loss_mask)
        engine.forward_backward(micro_batches, nll_token_mean, weights=tokens_i / sum(tokens))
        engine.optimizer_step()                          # clip, non-finite guard, lr schedule
        log train/loss, train/lr, train/grad_norm, train/tokens_per_s; maybe val/loss
    save the model (HF directory, written atomically)

The loss of an optimizer step is the mean negative log-likelihood over all its loss tokens,
whatever the micro-batching (the engine accumulates exactly). With ``data.packing=true`` the
samples are packed into sequences of up to ``data.max_length`` tokens, run with
``attention_mask=None`` and per-sample ``position_ids`` so that transformers isolates them
(see ``verl.data.sft_dataset``); the loss is the same as unpacked.

:class:`OfflineTrainer`, the part shared with the DPO trainer (set-up, the step loop,
validation schedule, logging, saving), lives here too.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from verl.algorithms import sequence_log_probs
from verl.config import DPOConfig, SFTConfig, to_dict
from verl.data import PromptDataLoader
from verl.data.sft_dataset import (
    PackedSFTDataset,
    SFTDataset,
    collate_sft,
    write_arithmetic_sft_dataset,
)
from verl.engine import OptimSpec, TrainEngine, build_engine
from verl.models import enable_activation_checkpointing, load_causal_lm, load_tokenizer
from verl.models.precision import resolve_dtype
from verl.trainer.setup import NotSupportedYet, seed_everything
from verl.trainer.tracking import Tracker
from verl.utils.device import resolve_device
from verl.utils.torch_functional import compute_response_log_probs
from verl.workers.common import atomic_save_pretrained

logger = logging.getLogger(__name__)

__all__ = ["OfflineTrainer", "SFTTrainer"]


class OfflineTrainer:
    """Shared skeleton of the offline trainers (SFT, DPO): set-up, loop, logging, saving.

    A subclass builds ``self.train_loader`` (yielding lists of micro-batches) in
    :meth:`build_data`, and implements :meth:`train_step` and :meth:`evaluate` (and
    :meth:`prepare`, run at the end of ``__init__``, if it needs the built model).

    Args:
        config: an :class:`~verl.config.SFTConfig` or :class:`~verl.config.DPOConfig`.
        model: an ``nn.Module`` to train instead of loading ``model.path``.
        tokenizer: a tokenizer to use instead of loading one from the model path.
        tracker: where metrics go (default: built from ``trainer.logger``).
    """

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
        self._check_supported(config)
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
        self.device = resolve_device(t.device)

        m = config.model
        self.tokenizer = tokenizer or load_tokenizer(
            m.tokenizer_path or m.path, trust_remote_code=m.trust_remote_code
        )
        if self.tokenizer.pad_token_id is None:
            raise ValueError(
                "the tokenizer has neither a pad nor an eos token; set tokenizer.pad_token"
            )

        self.build_data()
        steps_per_epoch = len(self.train_loader)
        self.total_steps = t.total_training_steps or steps_per_epoch * t.total_epochs

        if model is None:
            model = load_causal_lm(
                m.path,
                dtype=resolve_dtype(m.dtype),
                trust_remote_code=m.trust_remote_code,
                override_config=m.override_config,
            )
        if m.enable_gradient_checkpointing:
            enable_activation_checkpointing(model)
        self.engine: TrainEngine = build_engine(
            "single",  # strategy auto/single (fsdp2 is refused above)
            module=model,
            optim=OptimSpec.from_config(config.optim, total_steps=self.total_steps),
            grad_clip=config.engine.grad_clip,
            device=self.device,
        )
        # The console line is written here (offline metrics are not in Tracker's PPO keys).
        self._console = "console" in t.logger
        self.tracker = tracker or Tracker(
            [b for b in t.logger if b != "console"],
            log_dir=self.log_dir,
            project=t.project_name,
            experiment=t.experiment_name,
            config=to_dict(config),
        )
        self.global_step = 0
        self.history: list[dict[str, Any]] = []
        self.val_history: list[dict[str, Any]] = []
        self.prepare()

    # ------------------------------------------------------------------ hooks
    def registries(self) -> dict[str, list[str]]:
        """Registry-backed config keys and their allowed names (checked by ``validate``)."""
        return {}

    def build_data(self) -> None:
        """Set ``self.train_loader`` (and any validation data)."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Work done once the model is built, before any update (e.g. reference log-probs)."""

    def train_step(self, micro_batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
        """One optimizer step over a batch given as micro-batches; returns its metrics."""
        raise NotImplementedError

    def evaluate(self) -> dict[str, float]:
        """Validation metrics (``val/...``), or {} without validation data."""
        return {}

    # ------------------------------------------------------------------ set-up helpers
    @staticmethod
    def _check_supported(config: SFTConfig | DPOConfig) -> None:
        problems = []
        if config.engine.strategy == "fsdp2":
            problems.append(
                "engine.strategy='fsdp2': the offline trainers run one process for now; use "
                "engine.strategy=single (or auto)"
            )
        if problems:
            raise NotSupportedYet("; ".join(problems))

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

    # ------------------------------------------------------------------ the loop
    def train(self) -> dict[str, Any]:
        """Train for ``total_steps`` optimizer steps, validate, save; return the results.

        Results: ``history`` (metrics per step), ``val_history``, ``last_metrics``,
        ``val_before`` / ``val_after`` (when there is validation data) and ``hf_dir``.
        """
        t = self.config.trainer
        results: dict[str, Any] = {}
        if t.val_before_train:
            val = self._validate()
            if val:
                results["val_before"] = val
        progress = tqdm(total=self.total_steps, desc="training", unit="step", dynamic_ncols=True)
        try:
            while self.global_step < self.total_steps:
                for micro_batches in self.train_loader:
                    self.global_step += 1
                    start = time.perf_counter()
                    metrics = self.train_step(micro_batches)
                    metrics["timing_s/step"] = time.perf_counter() - start
                    metrics["train/epoch"] = self.train_loader.epoch
                    if not math.isfinite(metrics.get("train/loss", 0.0)):
                        logger.warning("step %d: non-finite loss", self.global_step)
                    last = self.global_step == self.total_steps
                    if t.test_freq > 0 and self.global_step % t.test_freq == 0 and not last:
                        metrics |= self._validate(log=False)
                    self.log(metrics, self.global_step)
                    self.history.append(metrics)
                    progress.update(1)
                    progress.set_postfix(loss=f"{metrics.get('train/loss', float('nan')):.4f}")
                    if last:
                        break
            val = self._validate()
            if val:
                results["val_after"] = val
            results["hf_dir"] = str(self.save_hf(self.output_dir / "huggingface"))
        finally:
            progress.close()
            self.tracker.close()
        results["history"] = self.history
        results["val_history"] = self.val_history
        results["last_metrics"] = self.history[-1] if self.history else {}
        return results

    def _validate(self, log: bool = True) -> dict[str, float]:
        val = self.evaluate()
        if val:
            self.val_history.append({"step": self.global_step, **val})
            if log:
                self.log(val, self.global_step)
        return val

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Send ``metrics`` to the trackers and, with the console logger, one line to logging."""
        self.tracker.log(metrics, step)
        if self._console:
            keys = [k for k in self.console_keys if k in metrics]
            keys += [k for k in metrics if k.startswith("val/") and k not in keys]
            shown = " ".join(f"{k}={metrics[k]:.4g}" for k in keys)
            logging.getLogger("verl.metrics").info("step %d | %s", step, shown)

    def save_hf(self, out_dir: str | Path) -> Path:
        """Save the model and tokenizer as a HF directory (atomically: temp dir + rename)."""
        path = atomic_save_pretrained(self.engine.module, self.tokenizer, out_dir)
        logger.info("saved the model to %s", path)
        return path

    def to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) for k, v in batch.items()}


class _MicroBatchCollate:
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


class SFTTrainer(OfflineTrainer):
    """Supervised fine-tuning on chat or prompt/response data (see the module docstring).

    Args:
        config: an :class:`~verl.config.SFTConfig`.
        model / tokenizer / tracker: see :class:`OfflineTrainer`.
    """

    console_keys = ("train/loss", "train/grad_norm", "train/lr", "train/tokens_per_s")

    config: SFTConfig

    def build_data(self) -> None:
        d = self.config.data
        train_files, val_files = list(d.train_files), list(d.val_files)
        if not train_files and d.builtin == "arithmetic":
            a = d.arithmetic
            train_path, val_path = write_arithmetic_sft_dataset(
                self.builtin_dir(), a.train_size, a.val_size, a.digits, list(a.ops), d.seed
            )
            logger.info("built-in arithmetic SFT data: %s, %s", train_path, val_path)
            train_files = [train_path]
            if not val_files and val_path is not None:
                val_files = [val_path]
        kwargs = dict(
            tokenizer=self.tokenizer,
            max_length=d.max_length,
            truncation=d.truncation,
            messages_key=d.messages_key,
            prompt_key=d.prompt_key,
            response_key=d.response_key,
            apply_chat_template=d.apply_chat_template,
        )
        self.train_dataset = SFTDataset(train_files, **kwargs)
        self.val_dataset = SFTDataset(val_files, **kwargs) if val_files else None
        self.packing = d.packing
        train_set: Any = self.train_dataset
        if self.packing:
            train_set = PackedSFTDataset(self.train_dataset, d.max_length)
        pad = self.tokenizer.pad_token_id
        self.micro_collate = _MicroBatchCollate(
            collate_sft, d.micro_batch_size_per_device, pad_token_id=pad
        )
        self.train_loader = self.make_loader(
            train_set, self.micro_collate, d.train_batch_size, d.shuffle, d.seed
        )

    def token_log_probs(self, module: torch.nn.Module, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        """``(batch, seq_len - 1)`` log-probs of tokens ``1..`` of a collated micro-batch.

        Packed batches run with ``attention_mask=None`` so that transformers builds a
        block-diagonal causal mask from the ``position_ids`` restarts.
        """
        ids = mb["input_ids"]
        log_probs, _ = compute_response_log_probs(
            module,
            ids,
            None if self.packing else mb["attention_mask"],
            mb["position_ids"],
            response_len=ids.shape[1] - 1,
            chunk_size=self.config.engine.logprob_chunk_size,
        )
        return log_probs

    def _nll_sum(self, module: torch.nn.Module, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        mb = self.to_device(mb)
        log_probs = self.token_log_probs(module, mb)
        return -sequence_log_probs(log_probs, mb["loss_mask"][:, 1:]).sum()

    def _loss_fn(
        self, module: torch.nn.Module, mb: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        n_tokens = int(mb["loss_mask"][:, 1:].sum())
        return self._nll_sum(module, mb) / max(n_tokens, 1), {}

    def train_step(self, micro_batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
        start = time.perf_counter()
        counts = [float(mb["loss_mask"][:, 1:].sum()) for mb in micro_batches]
        total = sum(counts)
        scales = [c / total if total else 0.0 for c in counts]
        results = self.engine.forward_backward(micro_batches, self._loss_fn, scales)
        step = self.engine.optimizer_step()
        seconds = time.perf_counter() - start
        tokens = sum(float(mb["attention_mask"].sum()) for mb in micro_batches)
        return {
            "train/loss": sum(r["loss"] * s for r, s in zip(results, scales)),
            "train/lr": step["lr"],
            "train/grad_norm": step["grad_norm"],
            "train/skipped_step": step["skipped"],
            "train/loss_tokens": total,
            "train/tokens": tokens,
            "train/samples": float(sum(int(mb["num_samples"]) for mb in micro_batches)),
            "train/tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        }

    def evaluate(self) -> dict[str, float]:
        """``val/loss``: mean NLL per loss token over the validation set (unpacked)."""
        if self.val_dataset is None:
            return {}
        packing, self.packing = self.packing, False
        nll, tokens = 0.0, 0.0
        try:
            with self.engine.eval_mode():
                size = self.config.data.micro_batch_size_per_device
                for start in range(0, len(self.val_dataset), size):
                    end = min(start + size, len(self.val_dataset))
                    items = [self.val_dataset[i] for i in range(start, end)]
                    mb = collate_sft(items, self.tokenizer.pad_token_id)
                    nll += float(self._nll_sum(self.engine.module, mb))
                    tokens += float(mb["loss_mask"][:, 1:].sum())
        finally:
            self.packing = packing
        return {"val/loss": nll / max(tokens, 1.0)}
