"""A prompt dataset read row by row, for data-loader worker processes.

:class:`~verl.data.RLHFDataset` reads, validates and tokenizes every row before training
starts. :class:`LazyRLHFDataset` only indexes the files when it is built (the row count of
each parquet row group, the byte offset of each JSON line) and reads, validates and
tokenizes a row when it is asked for it, so that with ``data.dataloader_num_workers > 0``
that work runs in the loader's worker processes, in parallel and ahead of the trainer
(``verl.data.sampler.PromptDataLoader``).

An item is exactly :class:`~verl.data.RLHFDataset`'s item for the same row (same checks,
same chat rendering, same token ids, same ``index``), so the batches do not depend on the
number of workers. What differs:

- a bad row is reported when it is read (the error names the file and the row, as the
  eager dataset's does), not all together before the first step;
- ``truncation=drop`` is refused: dropping a row changes the number of items, which must be
  known before reading them; use ``error`` or ``truncate``;
- a prompt cut by ``truncation=truncate`` is counted per read (``num_truncated`` of the
  driver's dataset, through the batch's ``meta_info["num_truncated"]``).

JSON arrays (``.json`` holding one list) are not indexed lazily: use JSON lines or parquet.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import torch

from verl.data.base import RowDataset
from verl.data.io import (
    DatasetValidationError,
    Record,
    _parquet_rows_one_by_one,
    _parse_json_object,
)
from verl.data.rl_dataset import (
    RLHFDataset,
    char_window,
    required_columns,
    set_prompt_options,
)

__all__ = ["LazyRLHFDataset"]

logger = logging.getLogger(__name__)


class LazyRLHFDataset(RowDataset):
    """The rows of ``data_files`` read on demand (see the module docstring); the arguments
    are :class:`~verl.data.RLHFDataset`'s."""

    noun = RLHFDataset.noun
    truncation_aliases = RLHFDataset.truncation_aliases
    truncated_how = RLHFDataset.truncated_how
    # the row checks and the chat rendering are the eager dataset's own
    _check = RLHFDataset._check
    _render = RLHFDataset._render
    pad_token_id = RLHFDataset.pad_token_id

    def __init__(
        self,
        data_files: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer: Any,
        max_prompt_length: int | None = None,
        truncation: str = "error",
        apply_chat_template: bool = True,
        prompt_key: str = "prompt",
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        set_prompt_options(self, max_prompt_length, prompt_key, tools)
        self._setup(data_files, tokenizer, truncation, apply_chat_template)
        if self.truncation == "drop":
            raise ValueError(
                "data.truncation=drop with data.dataloader_num_workers > 0: the worker "
                "processes read the rows lazily, and dropping a row would change the number "
                "of prompts after the batches are planned; use truncation=error or truncate, "
                "or dataloader_num_workers=0"
            )
        self._window = char_window(tokenizer, max_prompt_length)
        # (file index, parquet row group or -1, row within it / byte offset, 1-based number)
        self._index: list[tuple[int, int, int, int]] = []
        for f, path in enumerate(self.data_files):
            before = len(self._index)
            if path.endswith(".parquet"):
                self._index_parquet(f, path, required_columns(prompt_key))
            else:
                self._index_json_lines(f, path)
            if len(self._index) == before:
                raise DatasetValidationError([f"{path}: the file has no rows"])
        self._cache: tuple[int, int, list[dict[str, Any]]] | None = None
        logger.info(
            "LazyRLHFDataset: %d prompts indexed in %d file(s)", len(self), len(self.data_files)
        )

    def _index_parquet(self, f: int, path: str, columns: Sequence[str]) -> None:
        import pyarrow.parquet as pq  # imported by parquet runs only (~28 MiB)

        meta = pq.ParquetFile(path).metadata
        present = meta.schema.to_arrow_schema().names
        missing = [c for c in columns if c not in present]
        if missing:
            raise DatasetValidationError(
                [f"{path}: missing required column(s) {missing} (columns present: {present})"]
            )
        number = 0
        for group in range(meta.num_row_groups):
            for row in range(meta.row_group(group).num_rows):
                number += 1
                self._index.append((f, group, row, number))

    def _index_json_lines(self, f: int, path: str) -> None:
        with open(path, "rb") as fh:
            head = fh.read(4096).lstrip(b"\xef\xbb\xbf").lstrip()
            if head[:1] == b"[":
                raise DatasetValidationError(
                    [
                        f"{path}: a JSON array cannot be read lazily (data.dataloader_num_workers"
                        " > 0); write it as JSON lines (one object per line) or parquet"
                    ]
                )
            fh.seek(0)
            offset = 0
            for lineno, line in enumerate(fh, start=1):
                if line.strip():
                    self._index.append((f, -1, offset, lineno))
                offset += len(line)

    def __len__(self) -> int:
        return len(self._index)

    def __getstate__(self) -> dict[str, Any]:  # sent to each worker: without the read cache
        return self.__dict__ | {"_cache": None}

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for a dataset of {len(self)} prompts")
        i = i % len(self)
        f, group, pos, number = self._index[i]
        path = self.data_files[f]
        where = f"{path} {'row' if group >= 0 else 'line'} {number}"
        row = self._read(f, group, pos, number)
        problems = self._check(row)
        if problems:
            raise DatasetValidationError([f"{where}: {p}" for p in problems])
        ids, truncated = self._encode(row, where)
        return {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "raw_prompt": list(row[self.prompt_key]),
            "data_source": row["data_source"],
            "ground_truth": row["reward_model"]["ground_truth"],
            "extra_info": dict(row.get("extra_info") or {}),
            "index": i,
            "truncated": truncated,
        }

    def _read(self, f: int, group: int, pos: int, number: int) -> dict[str, Any]:
        path = self.data_files[f]
        if group >= 0:  # one row group is read and kept while its rows are asked for
            if self._cache is None or self._cache[:2] != (f, group):
                import pyarrow.parquet as pq

                table = pq.ParquetFile(path).read_row_group(group)
                try:
                    rows: list[Any] = table.to_pylist()
                except UnicodeDecodeError:  # a string that is not UTF-8: name its row
                    records = _parquet_rows_one_by_one(path, table)
                    rows = [r if r.problem else r.data for r in records]
                self._cache = (f, group, rows)
            row = self._cache[2][pos]
            if isinstance(row, Record):
                raise DatasetValidationError([f"{path} row {number}: {row.problem}"])
            return row
        with open(path, "rb") as fh:
            fh.seek(pos)
            raw = fh.readline()
        if pos == 0:
            raw = raw.removeprefix(b"\xef\xbb\xbf")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DatasetValidationError(
                [f"{path} line {number}: not valid UTF-8 ({exc}); re-encode the file as UTF-8"]
            ) from None
        record = _parse_json_object(path, number, "line", text)
        if record.problem is not None:
            raise DatasetValidationError([f"{record.where}: {record.problem}"])
        return record.data

    def _encode(self, row: dict[str, Any], where: str) -> tuple[list[int], bool]:
        text = self._render(row)
        windowed = self._window is not None and len(text) > self._window
        if windowed:
            text = text[-self._window :]
        ids = self.tokenizer(text, add_special_tokens=not self.apply_chat_template)["input_ids"]
        limit = self.max_prompt_length
        if limit is None or len(ids) <= limit:
            return list(ids), False
        if self.truncation == "error":
            size = f"at least {len(ids)} tokens" if windowed else f"{len(ids)} tokens"
            raise DatasetValidationError(
                [
                    f"{where}: the prompt has {size}, more than max_prompt_length={limit}. "
                    "Raise max_prompt_length or set truncation='truncate' (keep the last "
                    "tokens)"
                ]
            )
        return list(ids[-limit:]), True
