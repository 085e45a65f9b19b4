"""Preference data for DPO / IPO (pairs) and KTO (labelled singles): reading, validation,
tokenisation and collation into one forward batch.

Rows (parquet or JSON lines), one of two formats per dataset:

    pairs (dpo, ipo, and kto)            prompt     str | [{"role", "content"}, ...]
                                         chosen     str | [{"role": "assistant", ...}, ...]
                                         rejected   str | [{"role": "assistant", ...}, ...]
    labelled singles (kto only)          prompt     as above
                                         completion str | [{"role": "assistant", ...}, ...]
                                         label      bool (true = desirable)

A text prompt is one user message; a text completion is one assistant message. With the
chat template, the prompt is ``render(prompt, add_generation_prompt=True)`` and the
completion is what ``render(prompt + completion)`` adds after it, up to and including the
tokenizer's eos token (e.g. ChatML's ``<|im_end|>``, not the newline after it). Without it
(``apply_chat_template=False``), prompt and completion are the plain texts, the prompt
encoded with the tokenizer's special tokens (a bos) and the completion followed by eos.

Limits: the prompt may have at most ``max_prompt_length`` tokens and prompt + completion at
most ``max_length``. ``truncation="truncate"`` keeps the end of the prompt and the start of
the completion, ``"drop"`` drops the row, ``"error"`` lists every offending row.

Every problem (missing columns, wrong types, empty completions, a non-bool label) is
collected and raised in one ``DatasetValidationError`` naming file and row.

A batch (:func:`collate_preference`) is one forward pass: prompts left-padded, completions
right-padded, so completions occupy the last ``response_len`` columns as in the RL
trainer; a batch of ``B`` pairs has ``2B`` rows, the chosen ones first.
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch

from verl.data.base import (
    TRUNCATION_MODES,
    RowDataset,
    as_messages,
    end_after_eos,
    join_contents,
    render_chat,
    shown,
    validate_messages,
)
from verl.data.io import DatasetValidationError, write_records
from verl.data.sft_dataset import arithmetic_val_problems

logger = logging.getLogger(__name__)

PREFERENCE_TRUNCATION_POLICIES = TRUNCATION_MODES
PAIRED_COLUMNS = ("prompt", "chosen", "rejected")
UNPAIRED_COLUMNS = ("prompt", "completion", "label")

__all__ = [
    "PAIRED_COLUMNS",
    "PREFERENCE_TRUNCATION_POLICIES",
    "UNPAIRED_COLUMNS",
    "PreferenceDataset",
    "collate_preference",
    "encode_prompt_completion",
    "make_arithmetic_preference_rows",
    "write_arithmetic_preference_dataset",
]


def _row_format(row: dict[str, Any]) -> str | None:
    """ "paired", "unpaired" or None from the keys a row has (ignoring null values)."""
    present = {k for k, v in row.items() if v is not None}
    if present & {"chosen", "rejected"}:
        return "paired"
    if present & {"completion", "label"}:
        return "unpaired"
    return None


def _check_prompt(prompt: Any) -> list[str]:
    if isinstance(prompt, str):
        return [] if prompt.strip() else ["empty prompt: 'prompt' is blank"]
    return validate_messages(prompt, "'prompt'")


def _check_completion(value: Any, key: str) -> list[str]:
    if isinstance(value, str):
        return [] if value.strip() else [f"empty {key}: {key!r} is blank"]
    problems = validate_messages(value, repr(key), nonblank=key)
    if not problems and any(m["role"] != "assistant" for m in value):
        return [f"{key!r} messages must all have role 'assistant'"]
    return problems


def validate_preference_row(row: dict[str, Any], fmt: str) -> list[str]:
    """Problems of one row in format ``fmt`` ("paired" or "unpaired")."""
    columns = PAIRED_COLUMNS if fmt == "paired" else UNPAIRED_COLUMNS
    missing = [k for k in columns if row.get(k) is None]
    if missing:
        return [f"missing column(s) {missing}; {fmt} rows need {list(columns)}"]
    problems = _check_prompt(row["prompt"])
    if fmt == "paired":
        problems += _check_completion(row["chosen"], "chosen")
        problems += _check_completion(row["rejected"], "rejected")
    else:
        problems += _check_completion(row["completion"], "completion")
        label = row["label"]
        if not isinstance(label, (bool, np.bool_)):
            problems.append(
                f"'label' must be a boolean (true = desirable, false = undesirable), got "
                f"{shown(label)}"
            )
    return problems


def encode_prompt_completion(
    tokenizer: Any, prompt: Any, completion: Any, apply_chat_template: bool = True
) -> tuple[list[int], list[int]]:
    """``(prompt_ids, completion_ids)`` of a prompt and one completion (see module docstring)."""
    if not apply_chat_template:
        eos = getattr(tokenizer, "eos_token", None) or ""
        prompt_ids = tokenizer(join_contents(prompt), add_special_tokens=True)["input_ids"]
        completion_text = join_contents(completion) + eos
        completion_ids = tokenizer(completion_text, add_special_tokens=False)["input_ids"]
        return prompt_ids, completion_ids
    prompt_msgs = as_messages(prompt, "user")
    completion_msgs = as_messages(completion, "assistant")
    prompt_text = render_chat(tokenizer, prompt_msgs, add_generation_prompt=True)
    full = render_chat(tokenizer, prompt_msgs + completion_msgs, add_generation_prompt=False)
    if not full.startswith(prompt_text):
        raise ValueError(
            "the chat template is not prefix-consistent: the prompt rendered with the "
            "generation prompt is not a prefix of prompt + completion"
        )
    end = end_after_eos(full, len(prompt_text), len(full), getattr(tokenizer, "eos_token", None))
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(full[len(prompt_text) : end], add_special_tokens=False)["input_ids"]
    return prompt_ids, completion_ids


class PreferenceDataset(RowDataset):
    """Tokenised preference rows with optional precomputed reference log-probs.

    Args:
        data_files: one path or a list of paths, concatenated in order. All rows must
            share one format (pairs, or labelled singles).
        tokenizer: a HF tokenizer (with a chat template unless ``apply_chat_template=False``).
        max_prompt_length / max_length: token limits (None = no limit).
        truncation: "error", "drop" or "truncate" (see the module docstring and
            `verl.data.base`).
        apply_chat_template: render messages with the chat template.
        max_reported_problems: how many problems the validation error lists.

    ``paired`` tells the format. Items are dicts: ``prompt_ids`` and ``chosen_ids`` /
    ``rejected_ids`` (pairs) or ``completion_ids`` / ``label`` (singles), ``index``, and
    after :meth:`set_reference_log_probs` the reference sequence log-probs
    (``ref_chosen_logps`` / ``ref_rejected_logps`` or ``ref_logps``).
    """

    noun = "row"

    def __init__(
        self,
        data_files: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer: Any,
        max_prompt_length: int | None = None,
        max_length: int | None = None,
        truncation: Literal["error", "drop", "truncate"] = "error",
        apply_chat_template: bool = True,
        max_reported_problems: int = 20,
    ) -> None:
        if (
            max_prompt_length is not None
            and max_length is not None
            and max_prompt_length >= max_length
        ):
            raise ValueError(
                f"max_prompt_length={max_prompt_length} must be < max_length={max_length}"
            )
        self.max_prompt_length = max_prompt_length
        self.max_length = max_length
        self.paired = True
        self._items: list[dict[str, Any]] = []
        self._setup(data_files, tokenizer, truncation, apply_chat_template)
        self._read(max_reported_problems)

    @classmethod
    def from_items(cls, items: list[dict[str, Any]], paired: bool) -> PreferenceDataset:
        """A dataset over already tokenised items (no files)."""
        ds = cls.__new__(cls)
        ds.data_files, ds.tokenizer = [], None
        ds.max_prompt_length = ds.max_length = None
        ds.truncation, ds.apply_chat_template = "error", True
        ds.num_truncated = ds.num_dropped = 0
        ds.dropped_rows = []
        ds.paired = paired
        ds._items = [dict(it) for it in items]
        return ds

    # ------------------------------------------------------------------ reading
    def _read(self, max_reported: int) -> None:
        records, problems = self._read_records()
        formats: dict[str, str] = {}
        for rec in records:
            if rec.problem is None and (fmt := _row_format(rec.data)) is not None:
                formats.setdefault(fmt, rec.where)
        if len(formats) > 1:
            raise DatasetValidationError(
                [
                    f"mixed row formats: {formats['paired']} has chosen/rejected (pairs) but "
                    f"{formats['unpaired']} has completion/label (KTO); use one format per run"
                ]
            )
        fmt = next(iter(formats), "paired")
        self.paired = fmt == "paired"

        def check(row: dict[str, Any]) -> list[str]:
            if _row_format(row) is None:
                return [
                    "missing column(s): a row needs prompt, chosen, rejected (pairs) or "
                    f"prompt, completion, label (KTO); it has {sorted(row)}"
                ]
            return validate_preference_row(row, fmt)

        rows = self._check_rows(records, problems, check, self._tokenize, max_reported)
        if self.paired:
            identical = sum(
                row.encoded["chosen_ids"] == row.encoded["rejected_ids"] for row in rows
            )
            if identical:
                logger.warning(
                    "%d pair(s) have identical chosen and rejected completions (zero gradient)",
                    identical,
                )
        max_p, max_len = self.max_prompt_length, self.max_length
        rows = self._apply_length_limit(
            rows,
            too_long=lambda row: self._excess(row.encoded) is not None,
            cut=lambda row: self._cut(row.encoded),
            error_problems=lambda over: [
                f"{row.where}: {self._excess(row.encoded)}" for row in over
            ],
            limits=f"max_prompt_length={max_p}, max_length={max_len}",
        )
        for row in rows:
            self._items.append({**row.encoded, "index": row.index, "where": row.where})
        logger.info(
            "PreferenceDataset: %d %s from %d file(s)",
            len(self),
            "pairs" if self.paired else "labelled completions",
            len(self.data_files),
        )

    def _tokenize(self, row: dict[str, Any]) -> dict[str, Any]:
        def enc(completion: Any) -> tuple[list[int], list[int]]:
            return encode_prompt_completion(
                self.tokenizer, row["prompt"], completion, self.apply_chat_template
            )

        if self.paired:
            prompt_ids, chosen_ids = enc(row["chosen"])
            _, rejected_ids = enc(row["rejected"])
            return {
                "prompt_ids": prompt_ids,
                "chosen_ids": chosen_ids,
                "rejected_ids": rejected_ids,
            }
        prompt_ids, completion_ids = enc(row["completion"])
        return {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "label": bool(row["label"]),
        }

    def _completion_keys(self) -> tuple[str, ...]:
        return ("chosen_ids", "rejected_ids") if self.paired else ("completion_ids",)

    def _excess(self, item: dict[str, Any]) -> str | None:
        """What is over the limits in ``item`` (None when it fits), with the fix."""
        max_p, max_len = self.max_prompt_length, self.max_length
        p = len(item["prompt_ids"])
        longest = max(len(item[k]) for k in self._completion_keys())
        if (max_p is None or p <= max_p) and (max_len is None or p + longest <= max_len):
            return None
        return (
            f"prompt {p} tokens (max_prompt_length={max_p}), prompt + longest completion "
            f"{p + longest} tokens (max_length={max_len}); raise the limits, or set "
            "data.truncation=truncate or drop"
        )

    def _cut(self, item: dict[str, Any]) -> bool:
        """Keep the prompt's end and the completions' start; False when no completion
        token would fit (the row is then dropped)."""
        max_p, max_len = self.max_prompt_length, self.max_length
        if max_p is not None:
            item["prompt_ids"] = item["prompt_ids"][-max_p:]
        if max_len is None:
            return True
        room = max_len - len(item["prompt_ids"])
        if room < 1:
            return False
        for k in self._completion_keys():
            item[k] = item[k][:room]
        return True

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self._items[index]

    def to_unpaired(self) -> PreferenceDataset:
        """KTO view of a paired dataset: each pair becomes a desirable (chosen) and an
        undesirable (rejected) row, in that order. Reference log-probs carry over."""
        if not self.paired:
            return self
        items = []
        for it in self._items:
            for key, label in (("chosen", True), ("rejected", False)):
                new = {
                    "prompt_ids": it["prompt_ids"],
                    "completion_ids": it[f"{key}_ids"],
                    "label": label,
                    "index": it["index"],
                    "where": it["where"],
                }
                if f"ref_{key}_logps" in it:
                    new["ref_logps"] = it[f"ref_{key}_logps"]
                items.append(new)
        return PreferenceDataset.from_items(items, paired=False)

    def set_reference_log_probs(self, **columns: Sequence[float]) -> None:
        """Store reference sequence log-probs, one value per row, e.g.
        ``set_reference_log_probs(ref_chosen_logps=[...], ref_rejected_logps=[...])``."""
        expected = ("ref_chosen_logps", "ref_rejected_logps") if self.paired else ("ref_logps",)
        if set(columns) != set(expected):
            raise ValueError(f"expected columns {expected}, got {sorted(columns)}")
        for name, values in columns.items():
            if len(values) != len(self):
                raise ValueError(f"{name}: {len(values)} values for {len(self)} rows")
            for item, value in zip(self._items, values):
                item[name] = float(value)

    @property
    def has_reference_log_probs(self) -> bool:
        key = "ref_chosen_logps" if self.paired else "ref_logps"
        return all(key in it for it in self._items)


def collate_preference(
    items: Sequence[dict[str, Any]], pad_token_id: int, paired: bool
) -> dict[str, torch.Tensor]:
    """One forward batch of prompt + completion sequences.

    Pairs: ``B`` items give ``2B`` rows, chosen completions first (rows ``0..B-1``), then
    rejected ones. Singles: ``B`` rows, plus ``labels`` (``(B,)`` bool).

    Returns ``input_ids``, ``attention_mask``, ``position_ids`` (``(rows, P + R)``, prompts
    left-padded to ``P``, completions right-padded to ``R``), ``response_mask``
    (``(rows, R)``, 1 on completion tokens) and, when the items carry them, the reference
    log-probs: ``ref_chosen_logps`` / ``ref_rejected_logps`` ``(B,)`` or ``ref_logps``.
    """
    if not items:
        raise ValueError("collate_preference got no items")
    if paired:
        prompts = [it["prompt_ids"] for it in items] * 2
        completions = [it["chosen_ids"] for it in items] + [it["rejected_ids"] for it in items]
    else:
        prompts = [it["prompt_ids"] for it in items]
        completions = [it["completion_ids"] for it in items]
    n = len(prompts)
    p_len = max(len(p) for p in prompts)
    r_len = max(max(len(c) for c in completions), 1)
    input_ids = torch.full((n, p_len + r_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((n, p_len + r_len), dtype=torch.long)
    for r, (p, c) in enumerate(zip(prompts, completions)):
        input_ids[r, p_len - len(p) : p_len] = torch.as_tensor(p, dtype=torch.long)
        input_ids[r, p_len : p_len + len(c)] = torch.as_tensor(c, dtype=torch.long)
        attention_mask[r, p_len - len(p) : p_len + len(c)] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    out = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": attention_mask[:, p_len:].clone(),
    }
    if paired:
        if all("ref_chosen_logps" in it for it in items):
            out["ref_chosen_logps"] = torch.tensor([it["ref_chosen_logps"] for it in items])
            out["ref_rejected_logps"] = torch.tensor([it["ref_rejected_logps"] for it in items])
    else:
        out["labels"] = torch.tensor([bool(it["label"]) for it in items], dtype=torch.bool)
        if all("ref_logps" in it for it in items):
            out["ref_logps"] = torch.tensor([it["ref_logps"] for it in items])
    return out


# ---------------------------------------------------------------------- built-in data


def _wrong_answer(rng: random.Random, answer: int) -> int:
    """A nearby wrong, non-negative answer."""
    while True:
        wrong = answer + rng.choice((-3, -2, -1, 1, 2, 3, 10))
        if wrong >= 0:
            return wrong


def make_arithmetic_preference_rows(
    n: int,
    digits: int | tuple[int, int] = 1,
    ops: Sequence[str] = ("+",),
    seed: int = 0,
    split: str = "train",
    exclude: set | None = None,
) -> list[dict[str, Any]]:
    """``n`` pairs: an arithmetic question, the right answer (chosen), a wrong one (rejected)."""
    from verl.data.arithmetic import OPERATORS, make_arithmetic_rows

    rng = random.Random(seed * 7919 + 17)
    out = []
    for row in make_arithmetic_rows(n, digits, ops, seed, split, "chat", exclude):
        info = row["extra_info"]
        answer = OPERATORS[info["op"]](info["a"], info["b"])
        out.append(
            {
                "prompt": row["prompt"],
                "chosen": str(answer),
                "rejected": str(_wrong_answer(rng, answer)),
            }
        )
    return out


def write_arithmetic_preference_dataset(
    out_dir: str | os.PathLike,
    train_size: int,
    val_size: int,
    digits: int | tuple[int, int] = 1,
    ops: Sequence[str] = ("+",),
    seed: int = 0,
) -> tuple[str, str | None]:
    """Write ``pref_train.parquet`` (and ``pref_test.parquet`` when ``val_size > 0``)."""
    exclude = arithmetic_val_problems(val_size, digits, ops, seed)
    rows = make_arithmetic_preference_rows(train_size, digits, ops, 2 * seed, "train", exclude)
    train_path = write_records(rows, os.path.join(out_dir, "pref_train.parquet"))
    val_path = None
    if val_size > 0:
        rows = make_arithmetic_preference_rows(val_size, digits, ops, 2 * seed + 1, "test")
        val_path = write_records(rows, os.path.join(out_dir, "pref_test.parquet"))
    return train_path, val_path
