"""Supervised fine-tuning: next-token loss on assistant tokens only, with optional packing.

``SFTTrainer(config).train()`` runs::

    for step in range(total_steps):
        micro_batches = next(loader)                     # right-padded (or packed) samples
        tokens_i = loss tokens of micro-batch i          # assistant tokens (loss_mask)
        engine.forward_backward(micro_batches, nll_token_mean, weights=tokens_i / sum(tokens))
        engine.optimizer_step()                          # clip, non-finite guard, lr schedule
        log train/loss, train/lr, train/grad_norm, train/tokens_per_s; maybe val/loss
    save the model (HF directory, written atomically)

with checkpoints every ``trainer.save_freq`` steps and exact resume (``trainer.resume_mode``),
in one process or on several FSDP2 ranks: see ``verl.trainer.offline.base``.

Upstream verl runs its engine-based SFT trainer as ``verl.trainer.sft_trainer``, a module over
:mod:`verl.cli.sft` here (upstream's entry point of its
engine-based SFT trainer, whose keys ``engine=fsdp``, ``engine.strategy=fsdp``,
``model.use_remove_padding``, ... are read by ``verl.compat.upstream``)::

    python -m verl.trainer.sft_trainer model.path=... data.train_files=... data.messages_key=messages
    torchrun --nproc_per_node=2 -m verl.trainer.sft_trainer engine=fsdp ...   # one rank each

The loss of an optimizer step is the mean negative log-likelihood over all its loss tokens,
whatever the micro-batching (the engine accumulates exactly). With ``data.packing=true`` the
samples are packed into sequences of up to ``data.max_length`` tokens, run with
``attention_mask=None`` and per-sample ``position_ids`` so that transformers isolates them
(see ``verl.data.sft_dataset``); the loss is the same as unpacked.

:class:`~verl.trainer.offline.base.OfflineTrainer` is the part shared with the DPO
trainer (set-up, the step loop, validation schedule, logging, checkpoints, saving).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from verl.algorithms import sequence_log_probs
from verl.config import SFTConfig
from verl.data.sft_dataset import (
    PackedSFTDataset,
    SFTDataset,
    collate_sft,
    write_arithmetic_sft_dataset,
)
from verl.kernels.torch_functional import compute_response_log_probs
from verl.trainer.offline.base import MicroBatchCollate, OfflineTrainer

logger = logging.getLogger(__name__)

__all__ = ["OfflineTrainer", "SFTTrainer"]  # OfflineTrainer: re-exported


class SFTTrainer(OfflineTrainer):
    """Supervised fine-tuning on chat or prompt/response data (see the module docstring).

    Args:
        config: an :class:`~verl.config.SFTConfig`.
        model / tokenizer / tracker: see :class:`OfflineTrainer`.
    """

    kind = "sft"
    console_keys = ("train/loss", "train/grad_norm", "train/lr", "train/tokens_per_s")

    config: SFTConfig

    def build_data(self) -> None:
        d = self.config.data
        train_files, val_files = self.data_files(write_arithmetic_sft_dataset, "SFT data")
        kwargs = dict(
            tokenizer=self.tokenizer,
            max_length=d.max_length,
            truncation=d.truncation,
            messages_key=d.messages_key,
            prompt_key=d.prompt_key,
            response_key=d.response_key,
            prompt_path=d.prompt_dict_keys,
            response_path=d.response_dict_keys,
            apply_chat_template=d.apply_chat_template,
        )
        self.train_dataset = SFTDataset(train_files, **kwargs)
        self.val_dataset = SFTDataset(val_files, **kwargs) if val_files else None
        self.packing = d.packing
        train_set: Any = self.train_dataset
        if self.packing:
            train_set = PackedSFTDataset(self.train_dataset, d.max_length)
        pad = self.tokenizer.pad_token_id
        self.micro_collate = MicroBatchCollate(
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
        mine, my_scales = self.local_share(micro_batches, scales)
        results = self.engine.forward_backward(mine, self._loss_fn, my_scales)
        step = self.engine.optimizer_step()
        seconds = time.perf_counter() - start
        tokens = sum(float(mb["attention_mask"].sum()) for mb in micro_batches)
        # my_scales carry the world size; the step's loss is the sum over every rank.
        loss = sum(r["loss"] * s for r, s in zip(results, my_scales)) / self.world_size
        return {
            "train/loss": self.all_sum(loss),
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
