"""Validation of an RL run: the validation prompts generated (``rollout.val_kwargs``, greedy
by default) and scored by the validation reward, batch by batch.

:func:`validate` returns the metrics of
:func:`~verl.trainer.lifecycle.metrics.compute_validation_metrics` (accuracy and score,
per data source and per ``trainer.val_group_by`` field) and the first
``trainer.log_val_generations`` samples as table rows; with a sample directory every
sample is written there too. A stop request (SIGTERM / SIGINT) between batches raises
:class:`~verl.trainer.lifecycle.stopping.ValidationStopped` instead of waiting.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from verl.config import TrainerConfig
from verl.protocol import DataProto
from verl.trainer.lifecycle.metrics import compute_validation_metrics
from verl.trainer.lifecycle.stopping import StopRequests, ValidationStopped
from verl.trainer.rl.samples import generation_samples, write_samples

__all__ = ["validate", "with_meta"]


def with_meta(batch: DataProto, **meta: Any) -> DataProto:
    """A shallow copy of ``batch`` with extra sampling overrides in ``meta_info``."""
    return DataProto.from_dict(
        tensors=dict(batch.batch),
        non_tensors=dict(batch.non_tensor_batch),
        meta_info={**batch.meta_info, **meta},
    )


def validate(
    cfg: TrainerConfig,
    dataset: Any,
    collate: Callable[[list[Any]], DataProto],
    generate: Callable[[DataProto], DataProto],
    reward: Callable[[DataProto], Any],
    tokenizer: Any,
    *,
    stop: StopRequests,
    sample_dir: Path | None,
    step: int,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """``(metrics, table rows)`` of one validation pass over ``dataset`` (see the module
    docstring); ``generate`` joins the prompts' fields onto the responses, ``reward`` is
    the validation reward (its extras' ``score`` and ``acc`` are read)."""
    vk = cfg.actor_rollout_ref.rollout.val_kwargs
    bs = cfg.data.val_batch_size or len(dataset)
    scores: list[float] = []
    accs: list[float] = []
    sources: list[str] = []
    infos: list[Any] = []
    table: list[dict[str, Any]] = []  # trainer.log_val_generations samples
    dumped: list[dict[str, Any]] = []  # every sample, for trainer.validation_data_dir
    for start in range(0, len(dataset), bs):
        if stop.requested:  # SIGTERM / SIGINT: do not wait for the other batches
            raise ValidationStopped(stop.signum)
        items = [dataset[i] for i in range(start, min(start + bs, len(dataset)))]
        batch = with_meta(
            collate(items),
            do_sample=vk.do_sample,
            n=vk.n,
            temperature=vk.temperature,
            top_p=vk.top_p,
            top_k=vk.top_k,
        )
        gen = generate(batch)
        _, _, extras = reward(gen)
        batch_scores = [float(x) for x in extras["score"]]
        batch_accs = [float(x) for x in extras.get("acc", batch_scores)]
        want = cfg.trainer.log_val_generations - len(table)
        table += generation_samples(gen, batch_scores, tokenizer, want)
        if sample_dir is not None:
            dumped += generation_samples(gen, batch_scores, tokenizer, len(gen))
        scores.extend(batch_scores)
        # a scorer that reports no accuracy counts its score as the accuracy
        accs.extend(b if np.isnan(a) else a for a, b in zip(batch_accs, batch_scores))
        sources.extend(str(s) for s in gen.non_tensor_batch["data_source"])
        infos.extend(gen.non_tensor_batch.get("extra_info", [None] * len(batch_scores)))
    if sample_dir is not None:
        write_samples(sample_dir, step, dumped)
    metrics = compute_validation_metrics(accs, scores, sources, infos, cfg.trainer.val_group_by)
    return metrics, table
