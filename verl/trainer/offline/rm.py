"""Reward-model training: a Bradley-Terry loss on a sequence-classification head over
preference pairs.

``RMTrainer(config).train()`` runs::

    model = AutoModelForSequenceClassification(model.path, num_labels=1)  # score head new
    for step in range(total_steps):                                       # unless saved
        micro_batches = next(loader)          # B pairs -> 2B rows (chosen, then rejected)
        engine.forward_backward(micro_batches, loss_fn, weights = pairs_i / pairs)
            # loss_fn: r = score(hidden state at each row's last real token)   (2B,)
            #          losses = -logsigmoid(r[:B] - r[B:] - margin)             (B,)
            #          loss = losses.mean()
        engine.optimizer_step()
        log train/loss, train/acc, train/margin, lr, grad_norm; maybe val/...
    save the model (HF directory, written atomically)

The reward ``r`` of a sequence is read exactly as the RL trainer's reward-model worker reads
it (``verl.workers.reward_model.last_token_scores``): the body runs on prompt (left-padded)
+ completion (right-padded) with positions ``cumsum(mask) - 1``, and the linear ``score``
head is applied to the hidden state of the last position whose attention mask is 1. The
completion ends with the tokenizer's eos (``verl.data.preference_dataset``), as a rollout's
response does. So the saved directory loads as ``reward_model.model.path`` with
``reward_model.enable=true`` and scores rollouts as it scored its training pairs.

Loss, per pair ``i`` of a batch of ``B`` pairs (:func:`reward_pair_loss`)::

    r_c, r_r: (B,) rewards of the chosen / rejected sequences
    m:        (B,) the pair's margin (data column ``data.margin_key``; 0 without one)
    loss_i  = -log sigmoid(r_c[i] - r_r[i] - m[i])          the Bradley-Terry loss
    loss    = mean_i loss_i                                 over the step's pairs

Metrics: ``train/loss``, ``train/acc`` (fraction of pairs with ``r_c > r_r``, strictly),
``train/margin`` (mean ``r_c - r_r``), ``train/rewards/chosen`` / ``rejected`` (means), and
the same under ``val/`` on ``data.val_files``.

LoRA (``model.lora_rank > 0``): adapters are injected into the transformer body in place and
the ``score`` head trains in full (it starts from a random initialisation); the exported
directory has the adapters folded into the weights, a plain sequence classifier.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from verl.config import RMConfig
from verl.config.precision import auto_select_precision
from verl.data.preference_dataset import write_arithmetic_preference_dataset
from verl.data.preference_pairs import RewardPairDataset, collate_reward_pairs
from verl.models.lora import (
    LoraSpec,
    inject_lora,
    is_lora_model,
    lora_scaling,
    lora_spec_from_config,
    merged_state_dict,
)
from verl.models.precision import resolve_dtype
from verl.trainer.offline.base import MicroBatchCollate, OfflineTrainer
from verl.workers.common import atomic_save_pretrained
from verl.workers.reward_model import last_token_scores

logger = logging.getLogger(__name__)

# engine.precision -> the engine's autocast dtype (none: the model's own dtype)
_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}

__all__ = [
    "RMTrainer",
    "apply_lora_to_reward_model",
    "load_reward_backbone",
    "reward_pair_loss",
    "reward_pair_metrics",
]


def reward_pair_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, margin: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-pair Bradley-Terry loss ``-logsigmoid(chosen - rejected - margin)``, ``(B,)``.

    ``chosen`` / ``rejected``: ``(B,)`` rewards of each pair's two sequences; ``margin``:
    ``(B,)`` (or None = 0), how far chosen must be above rejected before the loss flattens.
    Computed in float32.
    """
    if chosen.shape != rejected.shape or chosen.ndim != 1:
        raise ValueError(
            f"chosen {tuple(chosen.shape)} and rejected {tuple(rejected.shape)} rewards must "
            "both be (pairs,)"
        )
    diff = chosen.float() - rejected.float()
    if margin is not None:
        if margin.shape != diff.shape:
            raise ValueError(f"margin {tuple(margin.shape)} must be (pairs,) = {tuple(diff.shape)}")
        diff = diff - margin.to(diff)
    return -F.logsigmoid(diff)


def reward_pair_metrics(
    chosen: torch.Tensor, rejected: torch.Tensor, prefix: str
) -> dict[str, float]:
    """``{prefix}acc`` (fraction of pairs with chosen > rejected), ``{prefix}margin``
    (mean chosen - rejected) and ``{prefix}rewards/chosen`` / ``rejected`` (means)."""
    chosen, rejected = chosen.float(), rejected.float()
    return {
        f"{prefix}acc": float((chosen > rejected).float().mean()),
        f"{prefix}margin": float((chosen - rejected).mean()),
        f"{prefix}rewards/chosen": float(chosen.mean()),
        f"{prefix}rewards/rejected": float(rejected.mean()),
    }


def load_reward_backbone(
    path: str,
    *,
    pad_token_id: int,
    dtype: torch.dtype | str = torch.float32,
    trust_remote_code: bool = False,
    override_config: dict[str, Any] | None = None,
) -> torch.nn.Module:
    """``AutoModelForSequenceClassification`` with one label from a local directory (or the
    embedded model's name): a causal LM's body with a new ``score`` head (drawn from torch's
    global RNG, so seeded runs repeat), or a reward model with its own head.
    ``config.pad_token_id`` is set to ``pad_token_id``."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from verl.models.loading import (
        check_model_dir,
        config_with_overrides,
        resolve_model_path,
        set_hub_offline,
    )

    set_hub_offline()
    model_dir = resolve_model_path(path)
    gguf = check_model_dir(model_dir)
    kwargs: dict[str, Any] = {"gguf_file": gguf} if gguf else {}
    config = config_with_overrides(
        model_dir, override_config, gguf=gguf, trust_remote_code=trust_remote_code
    )
    if config is None:
        config = AutoConfig.from_pretrained(
            model_dir, trust_remote_code=trust_remote_code, local_files_only=True, **kwargs
        )
    if getattr(config, "num_labels", 1) != 1 and _is_classifier(config):
        raise ValueError(
            f"model.path={path}: a sequence classifier with num_labels={config.num_labels}; "
            "a reward model has one output: start from a causal LM or a one-label reward model"
        )
    config.num_labels = 1
    config.pad_token_id = pad_token_id
    model = AutoModelForSequenceClassification.from_pretrained(
        model_dir,
        config=config,
        dtype=resolve_dtype(dtype),
        trust_remote_code=trust_remote_code,
        local_files_only=True,
        **kwargs,
    )
    if gguf:
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    logger.info(
        "loaded %s from %s (%.1f M params)",
        type(model).__name__,
        model_dir,
        model.num_parameters() / 1e6,
    )
    return model


def _is_classifier(config: Any) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in config.architectures or [])


def apply_lora_to_reward_model(module: torch.nn.Module, spec: LoraSpec) -> torch.nn.Module:
    """Inject fresh adapters into a sequence classifier's body (``module.base_model``) in
    place; the adapters and the whole ``score`` head train, the body's weights are frozen.
    ``lora_B`` starts at zero, so the scores are unchanged until the first update."""
    inject_lora(module.base_model, spec)
    module.score.requires_grad_(True)
    return module


class RMTrainer(OfflineTrainer):
    """Reward-model training from an :class:`~verl.config.RMConfig` (see the module
    docstring).

    Args:
        config: the run configuration.
        model: a sequence classifier with one label (``num_labels=1``, a linear ``score``
            head) to train instead of loading ``model.path``.
        tokenizer / tracker: see :class:`~verl.trainer.offline.base.OfflineTrainer`.
    """

    kind = "rm"
    sequences_per_row = 2
    console_keys = ("train/loss", "train/acc", "train/margin", "train/grad_norm", "train/lr")

    config: RMConfig

    # ------------------------------------------------------------------ model
    def build_model(self, model: torch.nn.Module | None) -> torch.nn.Module:
        m = self.config.model
        if model is None:
            model = load_reward_backbone(
                m.path,
                pad_token_id=self.tokenizer.pad_token_id,
                dtype=m.dtype,
                trust_remote_code=m.trust_remote_code,
                override_config=m.override_config,
            )
        num_labels = getattr(getattr(model, "config", None), "num_labels", None)
        if num_labels != 1 or not isinstance(getattr(model, "score", None), torch.nn.Linear):
            raise TypeError(
                f"the reward model to train ({type(model).__name__}, num_labels={num_labels}) "
                "must be a sequence classifier with one label and a linear `score` head, e.g. "
                "AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)"
            )
        if model.config.pad_token_id is None:
            model.config.pad_token_id = self.tokenizer.pad_token_id
        lora = lora_spec_from_config(m)
        if lora is not None:
            model = apply_lora_to_reward_model(model, lora)
        return model

    def engine_overrides(self) -> dict[str, Any]:
        """``engine.precision``: bf16 / fp16 run the forwards under autocast over the fp32
        weights (``auto``: bf16 where the device has it natively, else none)."""
        precision = self.config.engine.precision
        if precision == "auto":
            precision = auto_select_precision(self.device.type)["critic"]
        return {"autocast_dtype": _AUTOCAST.get(precision)}

    # ------------------------------------------------------------------ data
    def build_data(self) -> None:
        d = self.config.data
        train_files, val_files = self.data_files(
            write_arithmetic_preference_dataset, "preference pairs"
        )
        self.train_dataset = self._dataset(train_files)
        self.val_dataset = self._dataset(val_files) if val_files else None
        self.micro_collate = MicroBatchCollate(
            collate_reward_pairs,
            d.micro_batch_size_per_device,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        self.train_loader = self.make_loader(
            self.train_dataset, self.micro_collate, d.train_batch_size, d.shuffle, d.seed
        )

    def _dataset(self, files: list[str]) -> RewardPairDataset:
        d = self.config.data
        return RewardPairDataset(
            files,
            self.tokenizer,
            max_prompt_length=d.max_prompt_length,
            max_length=d.max_length,
            truncation=d.truncation,
            apply_chat_template=d.apply_chat_template,
            margin_key=d.margin_key,
        )

    # ------------------------------------------------------------------ the loss
    def pair_rewards(
        self, module: torch.nn.Module, mb: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(chosen, rejected)`` rewards, ``(B,)`` each, of a collated micro-batch of B
        pairs (moved to the device here)."""
        rewards = last_token_scores(
            module, mb["input_ids"].to(self.device), mb["attention_mask"].to(self.device)
        )
        n = rewards.shape[0] // 2
        return rewards[:n], rewards[n:]

    def _pair_losses(
        self, module: torch.nn.Module, mb: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        chosen, rejected = self.pair_rewards(module, mb)
        losses = reward_pair_loss(chosen, rejected, mb["margin"].to(self.device))
        return losses, chosen.detach().float().cpu(), rejected.detach().float().cpu()

    def train_step(self, micro_batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
        start = time.perf_counter()
        collected: list[tuple[torch.Tensor, torch.Tensor]] = []

        def loss_fn(module: torch.nn.Module, mb: dict[str, torch.Tensor]):
            losses, chosen, rejected = self._pair_losses(module, mb)
            collected.append((chosen, rejected))
            return losses.mean(), {}

        pairs = [mb["margin"].shape[0] for mb in micro_batches]
        scales = [p / sum(pairs) for p in pairs]
        mine, my_scales = self.local_share(micro_batches, scales)
        results = self.engine.forward_backward(mine, loss_fn, my_scales)
        step = self.engine.optimizer_step()
        seconds = time.perf_counter() - start
        tokens = sum(float(mb["attention_mask"].sum()) for mb in micro_batches)
        # my_scales carry the world size; the step's loss is the sum over every rank.
        loss = sum(r["loss"] * s for r, s in zip(results, my_scales)) / self.world_size
        if self.world_size > 1:
            collected = [item for share in self.all_gather(collected) for item in share]
        chosen = torch.cat([c for c, _ in collected])
        rejected = torch.cat([r for _, r in collected])
        return {
            "train/loss": self.all_sum(loss),
            "train/lr": step["lr"],
            "train/grad_norm": step["grad_norm"],
            "train/skipped_step": step["skipped"],
            "train/tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        } | reward_pair_metrics(chosen, rejected, "train/")

    def evaluate(self) -> dict[str, float]:
        """``val/loss``, ``val/acc``, ``val/margin`` and ``val/rewards/...`` over the
        validation pairs (no update; every rank scores all of them)."""
        if self.val_dataset is None:
            return {}
        size = self.config.data.micro_batch_size_per_device
        losses, chosen, rejected = [], [], []
        with self.engine.eval_mode():
            for start in range(0, len(self.val_dataset), size):
                end = min(start + size, len(self.val_dataset))
                mb = self.micro_collate([self.val_dataset[i] for i in range(start, end)])[0]
                pair_losses, c, r = self._pair_losses(self.engine.module, mb)
                losses.append(pair_losses.float().cpu())
                chosen.append(c)
                rejected.append(r)
        metrics = {"val/loss": float(torch.cat(losses).mean())}
        return metrics | reward_pair_metrics(torch.cat(chosen), torch.cat(rejected), "val/")

    # ------------------------------------------------------------------ export
    def save_hf(self, out_dir: str | Path) -> Path:
        """Save the reward model and tokenizer as a HF directory (atomically), loadable by
        ``AutoModelForSequenceClassification`` and as ``reward_model.model.path``; LoRA
        adapters are folded into the weights. Collective."""
        module = self.engine.module
        if not is_lora_model(module):
            return super().save_hf(out_dir)
        full = self.engine.state_dict_for_save() if self.strategy == "fsdp2" else None
        path = Path(out_dir)
        if self.rank == 0:
            state = full if full is not None else module.state_dict()
            merged = merged_state_dict(state, lora_scaling(module))
            atomic_save_pretrained(module, self.tokenizer, path, state_dict=merged)
            logger.info("saved the reward model (LoRA folded in) to %s", path)
        if self.world_size > 1:
            dist.barrier()
        return path
