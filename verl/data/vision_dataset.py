"""The RL prompt dataset of image prompts (a vision-language model) and its collate.

:class:`VisionRLHFDataset` is :class:`~verl.data.rl_dataset.RLHFDataset` for rows with an
``images`` column (the format of ``docs/vision.md``): every row and every image is read
and validated when the dataset is built (:func:`verl.data.vision.read_vision_rows`), each
prompt is processed once then to know its length (image tokens included) for
``max_prompt_length``, and an item is processed again when it is read
(:func:`verl.data.vision.process_prompt`: the decoded pixels are not kept).

Item ``i``: the keys of ``RLHFDataset`` (``input_ids`` (L,), ``raw_prompt``,
``data_source``, ``ground_truth``, ``extra_info``, ``index``) plus ``mm_token_type_ids``
(L,) (text 0, image 1), ``multimodal_position_ids`` (L, 4) (row 0 the text positions,
rows 1-3 the model's multimodal rope index) and ``multi_modal_inputs``, a dict of the
row's ``pixel_values`` (patches, patch_dim) and ``image_grid_thw`` (images, 3) (empty for a
row without images).

:func:`collate_vision_prompts` left-pads ``input_ids``, ``attention_mask``,
``position_ids`` (B, P) as :func:`~verl.data.rl_dataset.collate_prompts`, and
``mm_token_type_ids`` (B, P) and ``multimodal_position_ids`` (B, P, 4) with zeros. The
images stay per row: ``non_tensor_batch["multi_modal_inputs"]`` holds each row's dict
(rows have different patch counts, which a ``DataProto`` tensor cannot hold), so every
row selection, split and repeat of the batch carries its rows' images with them; a
forward concatenates the dicts of its rows in row order (what the model reads:
``pixel_values`` of every image, ``image_grid_thw`` one row per image). The token axis is
second in ``multimodal_position_ids`` so that the micro-batch trim cuts it with the other
(rows, seq) tensors; a forward transposes it to the model's (4, rows, seq).

``truncation``: ``error`` and ``drop`` as ``RLHFDataset``; a prompt with images cannot be
cut (its image tokens must all stay), so ``truncate`` raises like ``error`` for them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from verl.data.base import resolve_truncation
from verl.data.io import DatasetValidationError, normalize_paths
from verl.data.rl_dataset import _object_array, collate_prompts
from verl.data.vision import (
    IMAGE_INPUTS_KEY,
    IMAGE_KEY,
    MM_TOKEN_TYPES_KEY,
    MULTIMODAL_POSITIONS_KEY,
    process_prompt,
    read_vision_rows,
)
from verl.protocol import DataProto

logger = logging.getLogger(__name__)

__all__ = ["VisionRLHFDataset", "collate_vision_fn", "collate_vision_prompts", "has_image_column"]


def has_image_column(data_files: str | os.PathLike | Sequence[str | os.PathLike]) -> bool:
    """Whether the first file's rows have an ``images`` column (parquet schema, or the
    first JSON line)."""
    from verl.data.io import PARQUET_SUFFIXES, read_records

    path = os.fspath(normalize_paths(data_files)[0])
    if path.endswith(PARQUET_SUFFIXES):
        import pyarrow.parquet as pq

        return IMAGE_KEY in pq.read_schema(path).names
    records = read_records(path).records
    return bool(records) and IMAGE_KEY in (records[0].data or {})


class VisionRLHFDataset(Dataset):
    """Image prompts with their reward metadata (module docstring).

    Args:
        data_files: one path or a list (parquet, ``.jsonl``).
        processor: the model's processor (``verl.models.vision_processor.load_vision_processor``).
        model_config: the model's config (for the multimodal rope index).
        max_prompt_length: limit on prompt tokens (image tokens included), or None.
        truncation: ``error`` / ``drop`` (``truncate``, ``left``: as ``error``).
        prompt_key, image_key: the columns of the messages and the images.
    """

    def __init__(
        self,
        data_files: str | os.PathLike | Sequence[str | os.PathLike],
        processor: Any,
        model_config: Any,
        max_prompt_length: int | None = None,
        truncation: str = "error",
        prompt_key: str = "prompt",
        image_key: str = IMAGE_KEY,
        max_reported_problems: int = 20,
    ):
        if max_prompt_length is not None and max_prompt_length < 1:
            raise ValueError(f"max_prompt_length={max_prompt_length} must be >= 1 (or None)")
        self.data_files = normalize_paths(data_files)
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.model_config = model_config
        self.max_prompt_length = max_prompt_length
        self.truncation = resolve_truncation(truncation, {"left": "truncate"})
        self.prompt_key = prompt_key
        rows = read_vision_rows(self.data_files, image_key, prompt_key, max_reported_problems)
        lengths = [len(self._process(row)["input_ids"]) for row in rows]
        self.num_dropped = 0
        self.num_truncated = 0  # a prompt with images is never cut
        self.dropped_rows: list[str] = []
        if max_prompt_length is not None:
            over = [i for i, n in enumerate(lengths) if n > max_prompt_length]
            if over and self.truncation != "drop":
                worst = max(over, key=lambda i: lengths[i])
                raise DatasetValidationError(
                    [
                        f"{len(over)} prompt(s) exceed max_prompt_length={max_prompt_length}; "
                        f"the longest is {rows[worst].where} with {lengths[worst]} tokens "
                        "(image tokens included). Raise max_prompt_length or set "
                        "truncation='drop' (a prompt with images cannot be cut)"
                    ],
                    max_reported_problems,
                )
            keep = set(range(len(rows))) - set(over)
            self.dropped_rows = [rows[i].where for i in over]
            self.num_dropped = len(over)
            self._source_index = np.asarray(sorted(keep), dtype=np.int64)
            rows = [rows[i] for i in sorted(keep)]
            lengths = [lengths[i] for i in sorted(keep)]
        else:
            self._source_index = np.arange(len(rows), dtype=np.int64)
        if not rows:
            raise DatasetValidationError(["no prompt is left after the length limit"], 1)
        self._rows = rows
        self.prompt_lengths = np.asarray(lengths, dtype=np.int64)
        logger.info(
            "VisionRLHFDataset: %d image prompts, prompt tokens min/mean/max %d/%.1f/%d",
            len(rows),
            self.prompt_lengths.min(),
            self.prompt_lengths.mean(),
            self.prompt_lengths.max(),
        )

    @property
    def pad_token_id(self) -> int | None:
        return self.tokenizer.pad_token_id

    def _process(self, row: Any) -> dict[str, torch.Tensor]:
        return process_prompt(
            self.processor, row.data[self.prompt_key], row.load_images(), self.model_config
        )

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for a dataset of {len(self)} prompts")
        i = i % len(self)
        row = self._rows[i]
        inputs = self._process(row)
        images = {k: inputs[k] for k in ("pixel_values", "image_grid_thw") if k in inputs}
        return {
            "input_ids": inputs["input_ids"],
            MM_TOKEN_TYPES_KEY: inputs["mm_token_type_ids"],
            MULTIMODAL_POSITIONS_KEY: inputs["position_ids"].T.contiguous(),
            IMAGE_INPUTS_KEY: images,
            "raw_prompt": list(row.data[self.prompt_key]),
            "data_source": row.data["data_source"],
            "ground_truth": row.data["reward_model"]["ground_truth"],
            "extra_info": dict(row.data.get("extra_info") or {}),
            "index": int(self._source_index[i]),
        }

    def location(self, i: int) -> str:
        """Where item ``i`` came from, e.g. ``"train.parquet row 12"``."""
        return self._rows[i].where

    def first_rows_by_source(self) -> dict[str, str]:
        """``{data_source: where its first row is}``, in file order."""
        first: dict[str, str] = {}
        for row in self._rows:
            first.setdefault(row.data["data_source"], row.where)
        return first


def collate_vision_prompts(
    items: Sequence[dict[str, Any]], pad_token_id: int, max_prompt_length: int | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    """Left-pad image prompt items; returns (tensors, non_tensors) (module docstring)."""
    tensors, non_tensors = collate_prompts(items, pad_token_id, max_prompt_length)
    batch, width = tensors["input_ids"].shape
    types = torch.zeros((batch, width), dtype=torch.long)
    positions = torch.zeros((batch, width, 4), dtype=torch.long)
    for b, item in enumerate(items):
        n = int(item["input_ids"].numel())
        if n:
            types[b, width - n :] = item[MM_TOKEN_TYPES_KEY]
            positions[b, width - n :] = item[MULTIMODAL_POSITIONS_KEY]
    tensors[MM_TOKEN_TYPES_KEY] = types
    tensors[MULTIMODAL_POSITIONS_KEY] = positions
    non_tensors[IMAGE_INPUTS_KEY] = _object_array([item[IMAGE_INPUTS_KEY] for item in items])
    return tensors, non_tensors


def collate_vision_fn(
    items: Sequence[dict[str, Any]], pad_token_id: int, max_prompt_length: int | None = None
) -> DataProto:
    """:func:`collate_vision_prompts` as a ``DataProto``."""
    tensors, non_tensors = collate_vision_prompts(items, pad_token_id, max_prompt_length)
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
