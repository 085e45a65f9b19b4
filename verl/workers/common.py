"""Pieces shared by the trainable workers: mini-batch iteration, micro-batch loss
weights, metric accumulation and atomic HuggingFace export."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from verl.protocol import DataProto


def iter_ppo_mini_batches(
    data: DataProto, mini_batch_size: int, epochs: int, shuffle: bool, seed: int
) -> Iterator[DataProto]:
    """Yield ``epochs`` passes of mini-batches of ``mini_batch_size`` samples.

    With ``shuffle`` the samples are permuted once per epoch by a generator seeded with
    ``seed + epoch`` (reproducible, independent of the global RNG). A trailing partial
    mini-batch is kept (never dropped), so every sample contributes to every epoch.
    """
    if mini_batch_size <= 0:
        raise ValueError(f"mini_batch_size must be positive, got {mini_batch_size}")
    for epoch in range(epochs):
        epoch_data = data
        if shuffle:
            gen = torch.Generator().manual_seed(seed * 1_000 + epoch)
            epoch_data = data[torch.randperm(len(data), generator=gen)]
        yield from epoch_data.split(mini_batch_size)


def micro_batch_weights(micro_batches: Sequence[DataProto], loss_agg_mode: str) -> list[float]:
    """Weights that make the sum of weighted micro-batch losses equal the mini-batch loss.

    For ``token-mean`` a micro-batch's loss is a mean over its valid tokens, so it is
    weighted by its share of the mini-batch's valid tokens; for the sequence-mean modes, by
    its share of the non-empty sequences (empty ones are left out of the mean);
    ``seq-mean-token-sum-norm`` divides by a constant and the batch size, so it is weighted
    by its share of all sequences.
    """
    if loss_agg_mode == "token-mean":
        counts = [float(mb.batch["response_mask"].sum().item()) for mb in micro_batches]
    elif loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-mean"):
        # these modes average over sequences with at least one valid token
        counts = [
            float((mb.batch["response_mask"].sum(-1) > 0).sum().item()) for mb in micro_batches
        ]
    else:
        counts = [float(len(mb)) for mb in micro_batches]
    total = sum(counts)
    if total == 0:
        return [0.0 for _ in counts]
    return [c / total for c in counts]


def to_device(data: DataProto, device: torch.device) -> DataProto:
    """``data``'s tensors on ``device`` (a new object: the caller's batch is not moved)."""
    if all(t.device == device for t in data.batch.values()):
        return data
    return data.select().to(device)


class MetricsAccumulator:
    """Collects scalar metrics over micro-batches and steps; reduces by mean (or sum)."""

    def __init__(self) -> None:
        self._values: dict[str, list[float]] = defaultdict(list)
        self._reduce: dict[str, str] = {}

    def add(self, key: str, value: float, reduce: str = "mean") -> None:
        self._values[key].append(float(value))
        self._reduce[key] = reduce

    def result(self) -> dict[str, float]:
        out = {}
        for key, values in self._values.items():
            total = sum(values)
            out[key] = total if self._reduce[key] == "sum" else total / len(values)
        return out


def atomic_save_pretrained(module: Any, tokenizer: Any, out_dir: str | os.PathLike[str]) -> Path:
    """``save_pretrained`` into a temporary sibling directory, then rename into place.

    A crash mid-write never leaves a half-written ``out_dir``; an existing ``out_dir`` is
    replaced only after the new one is complete.
    """
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        module.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
