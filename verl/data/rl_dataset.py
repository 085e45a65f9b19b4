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
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from verl.data.io import DatasetValidationError, Record, normalize_paths, read_records
from verl.protocol import DataProto

logger = logging.getLogger(__name__)

TRUNCATION_POLICIES = ("error", "drop", "left")
REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model")

__all__ = [
    "REQUIRED_COLUMNS",
    "TRUNCATION_POLICIES",
    "DatasetValidationError",
    "RLHFDataset",
    "collate_fn",
    "collate_prompts",
    "validate_row",
]


def _shown(value: Any) -> str:
    """The type and (shortened) value, for messages: "int 3", "str 'abc'"."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


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
        problems.append(f"'data_source' must be a string, got {_shown(source)}")
    prompt = row.get(prompt_key)
    if prompt is not None:
        problems.extend(_validate_prompt(prompt, prompt_key))
    reward = row.get("reward_model")
    if reward is not None:
        if not isinstance(reward, dict):
            problems.append(
                f"'reward_model' must be a dict with a 'ground_truth' key, got {_shown(reward)}"
            )
        elif reward.get("ground_truth") is None:
            problems.append("missing ground truth: 'reward_model' has no 'ground_truth' value")
    extra = row.get("extra_info")
    if extra is not None and not isinstance(extra, dict):
        problems.append(f"'extra_info' must be a dict, got {_shown(extra)}")
    ability = row.get("ability")
    if ability is not None and not isinstance(ability, str):
        problems.append(f"'ability' must be a string, got {_shown(ability)}")
    return problems


def _validate_prompt(prompt: Any, prompt_key: str) -> list[str]:
    if not isinstance(prompt, (list, tuple)):
        return [
            f"{prompt_key!r} must be a list of chat messages {{'role': ..., 'content': ...}}, "
            f"got {_shown(prompt)}"
        ]
    if len(prompt) == 0:
        return [f"empty prompt: {prompt_key!r} has no messages"]
    problems = []
    for j, msg in enumerate(prompt):
        if not isinstance(msg, dict):
            problems.append(f"prompt message {j} must be a dict, got {_shown(msg)}")
            continue
        for key in ("role", "content"):
            if key not in msg or msg[key] is None:
                problems.append(f"prompt message {j} has no {key!r}")
            elif not isinstance(msg[key], str):
                problems.append(
                    f"prompt message {j} {key!r} must be a string, got {_shown(msg[key])}"
                )
    if not problems and all(not m["content"].strip() for m in prompt):
        problems.append("empty prompt: every message content is blank")
    return problems


class RLHFDataset(Dataset):
    """Tokenized prompts with their reward metadata, read from parquet / JSON lines files.

    Args:
        data_files: one path or a list of paths (`.parquet`, `.jsonl`, `.json` lines);
            rows are concatenated in the order given.
        tokenizer: a HF tokenizer (a chat template is needed unless
            `apply_chat_template=False`).
        max_prompt_length: limit on prompt tokens, or None for no limit.
        truncation: what to do with prompts longer than `max_prompt_length`:
            "error" raises naming the longest row, "drop" removes the rows (count in
            `num_dropped`, locations in `dropped_rows`), "left" keeps the last
            `max_prompt_length` tokens (count in `num_truncated`).
        apply_chat_template: render messages with the chat template (True) or join the
            contents with newlines (False).
        max_reported_problems: how many problems the validation error lists.
        prompt_key: the column holding the chat messages.

    Item `i` is a dict: `input_ids` (prompt_len,) int64 unpadded, `raw_prompt` (the
    messages), `data_source`, `ground_truth` (as stored), `extra_info` (dict, {} when
    absent), `index` (0-based row index over all files concatenated, counted before any
    rows are dropped, so it identifies the source row).
    """

    def __init__(
        self,
        data_files: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer: Any,
        max_prompt_length: int | None = None,
        truncation: Literal["error", "drop", "left"] = "error",
        apply_chat_template: bool = True,
        max_reported_problems: int = 20,
        prompt_key: str = "prompt",
    ):
        if truncation not in TRUNCATION_POLICIES:
            raise ValueError(f"truncation={truncation!r}; choose one of {TRUNCATION_POLICIES}")
        if max_prompt_length is not None and max_prompt_length < 1:
            raise ValueError(f"max_prompt_length={max_prompt_length} must be >= 1 (or None)")
        self.data_files = normalize_paths(data_files)
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.apply_chat_template = apply_chat_template
        self.prompt_key = prompt_key
        self.num_dropped = 0  # rows removed by truncation="drop"
        self.dropped_rows: list[str] = []  # their locations, e.g. "train.parquet row 7"
        self.num_truncated = 0  # rows shortened by truncation="left"
        if apply_chat_template and getattr(tokenizer, "chat_template", None) is None:
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise ValueError(
                f"the tokenizer {name!r} has no chat template, and data.apply_chat_template="
                "True needs one; use an instruct model's tokenizer, set "
                "tokenizer.chat_template, or set data.apply_chat_template=false (base models)"
            )

        rows, where = self._read_and_validate(max_reported_problems)
        ids = self._tokenize([r[prompt_key] for r in rows], where)
        keep = self._apply_length_limit(ids, where)

        self._rows = [rows[i] for i in keep]
        self._where = [where[i] for i in keep]
        self._source_index = np.asarray(keep, dtype=np.int64)
        kept_ids = [ids[i] for i in keep]
        self.prompt_lengths = np.array([len(x) for x in kept_ids], dtype=np.int64)
        self._offsets = np.concatenate([[0], np.cumsum(self.prompt_lengths)]).astype(np.int64)
        # One flat array + offsets: compact, and cheap to pickle (e.g. to a Ray actor).
        self._flat_ids = np.concatenate([np.asarray(x, dtype=np.int64) for x in kept_ids])
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

    def _read_and_validate(self, max_reported: int) -> tuple[list[dict], list[str]]:
        problems: list[str] = []
        rows: list[dict] = []
        where: list[str] = []
        for path in self.data_files:
            rf = read_records(path)
            if rf.columns is not None:
                missing = [c for c in required_columns(self.prompt_key) if c not in rf.columns]
                if missing:
                    problems.append(
                        f"{path}: missing required column(s) {missing} "
                        f"(columns present: {rf.columns})"
                    )
                    continue
            if not rf.records:
                problems.append(f"{path}: the file has no rows")
            for rec in rf.records:
                row_problems = self._record_problems(rec)
                problems.extend(f"{rec.where}: {p}" for p in row_problems)
                if not row_problems:
                    rows.append(rec.data)
                    where.append(rec.where)
        if problems:
            raise DatasetValidationError(problems, max_reported)
        return rows, where

    def _record_problems(self, rec: Record) -> list[str]:
        if rec.problem is not None:
            return [rec.problem]
        prompt = rec.data.get(self.prompt_key)
        if isinstance(prompt, str):
            # A plain-text prompt is one user turn.
            rec.data[self.prompt_key] = [{"role": "user", "content": prompt}]
        return validate_row(rec.data, self.prompt_key)

    def _tokenize(self, prompts: list[list[dict]], where: list[str]) -> list[list[int]]:
        if self.apply_chat_template:
            texts = [self._render(p, w) for p, w in zip(prompts, where)]
            return self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        texts = ["\n".join(m["content"] for m in p) for p in prompts]
        return self.tokenizer(texts, add_special_tokens=True)["input_ids"]

    def _render(self, messages: list[dict], where: str) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                list(messages), add_generation_prompt=True, tokenize=False
            )
        except Exception as e:  # template errors are jinja's own types; name the row
            raise ValueError(f"{where}: the chat template failed on this prompt: {e}") from e

    def _apply_length_limit(self, ids: list[list[int]], where: list[str]) -> list[int]:
        """Enforce `max_prompt_length`; returns the positions of the rows to keep."""
        limit = self.max_prompt_length
        keep = list(range(len(ids)))
        too_long = [] if limit is None else [i for i, x in enumerate(ids) if len(x) > limit]
        if not too_long:
            return keep
        if self.truncation == "error":
            worst = max(too_long, key=lambda i: len(ids[i]))
            raise ValueError(
                f"{len(too_long)} prompt(s) exceed max_prompt_length={limit}; the longest is "
                f"{where[worst]} with {len(ids[worst])} tokens. Raise max_prompt_length or set "
                "truncation='drop' (skip them) or 'left' (keep the last tokens)."
            )
        if self.truncation == "drop":
            self.num_dropped = len(too_long)
            self.dropped_rows = [where[i] for i in too_long]
            logger.warning(
                "dropped %d prompt(s) longer than max_prompt_length=%d: %s%s",
                self.num_dropped,
                limit,
                ", ".join(self.dropped_rows[:20]),
                " ..." if self.num_dropped > 20 else "",
            )
            dropped = set(too_long)
            keep = [i for i in keep if i not in dropped]
            if not keep:
                raise ValueError(
                    f"every prompt exceeds max_prompt_length={limit} and was dropped; "
                    "raise max_prompt_length"
                )
            return keep
        # "left": keep the end of the prompt, where the question and generation prompt are.
        for i in too_long:
            ids[i] = ids[i][-limit:]
        self.num_truncated = len(too_long)
        logger.warning(
            "left-truncated %d prompt(s) to max_prompt_length=%d", self.num_truncated, limit
        )
        return keep

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
