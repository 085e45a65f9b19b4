"""Prompt dataset for RL training (`RLHFDataset`) and its left-padding collate function.

Rows follow verl's format, in parquet or JSON lines files (one or many):

    data_source   str                               which reward function scores the row
    prompt        [{"role": str, "content": str}]   chat messages, non-empty (a plain
                                                    string is read as one user message)
    reward_model  {"ground_truth": ..., "style": str (optional)}
    extra_info    dict (optional)
    ability       str (optional)

Everything is read, validated and tokenized when the dataset is built, before training
starts: prompt datasets are small (thousands to a few hundred thousand rows), so the token
ids are kept in one flat int64 array and `__getitem__` is a slice. Validation collects every
problem (up to `max_reported_problems` in the message) and raises one `DatasetValidationError`
naming the file and the 1-based row (parquet) or line (JSON lines) of each.

Prompts are rendered with the tokenizer's chat template (`add_generation_prompt=True`) and
encoded without adding special tokens, i.e. the same ids as
`tokenizer.apply_chat_template(messages, add_generation_prompt=True)`. With
`apply_chat_template=False` the message contents are joined with newlines and encoded with
the tokenizer's default special tokens (a bos for tokenizers that add one), for base models.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from verl.data.base import (
    TRUNCATION_MODES,
    Row,
    RowDataset,
    join_contents,
    render_chat,
    shown,
    validate_messages,
)
from verl.data.io import DatasetValidationError
from verl.protocol import DataProto

logger = logging.getLogger(__name__)

# accepted spellings of `truncation`; "left" is the older name of "truncate" here
TRUNCATION_POLICIES = (*TRUNCATION_MODES, "left")
REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")

__all__ = [
    "REQUIRED_COLUMNS",
    "TRUNCATION_POLICIES",
    "DatasetValidationError",
    "RLHFDataset",
    "collate_fn",
    "collate_prompts",
    "scan_first_rows_by_source",
    "validate_row",
]


def char_window(tokenizer: Any, max_tokens: int | None) -> int | None:
    """Characters at the end of a text that surely hold more than ``max_tokens`` tokens:
    no token stands for more characters than its vocabulary string is long (byte-level and
    sentencepiece vocabularies alike), so ``2 * (max_tokens + 1)`` times the longest
    vocabulary string is a bound with a factor 2 to spare (None: no limit, or no vocabulary)."""
    if max_tokens is None or not hasattr(tokenizer, "get_vocab"):
        return None
    longest = max((len(token) for token in tokenizer.get_vocab()), default=0)
    return 2 * (max_tokens + 1) * max(longest, 1) if longest else None


def required_columns(prompt_key: str = "prompt") -> tuple[str, ...]:
    return tuple(prompt_key if c == "prompt" else c for c in REQUIRED_COLUMNS)


def validate_row(row: dict[str, Any], prompt_key: str = "prompt") -> list[str]:
    """Return the problems of one row in verl's prompt format (empty list when valid).

    `prompt_key` names the column holding the chat messages.
    """
    problems: list[str] = []
    for key in required_columns(prompt_key):
        if row.get(key) is None:
            problems.append(f"missing required field {key!r}")
    source = row.get("data_source")
    if source is not None and not isinstance(source, str):
        problems.append(f"'data_source' must be a string, got {shown(source)}")
    prompt = row.get(prompt_key)
    if prompt is not None:
        problems.extend(validate_messages(prompt, repr(prompt_key), "prompt", "prompt"))
    reward = row.get("reward_model")
    if reward is not None:
        if not isinstance(reward, dict):
            problems.append(
                f"'reward_model' must be a dict with a 'ground_truth' key, got {shown(reward)}"
            )
        elif reward.get("ground_truth") is None:
            problems.append("missing ground truth: 'reward_model' has no 'ground_truth' value")
    extra = row.get("extra_info")
    if extra is not None and not isinstance(extra, dict):
        problems.append(f"'extra_info' must be a dict, got {shown(extra)}")
    ability = row.get("ability")
    if ability is not None and not isinstance(ability, str):
        problems.append(f"'ability' must be a string, got {shown(ability)}")
    return problems


def set_prompt_options(
    dataset: Any, max_prompt_length: int | None, prompt_key: str, tools: Any
) -> None:
    """The prompt settings every RL prompt dataset keeps (eager and lazy alike)."""
    if max_prompt_length is not None and max_prompt_length < 1:
        raise ValueError(f"max_prompt_length={max_prompt_length} must be >= 1 (or None)")
    dataset.prompt_key = prompt_key
    dataset.tools = list(tools) if tools else None
    dataset.max_prompt_length = max_prompt_length


class RLHFDataset(RowDataset, Dataset):
    """Tokenized prompts with their reward metadata, read from parquet / JSON lines files.

    Args:
        data_files: one path or a list of paths (`.parquet`, `.jsonl`, `.json` lines);
            rows are concatenated in the order given.
        tokenizer: a HF tokenizer (a chat template is needed unless
            `apply_chat_template=False`).
        max_prompt_length: limit on prompt tokens, or None for no limit.
        truncation: what to do with prompts longer than `max_prompt_length`
            (`verl.data.base`): "error" raises naming the longest row, "drop" removes the
            rows (count in `num_dropped`, locations in `dropped_rows`), "truncate" (or its
            older spelling "left") keeps the last `max_prompt_length` tokens (count in
            `num_truncated`).
        apply_chat_template: render messages with the chat template (True) or join the
            contents with newlines (False).
        max_reported_problems: how many problems the validation error lists.
        prompt_key: the column holding the chat messages.
        tools: OpenAI function schemas for multi-turn rollouts, given to the chat
            template (or described in the system message; `verl.data.base.render_chat`).

    Item `i` is a dict: `input_ids` (prompt_len,) int64 unpadded, `raw_prompt` (the
    messages), `data_source`, `ground_truth` (as stored), `extra_info` (dict, {} when
    absent), `index` (0-based row index over all files concatenated, counted before any
    rows are dropped, so it identifies the source row).
    """

    noun = "prompt"
    truncation_aliases: ClassVar[Mapping[str, str]] = {"left": "truncate"}
    truncated_how = "left-truncated"

    def __init__(
        self,
        data_files: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer: Any,
        max_prompt_length: int | None = None,
        truncation: Literal["error", "drop", "truncate", "left"] = "error",
        apply_chat_template: bool = True,
        max_reported_problems: int = 20,
        prompt_key: str = "prompt",
        tools: list[dict[str, Any]] | None = None,
    ):
        set_prompt_options(self, max_prompt_length, prompt_key, tools)
        self._setup(data_files, tokenizer, truncation, apply_chat_template)
        rows = self._read_rows(
            self._check, self._render, max_reported_problems, required_columns(prompt_key)
        )
        # A prompt far over the limit is cut to its last `window` characters before it is
        # tokenised (a 10 MB prompt took 3.5 GB and 24-35 s to tokenise): they still hold
        # more than max_prompt_length tokens, and the same last ones.
        window = char_window(tokenizer, max_prompt_length)
        self._windowed: dict[int, int] = {}  # row index -> characters before the cut
        for row in rows:
            if window is not None and len(row.encoded) > window:
                self._windowed[row.index] = len(row.encoded)
                row.encoded = row.encoded[-window:]
        # one batched call: the fast tokenizer encodes a list much faster than row by row
        texts = [row.encoded for row in rows]
        for row, ids in zip(
            rows, tokenizer(texts, add_special_tokens=not apply_chat_template)["input_ids"]
        ):
            row.encoded = ids
        rows = (
            self._apply_length_limit(
                rows,
                too_long=lambda row: len(row.encoded) > max_prompt_length,
                cut=self._keep_end,
                error_problems=self._too_long_problem,
                limits=f"max_prompt_length={max_prompt_length}",
            )
            if max_prompt_length is not None
            else rows
        )

        self._rows = [row.data for row in rows]
        self._where = [row.where for row in rows]
        self._source_index = np.asarray([row.index for row in rows], dtype=np.int64)
        self.prompt_lengths = np.array([len(row.encoded) for row in rows], dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(self.prompt_lengths)]).astype(np.int64)
        # One flat array + offsets: compact, and cheap to pickle (e.g. to a Ray actor).
        self._flat_ids = np.concatenate([np.asarray(row.encoded, dtype=np.int64) for row in rows])
        logger.info(
            "RLHFDataset: %d prompts from %d file(s), prompt tokens min/mean/max %d/%.1f/%d",
            len(self),
            len(self.data_files),
            self.prompt_lengths.min(),
            self.prompt_lengths.mean(),
            self.prompt_lengths.max(),
        )

    @property
    def pad_token_id(self) -> int | None:
        return self.tokenizer.pad_token_id

    def _check(self, row: dict[str, Any]) -> list[str]:
        prompt = row.get(self.prompt_key)
        if isinstance(prompt, str):
            # A plain-text prompt is one user turn.
            row[self.prompt_key] = [{"role": "user", "content": prompt}]
        return validate_row(row, self.prompt_key)

    def _render(self, row: dict[str, Any]) -> str:
        """The prompt's text: the chat template with the generation prompt, or the plain
        contents (tokenised with the tokenizer's special tokens, e.g. a bos)."""
        messages = row[self.prompt_key]
        if not self.apply_chat_template:
            return join_contents(messages)
        return render_chat(
            self.tokenizer, list(messages), add_generation_prompt=True, tools=self.tools
        )

    def _keep_end(self, row: Row) -> bool:
        # the end of the prompt holds the question and the generation prompt
        row.encoded = row.encoded[-self.max_prompt_length :]
        return True

    def _too_long_problem(self, over: list[Row]) -> list[str]:
        worst = max(over, key=lambda row: (self._windowed.get(row.index, 0), len(row.encoded)))
        size = f"{len(worst.encoded)} tokens"
        if worst.index in self._windowed:
            size = (
                f"{self._windowed[worst.index]} characters (at least {len(worst.encoded)} "
                "tokens in its end alone)"
            )
        return [
            f"{len(over)} prompt(s) exceed max_prompt_length={self.max_prompt_length}; the "
            f"longest is {worst.where} with {size}. Raise "
            "max_prompt_length or set truncation='drop' (skip them) or 'truncate' (keep the "
            "last tokens; older spelling 'left')."
        ]

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for a dataset of {len(self)} prompts")
        i = i % len(self)
        row = self._rows[i]
        start, end = self._offsets[i], self._offsets[i + 1]
        return {
            "input_ids": torch.tensor(self._flat_ids[start:end], dtype=torch.long),
            "raw_prompt": list(row[self.prompt_key]),
            "data_source": row["data_source"],
            "ground_truth": row["reward_model"]["ground_truth"],
            "extra_info": dict(row.get("extra_info") or {}),
            "index": int(self._source_index[i]),
        }

    def location(self, i: int) -> str:
        """Where item `i` came from, e.g. "train.parquet row 12" (1-based)."""
        return self._where[i]

    def first_rows_by_source(self) -> dict[str, str]:
        """``{data_source: where its first row is}`` (e.g. ``"train.parquet row 12"``),
        over the rows kept, in file order."""
        first: dict[str, str] = {}
        for row, where in zip(self._rows, self._where):
            first.setdefault(row["data_source"], where)
        return first


def scan_first_rows_by_source(data_files: Sequence[str | os.PathLike]) -> dict[str, str]:
    """:meth:`RLHFDataset.first_rows_by_source` read from the files themselves (the
    ``data_source`` column of a parquet file alone), for a dataset that reads its rows
    lazily. Rows without a string ``data_source`` are skipped (the dataset reports them)."""
    from verl.data.io import PARQUET_SUFFIXES, read_records

    first: dict[str, str] = {}
    for path in map(os.fspath, data_files):
        if path.endswith(PARQUET_SUFFIXES):
            import pyarrow.parquet as pq

            column = pq.read_table(path, columns=["data_source"]).column(0).to_pylist()
            places = ((value, f"{path} row {i + 1}") for i, value in enumerate(column))
        else:
            places = (
                ((r.data or {}).get("data_source"), r.where) for r in read_records(path).records
            )
        for source, where in places:
            if isinstance(source, str):
                first.setdefault(source, where)
    return first


NON_TENSOR_KEYS = ("raw_prompt", "data_source", "ground_truth", "extra_info", "index")


def _object_array(values: list[Any]) -> np.ndarray:
    # Assign one by one: np.array(list_of_lists, dtype=object) would build a 2-D array
    # when the lists happen to have equal lengths.
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def collate_prompts(
    items: Sequence[dict[str, Any]], pad_token_id: int, max_prompt_length: int | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray]]:
    """Left-pad dataset items; returns (tensors, non_tensors) as plain dicts.

    tensors: `input_ids`, `attention_mask`, `position_ids`, each (batch, P) int64, where P is
    the longest prompt in the batch, or `max_prompt_length` when given.
    `position_ids = clamp(cumsum(attention_mask) - 1, min=0)`, so the first real token is at
    position 0 and padding positions are 0. non_tensors: numpy object arrays (batch,) for
    `raw_prompt`, `data_source`, `ground_truth`, `extra_info`, `index`.
    """
    if len(items) == 0:
        raise ValueError("cannot collate an empty list of items")
    if pad_token_id is None:
        raise ValueError(
            "pad_token_id is None; give the tokenizer a pad token "
            "(e.g. tokenizer.pad_token = tokenizer.eos_token)"
        )
    lengths = [int(it["input_ids"].numel()) for it in items]
    longest = max(lengths)
    if max_prompt_length is None:
        width = longest
    elif longest > max_prompt_length:
        raise ValueError(
            f"a prompt has {longest} tokens, more than max_prompt_length={max_prompt_length}; "
            "build the dataset with the same max_prompt_length so long prompts are handled"
        )
    else:
        width = max_prompt_length
    batch = len(items)
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, width), dtype=torch.long)
    for b, (it, n) in enumerate(zip(items, lengths)):
        if n:
            input_ids[b, width - n :] = it["input_ids"]
            attention_mask[b, width - n :] = 1
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
    }
    non_tensors = {k: _object_array([it[k] for it in items]) for k in NON_TENSOR_KEYS}
    return tensors, non_tensors


def collate_fn(
    items: Sequence[dict[str, Any]], pad_token_id: int, max_prompt_length: int | None = None
) -> DataProto:
    """Left-pad dataset items into a `DataProto` (see `collate_prompts` for the keys)."""
    tensors, non_tensors = collate_prompts(items, pad_token_id, max_prompt_length)
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
