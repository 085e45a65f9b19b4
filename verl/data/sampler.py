"""Deterministic, resumable batching of a prompt dataset for the RL loop.

`ResumableBatchSampler` yields lists of dataset indices; `PromptDataLoader` collates them
into `DataProto` batches. Both keep (epoch, position) and expose `state_dict()` /
`load_state_dict()`, so a run resumed from a checkpoint sees exactly the batches the
uninterrupted run would have seen.

Order: sample order is a sequence of "passes", each a permutation of the dataset drawn
from `torch.Generator().manual_seed(seed + pass)` (or `0..N-1` without shuffling), so the
order depends only on the seed and never on global RNG state.

Remainders (`N` samples, batch size `B`, `N % B != 0`):

- `drop_last=False` (validation): each epoch is one pass; the last batch is smaller.
  `len = ceil(N / B)`.
- `drop_last=True, carry_remainder=True` (training default): every batch is full and no
  sample is ever skipped. The passes are concatenated into one stream that is cut into
  batches of `B`; an epoch is `len = N // B` batches of that stream. The `N % B` samples
  left at the end of an epoch open the next one, so epochs and passes drift apart and
  pass `p` (not epoch `p`) seeds the permutation. Over `E` epochs the loop trains on
  exactly `E * (N // B)` batches, each sample at most once per pass.
- `drop_last=True, carry_remainder=False` (PyTorch's semantics): epoch `e` is pass `e`
  cut to `N // B` full batches; the last `N % B` samples of each permutation are unused
  (a different random subset every epoch). The count is logged every epoch.

Iterating continues from the current position: breaking out of a loop and iterating
again resumes the same epoch; finishing an epoch moves to the next. A state saved right
after the last batch of epoch `e` (position == len) resumes at the start of epoch `e + 1`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch

from verl.data.rl_dataset import collate_fn as collate_prompt_batch

logger = logging.getLogger(__name__)

_STATE_CONFIG_KEYS = (
    "num_samples",
    "batch_size",
    "shuffle",
    "seed",
    "drop_last",
    "carry_remainder",
)


class ResumableBatchSampler:
    """Seeded per-pass shuffling into batches of indices, with a resumable position.

    Args:
        num_samples: dataset size N (>= 1).
        batch_size: samples per batch B (>= 1; <= N when `drop_last`).
        shuffle: permute each pass (seeded) or keep file order.
        seed: base seed; pass `p` uses `seed + p`.
        drop_last: yield only full batches (training) or end epochs with a partial batch.
        carry_remainder: with `drop_last`, carry the `N % B` leftover samples into the next
            epoch instead of leaving them unused (see the module docstring).
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        carry_remainder: bool = True,
    ):
        if num_samples < 1:
            raise ValueError(f"num_samples={num_samples}: the dataset is empty")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        if drop_last and batch_size > num_samples:
            raise ValueError(
                f"batch_size={batch_size} is larger than the dataset ({num_samples} samples) "
                "with drop_last=True, so no batch can be formed; lower the batch size"
            )
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.carry_remainder = carry_remainder
        self._epoch = 0
        self._position = 0
        self._perm_cache: dict[int, torch.Tensor] = {}
        remainder = num_samples % batch_size
        if drop_last and remainder and carry_remainder:
            logger.info(
                "%d samples, batch_size=%d: %d samples per epoch carry over to the next epoch",
                num_samples,
                batch_size,
                remainder,
            )

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def position(self) -> int:
        """Batches of the current epoch already yielded."""
        return self._position

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples // self.batch_size
        return math.ceil(self.num_samples / self.batch_size)

    def _permutation(self, pass_index: int) -> torch.Tensor:
        perm = self._perm_cache.get(pass_index)
        if perm is None:
            if self.shuffle:
                gen = torch.Generator().manual_seed(self.seed + pass_index)
                perm = torch.randperm(self.num_samples, generator=gen)
            else:
                perm = torch.arange(self.num_samples)
            # A batch spans at most two passes: keep only the newest two permutations.
            self._perm_cache = {k: v for k, v in self._perm_cache.items() if k >= pass_index - 1}
            self._perm_cache[pass_index] = perm
        return perm

    def batch_indices(self, epoch: int, k: int) -> list[int]:
        """Dataset indices of batch `k` of `epoch` (a pure function of the settings)."""
        n, b = self.num_samples, self.batch_size
        if not 0 <= k < len(self):
            raise IndexError(f"batch {k} out of range for an epoch of {len(self)} batches")
        if not (self.drop_last and self.carry_remainder):
            return self._permutation(epoch)[k * b : min((k + 1) * b, n)].tolist()
        start = (epoch * len(self) + k) * b  # position in the stream of concatenated passes
        out: list[int] = []
        while len(out) < b:
            pass_index, offset = divmod(start + len(out), n)
            take = min(b - len(out), n - offset)
            out.extend(self._permutation(pass_index)[offset : offset + take].tolist())
        return out

    def __iter__(self) -> Iterator[list[int]]:
        self._begin_epoch()
        while self._position < len(self):
            batch = self.batch_indices(self._epoch, self._position)
            # Advance before yielding so a state saved after receiving a batch excludes it.
            self._position += 1
            yield batch
        self._epoch, self._position = self._epoch + 1, 0

    def remaining_batches(self) -> list[list[int]]:
        """The indices of the current epoch's batches from the position on (moving to the
        next epoch first when this one is done), without advancing: a loader that reads
        ahead (worker processes) plans with this and calls :meth:`advance` per batch it
        hands out, so the position counts the batches consumed, never those prefetched."""
        self._begin_epoch()
        return [self.batch_indices(self._epoch, k) for k in range(self._position, len(self))]

    def advance(self) -> None:
        """One more batch of the current epoch handed out (see :meth:`remaining_batches`)."""
        if self._position >= len(self):
            raise RuntimeError("advance past the end of the epoch")
        self._position += 1

    def finish_epoch(self) -> None:
        """Every batch of the epoch handed out: the next iteration starts the next epoch."""
        self._epoch, self._position = self._epoch + 1, 0

    def _begin_epoch(self) -> None:
        if self._position >= len(self):
            self._epoch, self._position = self._epoch + 1, 0
        if self._position == 0 and self.drop_last and not self.carry_remainder:
            unused = self.num_samples % self.batch_size
            if unused:
                logger.info(
                    "epoch %d: %d of %d samples unused (not a multiple of batch_size=%d)",
                    self._epoch,
                    unused,
                    self.num_samples,
                    self.batch_size,
                )

    def state_dict(self) -> dict[str, Any]:
        state = {k: getattr(self, k) for k in _STATE_CONFIG_KEYS}
        state.update(epoch=self._epoch, position=self._position)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in _STATE_CONFIG_KEYS:
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"cannot resume: the saved sampler state has {key}={state[key]!r} but this "
                    f"sampler has {key}={getattr(self, key)!r}; resume with the same data "
                    "settings"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= len(self):
            raise ValueError(f"invalid sampler state epoch={epoch}, position={position}")
        self._epoch, self._position = epoch, position


class PromptDataLoader:
    """Iterate a prompt dataset in resumable, collated batches (a `StatefulDataLoader` peer).

    `collate_fn(items) -> batch` defaults to `verl.data.rl_dataset.collate_fn` with the
    dataset's `pad_token_id`,
    producing `DataProto` batches. With `num_workers=0` items are read and collated in the
    calling process (a pre-tokenized dataset makes a batch a few slices and one padding
    copy). With `num_workers > 0` a `torch.utils.data.DataLoader` reads and collates them
    in worker processes (`persistent_workers`, `prefetch_factor` as in torch), for a
    dataset that reads lazily (`verl.data.lazy_dataset`); the batches are the same: the
    sampler plans the epoch's index lists (`remaining_batches`), the workers only read
    them, in order, and the position advances per batch handed out, so a state saved
    mid-epoch resumes exactly whatever the workers had prefetched.
    `len(loader)` is the number of batches per epoch; see the module docstring for how
    `drop_last` and `carry_remainder` treat a dataset size that is not a multiple of the
    batch size.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        collate_fn: Callable[[list[dict[str, Any]]], Any] | None = None,
        carry_remainder: bool = True,
        num_workers: int = 0,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
    ):
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0")
        if num_workers == 0 and (persistent_workers or prefetch_factor is not None):
            raise ValueError(
                f"persistent_workers={persistent_workers}, prefetch_factor={prefetch_factor} "
                "need worker processes: set num_workers >= 1 (data.dataloader_num_workers)"
            )
        self.dataset = dataset
        self.sampler = ResumableBatchSampler(
            len(dataset), batch_size, shuffle, seed, drop_last, carry_remainder
        )
        if collate_fn is None:
            collate_fn = partial(collate_prompt_batch, pad_token_id=dataset.pad_token_id)
        self.collate_fn = collate_fn
        self.num_workers = num_workers
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self._plan = _EpochPlan()
        self._torch_loader: Any = None

    @property
    def batch_size(self) -> int:
        return self.sampler.batch_size

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        if self.num_workers == 0:
            for indices in self.sampler:
                yield self.collate_fn([self.dataset[i] for i in indices])
            return
        self._plan.batches = self.sampler.remaining_batches()
        batches = iter(self._workers())
        try:
            for batch in batches:
                self.sampler.advance()
                yield self._received(batch)
        finally:
            # A worker's error or a loop left early stops this epoch's workers now, not when
            # a garbage collection finds the iterator (an exception's traceback holds it in
            # a reference cycle). Persistent workers serve the next epoch: close() stops them.
            if not self.persistent_workers:
                _stop_workers(batches)
        self.sampler.finish_epoch()
        if not self.persistent_workers:
            self._torch_loader = None

    def _workers(self) -> Any:
        if self._torch_loader is None:
            from torch.utils.data import DataLoader

            self._torch_loader = DataLoader(
                self.dataset,
                batch_sampler=self._plan,
                collate_fn=_CountingCollate(self.collate_fn),
                num_workers=self.num_workers,
                persistent_workers=self.persistent_workers,
                prefetch_factor=self.prefetch_factor,
                # the workers' base seed comes from this generator: without one, torch draws
                # it from the global generator at every epoch's start, and a run with loader
                # workers would sample other responses than one without (rollout.seed null)
                generator=torch.Generator().manual_seed(self.sampler.seed),
            )
        return self._torch_loader

    def _received(self, batch: Any) -> Any:
        meta = getattr(batch, "meta_info", None)
        if isinstance(meta, dict) and "num_truncated" in meta:
            truncated = meta.pop("num_truncated")
            if hasattr(self.dataset, "num_truncated"):
                self.dataset.num_truncated += truncated
        return batch

    def close(self) -> None:
        """Stop the worker processes (persistent ones live until then, or until exit)."""
        loader, self._torch_loader = self._torch_loader, None
        _stop_workers(getattr(loader, "_iterator", None))

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])


def _stop_workers(iterator: Any) -> None:
    """Stop a torch DataLoader iterator's worker processes (idempotent; None: nothing)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


class _EpochPlan:
    """The batch sampler the torch loader reads: the index lists planned for this epoch."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        return iter(list(self.batches))

    def __len__(self) -> int:
        return len(self.batches)


class _CountingCollate:
    """``collate_fn`` in a worker, with the prompts it cut counted in the batch's
    ``meta_info["num_truncated"]`` (the driver's dataset adds them up)."""

    def __init__(self, collate_fn: Callable[[list[dict[str, Any]]], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, items: list[dict[str, Any]]) -> Any:
        batch = self.collate_fn(items)
        truncated = sum(bool(it.get("truncated", False)) for it in items)
        if truncated and isinstance(getattr(batch, "meta_info", None), dict):
            batch.meta_info["num_truncated"] = truncated
        return batch
