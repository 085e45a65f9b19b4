"""Offline preference optimisation: DPO, IPO and KTO on fixed preference data.

``DPOTrainer(config).train()`` runs::

    ref_logps = sequence log-probs of every completion under the initial model   # once
    for step in range(total_steps):
        micro_batches = next(loader)             # pairs -> 2B rows (chosen, then rejected)
        engine.forward_backward(micro_batches, loss_fn, weights = rows_i / rows)
            # loss_fn: policy sequence log-probs -> PREFERENCE_LOSSES[algorithm.loss_type]
        engine.optimizer_step()
        log loss, rewards/{chosen,rejected,margins,accuracies}, lr, grad_norm; maybe val/...
    save the model (HF directory, written atomically)

The reference policy is the initial policy. Its log-probs (sums over completion tokens) are
computed with the model itself, in eval mode and without gradients, when the trainer is
built (before any update), and stored with the data, so no second copy of the model is ever
held. Sequences are
``prompt (left-padded) + completion (right-padded)``, the layout of the RL trainer, so
``compute_response_log_probs`` scores only the completion columns.

KTO (``algorithm.loss_type=kto``) takes labelled completions; pair data is split into one
desirable (chosen) and one undesirable (rejected) row per pair. Its reference point ``z_ref``
is the mean policy/reference log-ratio of each forward micro-batch (see
``verl.algorithms.preference.kto_reference_point``), so it depends on
``data.micro_batch_size_per_device``.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Any

import torch

from verl.algorithms import (
    PREFERENCE_LOSSES,
    get_preference_loss,
    is_paired_loss,
    preference_metrics,
    sequence_log_probs,
)
from verl.config import DPOConfig
from verl.data.preference_dataset import (
    PreferenceDataset,
    collate_preference,
    write_arithmetic_preference_dataset,
)
from verl.kernels.torch_functional import compute_response_log_probs
from verl.trainer.offline.base import MicroBatchCollate, OfflineTrainer

logger = logging.getLogger(__name__)

__all__ = ["DPOTrainer"]


class DPOTrainer(OfflineTrainer):
    """DPO / IPO / KTO from an :class:`~verl.config.DPOConfig` (see the module docstring).

    Args:
        config: the run configuration.
        model: an ``nn.Module`` to train instead of loading ``model.path``; its weights
            when the trainer is built are the reference policy.
        tokenizer / tracker: see :class:`~verl.trainer.offline.base.OfflineTrainer`.
    """

    kind = "dpo"
    sequences_per_row = 2
    console_keys = (
        "train/loss",
        "rewards/accuracies",
        "rewards/margins",
        "train/grad_norm",
        "train/lr",
    )

    config: DPOConfig

    def registries(self) -> dict[str, list[str]]:
        return {"algorithm.loss_type": PREFERENCE_LOSSES.names(include_aliases=True)}

    # ------------------------------------------------------------------ data
    def build_data(self) -> None:
        d, a = self.config.data, self.config.algorithm
        self.loss_fn = get_preference_loss(a.loss_type)
        self.paired = is_paired_loss(a.loss_type)
        train_files, val_files = self.data_files(
            write_arithmetic_preference_dataset, "preference data"
        )
        self.train_dataset = self._dataset(train_files, "data.train_files")
        self.val_dataset = self._dataset(val_files, "data.val_files") if val_files else None
        self.micro_collate = MicroBatchCollate(
            collate_preference,
            d.micro_batch_size_per_device,
            pad_token_id=self.tokenizer.pad_token_id,
            paired=self.paired,
        )
        self.train_loader = self.make_loader(
            self.train_dataset, self.micro_collate, d.train_batch_size, d.shuffle, d.seed
        )

    def _dataset(self, files: list[str], key: str) -> PreferenceDataset:
        d, loss_type = self.config.data, self.config.algorithm.loss_type
        ds = PreferenceDataset(
            files,
            self.tokenizer,
            max_prompt_length=d.max_prompt_length,
            max_length=d.max_length,
            truncation=d.truncation,
            apply_chat_template=d.apply_chat_template,
        )
        if self.paired and not ds.paired:
            raise ValueError(
                f"{key}: the rows are labelled completions (prompt/completion/label), but "
                f"algorithm.loss_type={loss_type} needs chosen/rejected pairs; use "
                "algorithm.loss_type=kto or pair data"
            )
        return ds if self.paired else ds.to_unpaired()

    # ------------------------------------------------------------------ log-probs
    def completion_log_probs(
        self, module: torch.nn.Module, mb: dict[str, torch.Tensor]
    ) -> torch.Tensor:
        """``(rows,)`` sum of the completion tokens' log-probs of a collated micro-batch."""
        log_probs, _ = compute_response_log_probs(
            module,
            mb["input_ids"],
            mb["attention_mask"],
            mb["position_ids"],
            response_len=mb["response_mask"].shape[1],
            chunk_size=self.config.engine.logprob_chunk_size,
        )
        return sequence_log_probs(log_probs, mb["response_mask"])

    @torch.no_grad()
    def compute_reference_log_probs(self, dataset: PreferenceDataset) -> None:
        """Score every completion of ``dataset`` with the current (initial) model; store it."""
        size = self.config.data.micro_batch_size_per_device
        values: list[torch.Tensor] = []
        start_time = time.perf_counter()
        with self.engine.eval_mode():
            for start in range(0, len(dataset), size):
                items = [dataset[i] for i in range(start, min(start + size, len(dataset)))]
                mb = self.micro_collate.collate(
                    items, pad_token_id=self.tokenizer.pad_token_id, paired=self.paired
                )
                logps = self.completion_log_probs(self.engine.module, self.to_device(mb))
                values.append(logps.float().cpu().view(2 if self.paired else 1, -1))
        stacked = torch.cat(values, dim=1)
        if self.paired:
            dataset.set_reference_log_probs(
                ref_chosen_logps=stacked[0].tolist(), ref_rejected_logps=stacked[1].tolist()
            )
        else:
            dataset.set_reference_log_probs(ref_logps=stacked[0].tolist())
        logger.info(
            "reference log-probs of %d rows computed in %.1f s",
            len(dataset),
            time.perf_counter() - start_time,
        )

    def prepare(self) -> None:
        """Reference log-probs of the train and validation sets, with the initial weights."""
        for ds in (self.train_dataset, self.val_dataset):
            if ds is not None and not ds.has_reference_log_probs:
                self.compute_reference_log_probs(ds)

    # ------------------------------------------------------------------ the loss
    def _preference_loss(self, module: torch.nn.Module, mb: dict[str, torch.Tensor]) -> Any:
        a = self.config.algorithm
        mb = self.to_device(mb)
        logps = self.completion_log_probs(module, mb)
        if self.paired:
            n = logps.shape[0] // 2
            out = self.loss_fn(
                logps[:n],
                logps[n:],
                mb["ref_chosen_logps"],
                mb["ref_rejected_logps"],
                beta=a.beta,
                label_smoothing=a.label_smoothing,
            )
        else:
            out = self.loss_fn(
                logps,
                mb["ref_logps"],
                mb["labels"],
                beta=a.beta,
                desirable_weight=a.desirable_weight,
                undesirable_weight=a.undesirable_weight,
            )
        return out, logps.detach()

    def _rows(self, mb: dict[str, torch.Tensor]) -> int:
        rows = mb["input_ids"].shape[0]
        return rows // 2 if self.paired else rows

    def train_step(self, micro_batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
        start = time.perf_counter()
        collected: list[tuple[Any, torch.Tensor]] = []

        def loss_fn(module: torch.nn.Module, mb: dict[str, torch.Tensor]):
            out, logps = self._preference_loss(module, mb)
            collected.append((out, logps))
            return out.losses.mean(), {}

        rows = [self._rows(mb) for mb in micro_batches]
        scales = [r / sum(rows) for r in rows]
        mine, my_scales = self.local_share(micro_batches, scales)
        results = self.engine.forward_backward(mine, loss_fn, my_scales)
        step = self.engine.optimizer_step()
        seconds = time.perf_counter() - start
        tokens = sum(float(mb["attention_mask"].sum()) for mb in micro_batches)
        # my_scales carry the world size; the step's loss is the sum over every rank.
        loss = sum(r["loss"] * s for r, s in zip(results, my_scales)) / self.world_size
        metrics = {
            "train/loss": self.all_sum(loss),
            "train/lr": step["lr"],
            "train/grad_norm": step["grad_norm"],
            "train/skipped_step": step["skipped"],
            "train/tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        }
        return metrics | self._reward_metrics(self._from_every_rank(collected), prefix="")

    def _from_every_rank(
        self, collected: list[tuple[Any, torch.Tensor]]
    ) -> list[tuple[Any, torch.Tensor]]:
        """The loss outputs of every rank's micro-batches, in micro-batch order."""
        if self.world_size == 1:
            return collected
        light = [
            (
                SimpleNamespace(
                    chosen_rewards=out.chosen_rewards.detach().float().cpu(),
                    rejected_rewards=out.rejected_rewards.detach().float().cpu(),
                    kl=None if self.paired else float(out.kl),
                ),
                logps.float().cpu(),
            )
            for out, logps in collected
        ]
        return [item for share in self.all_gather(light) for item in share]

    def _reward_metrics(
        self,
        collected: list[tuple[Any, torch.Tensor]],
        prefix: str,
    ) -> dict[str, float]:
        chosen = torch.cat([out.chosen_rewards.float().cpu() for out, _ in collected])
        rejected = torch.cat([out.rejected_rewards.float().cpu() for out, _ in collected])
        metrics = {
            f"{prefix}{k}": v for k, v in preference_metrics(chosen, rejected, self.paired).items()
        }
        if self.paired:
            halves = [logps.float().cpu().view(2, -1) for _, logps in collected]
            metrics[f"{prefix}logps/chosen"] = float(torch.cat([h[0] for h in halves]).mean())
            metrics[f"{prefix}logps/rejected"] = float(torch.cat([h[1] for h in halves]).mean())
        else:
            kls = [float(out.kl) for out, _ in collected]
            metrics[f"{prefix}kto/kl"] = sum(kls) / len(kls)
        return metrics

    def evaluate(self) -> dict[str, float]:
        """``val/loss`` and ``val/rewards/...`` over the validation set (no update)."""
        if self.val_dataset is None:
            return {}
        size = self.config.data.micro_batch_size_per_device
        collected: list[tuple[Any, torch.Tensor]] = []
        loss_sum, rows = 0.0, 0
        with self.engine.eval_mode():
            for start in range(0, len(self.val_dataset), size):
                end = min(start + size, len(self.val_dataset))
                mb = self.micro_collate([self.val_dataset[i] for i in range(start, end)])[0]
                out, logps = self._preference_loss(self.engine.module, mb)
                collected.append((out, logps))
                loss_sum += float(out.losses.sum())
                rows += self._rows(mb)
        metrics = {"val/loss": loss_sum / rows}
        return metrics | self._reward_metrics(collected, prefix="val/")
