"""DataProto: the one batch container that crosses between the driver and the workers.

A ``DataProto`` holds three things:

- ``batch``: ``dict[str, torch.Tensor]``, every tensor shaped ``(batch, ...)`` with the same
  first dimension;
- ``non_tensor_batch``: ``dict[str, np.ndarray]``, 1-D numpy object arrays of length
  ``batch`` holding per-sample Python values (uids, ground truths, chat messages, dicts);
- ``meta_info``: ``dict`` of values describing the whole batch (temperature, do_sample, ...); metrics are return values, not meta info.

Every operation keeps the rows of ``batch`` and ``non_tensor_batch`` aligned. Operations
that return a new ``DataProto`` (``select``, slicing, ``chunk``, ``split``) share tensor
storage with the original (they are views); ``clone`` makes an independent copy. Operations
documented "in place" mutate the object and return it (or a count) for chaining.

Pickling stores only the bytes each tensor actually covers (a chunk that is a view into a
large batch does not drag the whole storage along), so sending chunks to Ray workers is
cheap.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

__all__ = ["DataProto"]

IndexLike = slice | torch.Tensor | np.ndarray | Sequence[int]


def _to_object_array(key: str, values: Any) -> np.ndarray:
    """Convert per-sample ``values`` to a 1-D object array with one element per sample.

    A list of lists (or a 2-D array) stays one element per row: ``np.array`` would build a
    2-D array from equal-length rows, so the array is allocated first and filled.
    """
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        return values
    if isinstance(values, torch.Tensor):
        raise TypeError(
            f"non-tensor key {key!r} got a torch.Tensor; put tensors in `tensors` (batch)"
        )
    if isinstance(values, np.ndarray):
        if values.ndim == 0:
            raise ValueError(
                f"non-tensor key {key!r} is a 0-d array; per-sample values need one entry "
                "per sample (put batch-wide values in meta_info)"
            )
        rows = list(values) if values.ndim > 1 else values.tolist()
    elif isinstance(values, list | tuple):
        rows = values
    else:
        raise TypeError(
            f"non-tensor key {key!r} must be a list, tuple or numpy array with one entry per "
            f"sample, got {type(values).__name__} (put batch-wide values in meta_info)"
        )
    out = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):
        out[i] = row
    return out


def _values_equal(a: Any, b: Any) -> bool:
    """Equality that works for tensors, arrays and plain Python values."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and a.device == b.device
            and torch.equal(a, b)
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return False
        if a.shape != b.shape:
            return False
        if a.dtype == object or b.dtype == object:
            return all(_values_equal(x, y) for x, y in zip(a.ravel(), b.ravel()))
        return bool(np.array_equal(a, b))
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def _compact(t: torch.Tensor) -> torch.Tensor:
    """Return ``t`` backed by a storage of exactly its own size (for cheap pickling)."""
    if t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


@dataclass(eq=False)
class DataProto:
    """A batch: tensors sharing dim 0, per-sample Python objects, and batch-wide meta info.

    Build with ``DataProto.from_dict`` (or ``from_single_dict``); direct construction is
    also validated. Equality is not defined by ``==`` (tensors have no single truth value);
    use ``equals``.
    """

    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.batch = dict(self.batch)
        self.non_tensor_batch = {
            k: _to_object_array(k, v) for k, v in dict(self.non_tensor_batch).items()
        }
        self.meta_info = dict(self.meta_info)
        self.check_consistency()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(
        cls,
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Any] | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ) -> DataProto:
        """Build a batch, checking that every tensor and non-tensor has the same length.

        ``non_tensors`` values may be lists, tuples or numpy arrays; each becomes a 1-D
        object array with one element per sample (a list of lists stays 1-D).
        """
        return cls(
            batch=dict(tensors or {}),
            non_tensor_batch=dict(non_tensors or {}),
            meta_info=dict(meta_info or {}),
        )

    @classmethod
    def from_single_dict(
        cls, data: Mapping[str, Any], meta_info: Mapping[str, Any] | None = None
    ) -> DataProto:
        """Build from one dict: tensors go to ``batch``, lists/arrays to ``non_tensor_batch``."""
        tensors: dict[str, torch.Tensor] = {}
        non_tensors: dict[str, Any] = {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, np.ndarray | list | tuple):
                non_tensors[key] = value
            else:
                raise TypeError(
                    f"key {key!r} has a {type(value).__name__}; from_single_dict accepts "
                    "tensors and per-sample lists/arrays (pass batch-wide values as meta_info)"
                )
        return cls.from_dict(tensors, non_tensors, meta_info)

    def check_consistency(self) -> None:
        """Raise if keys are malformed or the tensors and arrays disagree on batch size."""
        sizes: dict[str, int] = {}
        for key, t in self.batch.items():
            if not isinstance(key, str):
                raise TypeError(f"batch keys must be str, got {key!r}")
            if not isinstance(t, torch.Tensor):
                raise TypeError(
                    f"batch[{key!r}] is a {type(t).__name__}, expected torch.Tensor "
                    "(per-sample Python values belong in non_tensor_batch)"
                )
            if t.ndim == 0:
                raise ValueError(
                    f"batch[{key!r}] is a 0-d tensor; batch tensors need a batch dimension "
                    "(put batch-wide values in meta_info)"
                )
            sizes[f"batch[{key!r}]"] = t.shape[0]
        for key, arr in self.non_tensor_batch.items():
            if not isinstance(key, str):
                raise TypeError(f"non_tensor_batch keys must be str, got {key!r}")
            if key in self.batch:
                raise ValueError(f"key {key!r} is in both batch and non_tensor_batch")
            sizes[f"non_tensor_batch[{key!r}]"] = len(arr)
        if len(set(sizes.values())) > 1:
            detail = ", ".join(f"{name}: {n}" for name, n in sizes.items())
            raise ValueError(f"batch size mismatch, every entry must share dim 0 ({detail})")

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        for t in self.batch.values():
            return t.shape[0]
        for arr in self.non_tensor_batch.values():
            return len(arr)
        return 0

    def __repr__(self) -> str:
        tensors = ", ".join(
            f"{k}: {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
            + ("" if t.device.type == "cpu" else f" {t.device}")
            for k, t in self.batch.items()
        )
        non_tensors = ", ".join(
            f"{k}: ({len(a)},) object" for k, a in self.non_tensor_batch.items()
        )
        return (
            f"DataProto(len={len(self)}, batch={{{tensors}}}, "
            f"non_tensor_batch={{{non_tensors}}}, meta_info_keys={list(self.meta_info)})"
        )

    def equals(self, other: DataProto) -> bool:
        """True if both hold the same keys with equal values (tensors: same dtype/shape/values)."""
        if not isinstance(other, DataProto):
            return False
        return (
            self.batch.keys() == other.batch.keys()
            and self.non_tensor_batch.keys() == other.non_tensor_batch.keys()
            and self.meta_info.keys() == other.meta_info.keys()
            and all(_values_equal(t, other.batch[k]) for k, t in self.batch.items())
            and all(
                _values_equal(a, other.non_tensor_batch[k])
                for k, a in self.non_tensor_batch.items()
            )
            and all(_values_equal(v, other.meta_info[k]) for k, v in self.meta_info.items())
        )

    def _with(
        self,
        batch: dict[str, torch.Tensor],
        non_tensor_batch: dict[str, np.ndarray],
        meta_info: dict[str, Any] | None = None,
    ) -> DataProto:
        return DataProto(
            batch=batch,
            non_tensor_batch=non_tensor_batch,
            meta_info=dict(self.meta_info if meta_info is None else meta_info),
        )

    # ------------------------------------------------------------------ key operations
    @staticmethod
    def _pick(where: str, source: Mapping[str, Any], keys: Iterable[str] | None) -> list[str]:
        if keys is None:
            return list(source)
        if isinstance(keys, str):
            keys = [keys]
        keys = list(keys)
        missing = [k for k in keys if k not in source]
        if missing:
            raise KeyError(f"{where} has no key(s) {missing}; available: {sorted(source)}")
        return keys

    def select(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_keys: Iterable[str] | None = None,
        meta_keys: Iterable[str] | None = None,
    ) -> DataProto:
        """New DataProto with only the named keys (``None`` keeps all of that kind).

        Tensors and arrays are shared, not copied.
        """
        b = self._pick("batch", self.batch, batch_keys)
        n = self._pick("non_tensor_batch", self.non_tensor_batch, non_tensor_keys)
        m = self._pick("meta_info", self.meta_info, meta_keys)
        return self._with(
            {k: self.batch[k] for k in b},
            {k: self.non_tensor_batch[k] for k in n},
            {k: self.meta_info[k] for k in m},
        )

    def pop(
        self,
        batch_keys: Iterable[str] | None = None,
        non_tensor_keys: Iterable[str] | None = None,
        meta_keys: Iterable[str] | None = None,
    ) -> DataProto:
        """Remove the named keys (``None`` removes none of that kind) and return them."""
        b = self._pick("batch", self.batch, batch_keys or [])
        n = self._pick("non_tensor_batch", self.non_tensor_batch, non_tensor_keys or [])
        m = self._pick("meta_info", self.meta_info, meta_keys or [])
        return DataProto(
            batch={k: self.batch.pop(k) for k in b},
            non_tensor_batch={k: self.non_tensor_batch.pop(k) for k in n},
            meta_info={k: self.meta_info.pop(k) for k in m},
        )

    def union(self, other: DataProto) -> DataProto:
        """In place: add ``other``'s keys to this batch; return ``self``.

        A key present in both must hold equal values (same object, or equal tensors/arrays),
        otherwise ValueError. Batch sizes must match unless one side holds no per-sample data.
        """
        has_rows = bool(self.batch or self.non_tensor_batch)
        other_has_rows = bool(other.batch or other.non_tensor_batch)
        if has_rows and other_has_rows and len(self) != len(other):
            raise ValueError(
                f"union: batch sizes differ ({len(self)} vs {len(other)}); "
                f"keys {sorted(self.batch) + sorted(self.non_tensor_batch)} vs "
                f"{sorted(other.batch) + sorted(other.non_tensor_batch)}"
            )
        for where, mine, theirs in (
            ("batch", self.batch, other.batch),
            ("non_tensor_batch", self.non_tensor_batch, other.non_tensor_batch),
            ("meta_info", self.meta_info, other.meta_info),
        ):
            for key, value in theirs.items():
                if key in mine and not _values_equal(mine[key], value):
                    raise ValueError(
                        f"union: {where} key {key!r} exists in both with different values; "
                        "pop or rename it on one side first"
                    )
        merged_batch = {**self.batch, **other.batch}
        merged_non = {**self.non_tensor_batch, **other.non_tensor_batch}
        clash = merged_batch.keys() & merged_non.keys()
        if clash:
            raise ValueError(f"union: key(s) {sorted(clash)} are a tensor on one side only")
        self.batch = merged_batch
        self.non_tensor_batch = merged_non
        self.meta_info.update(other.meta_info)
        return self

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> DataProto:
        """In place: rename batch or non-tensor keys; return ``self``."""
        old = [old_keys] if isinstance(old_keys, str) else list(old_keys)
        new = [new_keys] if isinstance(new_keys, str) else list(new_keys)
        if len(old) != len(new):
            raise ValueError(f"rename: {len(old)} old keys but {len(new)} new keys")
        for o, n in zip(old, new):
            if o == n:
                continue
            if n in self.batch or n in self.non_tensor_batch:
                raise ValueError(f"rename: target key {n!r} already exists")
            if o in self.batch:
                self.batch[n] = self.batch.pop(o)
            elif o in self.non_tensor_batch:
                self.non_tensor_batch[n] = self.non_tensor_batch.pop(o)
            else:
                available = sorted(self.batch) + sorted(self.non_tensor_batch)
                raise KeyError(f"rename: no key {o!r}; available: {available}")
        return self

    # ------------------------------------------------------------------ row operations
    def _normalize_index(self, index: Any) -> tuple[torch.Tensor, np.ndarray]:
        """Turn an index array/tensor/list (ints or a boolean mask) into int indices."""
        idx = index.cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
        if idx.ndim != 1:
            raise IndexError(f"DataProto index must be 1-D, got shape {idx.shape}")
        if idx.dtype == bool:
            if len(idx) != len(self):
                raise IndexError(f"boolean mask has length {len(idx)}, batch size is {len(self)}")
            idx = np.nonzero(idx)[0]
        elif idx.size == 0:
            idx = idx.astype(np.int64)
        elif not np.issubdtype(idx.dtype, np.integer):
            raise IndexError(f"DataProto index must hold integers or bools, got {idx.dtype}")
        n = len(self)
        if idx.size and (idx.max() >= n or idx.min() < -n):
            raise IndexError(f"index out of range for batch size {n}: {idx.tolist()}")
        idx = idx.astype(np.int64) % max(n, 1)
        return torch.from_numpy(idx), idx

    def __getitem__(self, item: IndexLike) -> DataProto:
        """``dp[2:5]`` (views) or ``dp[index]`` with an int/bool array or tensor (copies)."""
        if isinstance(item, slice):
            return self._with(
                {k: t[item] for k, t in self.batch.items()},
                {k: a[item] for k, a in self.non_tensor_batch.items()},
            )
        if isinstance(item, int | np.integer):
            raise TypeError(
                f"dp[{item}] would drop the batch dimension; use dp[{item}:{int(item) + 1}]"
            )
        if isinstance(item, str):
            raise TypeError(f"use dp.batch[{item!r}] or dp.non_tensor_batch[{item!r}]")
        t_idx, np_idx = self._normalize_index(item)
        return self._with(
            {k: t[t_idx.to(t.device)] for k, t in self.batch.items()},
            {k: a[np_idx] for k, a in self.non_tensor_batch.items()},
        )

    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into ``chunks`` equal pieces (views); the size must divide exactly."""
        if not isinstance(chunks, int) or chunks < 1:
            raise ValueError(f"chunk: chunks must be a positive int, got {chunks!r}")
        n = len(self)
        if n % chunks:
            raise ValueError(
                f"chunk: batch size {n} is not divisible by chunks={chunks}; call "
                f"pad_to_divisor({chunks}) first and unpad(pad_count) after"
            )
        size = n // chunks
        return [self[i * size : (i + 1) * size] for i in range(chunks)]

    def split(self, split_size: int) -> list[DataProto]:
        """Pieces of ``split_size`` rows (views); the last piece may be shorter."""
        if not isinstance(split_size, int) or split_size < 1:
            raise ValueError(f"split: split_size must be a positive int, got {split_size!r}")
        return [self[i : i + split_size] for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Concatenate along the batch dim; ``meta_info`` comes from the first item.

        Inverse of ``chunk``/``split``: ``DataProto.concat(dp.chunk(k))`` equals ``dp``.
        """
        data = list(data)
        if not data:
            raise ValueError("concat: got an empty list")
        first = data[0]
        for i, d in enumerate(data[1:], start=1):
            if d.batch.keys() != first.batch.keys():
                raise ValueError(
                    f"concat: item {i} has batch keys {sorted(d.batch)}, "
                    f"item 0 has {sorted(first.batch)}"
                )
            if d.non_tensor_batch.keys() != first.non_tensor_batch.keys():
                raise ValueError(
                    f"concat: item {i} has non-tensor keys {sorted(d.non_tensor_batch)}, "
                    f"item 0 has {sorted(first.non_tensor_batch)}"
                )
        batch = {}
        for key in first.batch:
            try:
                batch[key] = torch.cat([d.batch[key] for d in data], dim=0)
            except RuntimeError as e:
                shapes = [tuple(d.batch[key].shape) for d in data]
                raise ValueError(f"concat: cannot concatenate {key!r} with shapes {shapes}") from e
        non_tensors = {
            key: np.concatenate([d.non_tensor_batch[key] for d in data])
            for key in first.non_tensor_batch
        }
        return DataProto(batch=batch, non_tensor_batch=non_tensors, meta_info=first.meta_info)

    def repeat(self, repeat_times: int, interleave: bool = True) -> DataProto:
        """New batch with every row repeated: interleave ``[a,a,b,b]``, else ``[a,b,a,b]``."""
        if not isinstance(repeat_times, int) or repeat_times < 1:
            raise ValueError(f"repeat: repeat_times must be a positive int, got {repeat_times!r}")
        if interleave:
            batch = {k: t.repeat_interleave(repeat_times, dim=0) for k, t in self.batch.items()}
            non = {k: np.repeat(a, repeat_times) for k, a in self.non_tensor_batch.items()}
        else:
            batch = {
                k: t.repeat(repeat_times, *([1] * (t.ndim - 1))) for k, t in self.batch.items()
            }
            non = {k: np.tile(a, repeat_times) for k, a in self.non_tensor_batch.items()}
        return self._with(batch, non)

    def reorder(self, indices: torch.Tensor | np.ndarray | Sequence[int]) -> DataProto:
        """In place: row ``i`` becomes old row ``indices[i]`` (a permutation); return ``self``."""
        t_idx, np_idx = self._normalize_index(indices)
        n = len(self)
        if len(np_idx) != n or not np.array_equal(np.sort(np_idx), np.arange(n)):
            raise ValueError(
                f"reorder: indices must be a permutation of range({n}), got {np_idx.tolist()}; "
                "use dp[indices] to gather arbitrary rows"
            )
        self.batch = {k: t[t_idx.to(t.device)] for k, t in self.batch.items()}
        self.non_tensor_batch = {k: a[np_idx] for k, a in self.non_tensor_batch.items()}
        return self

    def pad_to_divisor(self, divisor: int) -> int:
        """In place: append rows copied from the start until ``divisor`` divides the size.

        Padded rows are real samples (rows 0, 1, ... repeated), so they run through any model
        without special-casing. Returns the number of rows added; undo with ``unpad``.
        """
        if not isinstance(divisor, int) or divisor < 1:
            raise ValueError(f"pad_to_divisor: divisor must be a positive int, got {divisor!r}")
        n = len(self)
        pad = (-n) % divisor
        if pad == 0:
            return 0
        if n == 0:
            raise ValueError("pad_to_divisor: cannot pad an empty batch")
        padding = self[np.arange(pad) % n]
        padded = DataProto.concat([self, padding])
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch
        logger.debug("padded batch of %d rows with %d rows to divide by %d", n, pad, divisor)
        return pad

    def unpad(self, pad_count: int) -> DataProto:
        """In place: drop the last ``pad_count`` rows (added by ``pad_to_divisor``); return self."""
        n = len(self)
        if not isinstance(pad_count, int) or not 0 <= pad_count <= n:
            raise ValueError(f"unpad: pad_count must be an int in [0, {n}], got {pad_count!r}")
        if pad_count:
            kept = self[: n - pad_count]
            self.batch, self.non_tensor_batch = kept.batch, kept.non_tensor_batch
        return self

    # ------------------------------------------------------------------ copies and devices
    def to(self, device: str | torch.device) -> DataProto:
        """In place: move every tensor to ``device``; return ``self``."""
        self.batch = {k: t.to(device) for k, t in self.batch.items()}
        return self

    def clone(self) -> DataProto:
        """Independent deep copy (tensors cloned, per-sample objects and meta info deep-copied)."""
        return DataProto(
            batch={k: t.clone() for k, t in self.batch.items()},
            non_tensor_batch=copy.deepcopy(self.non_tensor_batch),
            meta_info=copy.deepcopy(self.meta_info),
        )

    def __getstate__(self) -> dict[str, Any]:
        # A view (e.g. one chunk of a big batch) would otherwise pickle its whole storage.
        state = dict(self.__dict__)
        state["batch"] = {k: _compact(t) for k, t in self.batch.items()}
        return state
