"""Preference pairs for reward-model training: the pair dataset with an optional per-pair
margin, its collation, and a generator of arithmetic pairs (a correct answer against wrong
ones).

Rows are the DPO pair format (``verl.data.preference_dataset``), plus an optional margin::

    prompt     str | [{"role", "content"}, ...]
    chosen     str | [{"role": "assistant", ...}, ...]
    rejected   str | [{"role": "assistant", ...}, ...]
    margin     float, optional: how much better chosen is (upstream's ``margin`` column)

The margin ``m`` enters the Bradley-Terry loss as ``-logsigmoid(r_chosen - r_rejected - m)``
(``verl.trainer.offline.rm.reward_pair_loss``). Every row of a dataset has a finite number
there, or none does (then ``m = 0``); a dataset with margins on some rows only is refused
with the rows that lack one. Labelled singles (KTO's prompt/completion/label) are refused:
a reward model compares two completions of one prompt.

:func:`make_answer_pairs` builds pairs from arithmetic problems
(``verl.data.arithmetic``): the prompt is the RL prompt ("What is 3 + 4? Answer with just
the number."), chosen is the right answer and rejected a wrong one, ``wrong_per_problem``
distinct wrong answers per problem, each drawn from the errors a small policy makes: off by a
little (``nearby``), another operator's result on the same operands (``operator``), or any
number in the answers' range (``random``).
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch

from verl.data.io import Record, write_records
from verl.data.preference_dataset import PreferenceDataset, collate_preference

__all__ = [
    "WRONG_KINDS",
    "RewardPairDataset",
    "collate_reward_pairs",
    "make_answer_pairs",
    "write_answer_pairs",
]

WRONG_KINDS = ("nearby", "operator", "random")


class RewardPairDataset(PreferenceDataset):
    """Tokenised preference pairs with a per-pair margin (0 without a margin column).

    Args:
        data_files / tokenizer / max_prompt_length / max_length / truncation /
            apply_chat_template / max_reported_problems: as :class:`PreferenceDataset`.
        margin_key: the margin column; None ignores any such column.

    Items: those of :class:`PreferenceDataset` (``prompt_ids``, ``chosen_ids``,
    ``rejected_ids``, ``index``, ``where``) plus ``margin`` (float). ``has_margins`` tells
    whether the files had the column.
    """

    def __init__(
        self,
        data_files: str | os.PathLike | Sequence[str | os.PathLike],
        tokenizer: Any,
        max_prompt_length: int | None = None,
        max_length: int | None = None,
        truncation: Literal["error", "drop", "truncate"] = "error",
        apply_chat_template: bool = True,
        max_reported_problems: int = 20,
        margin_key: str | None = "margin",
    ) -> None:
        self.margin_key = margin_key
        self.has_margins = False
        super().__init__(
            data_files,
            tokenizer,
            max_prompt_length=max_prompt_length,
            max_length=max_length,
            truncation=truncation,
            apply_chat_template=apply_chat_template,
            max_reported_problems=max_reported_problems,
        )
        if not self.paired:
            from verl.data.io import DatasetValidationError

            raise DatasetValidationError(
                [
                    f"{', '.join(self.data_files)}: the rows are labelled completions "
                    "(prompt/completion/label); a reward model trains on pairs: give "
                    "prompt/chosen/rejected rows"
                ]
            )

    def _read_records(self, required_columns: Sequence[str] = ()) -> tuple[list[Record], list[str]]:
        """The records, with the margin column's problems added (see the module docstring)."""
        records, problems = super()._read_records(required_columns)
        key = self.margin_key
        if key is None:
            return records, problems
        readable = [r for r in records if r.problem is None and isinstance(r.data, dict)]
        with_margin = [r for r in readable if r.data.get(key) is not None]
        self.has_margins = bool(with_margin)
        if not with_margin:
            return records, problems
        for rec in readable:
            value = rec.data.get(key)
            if value is None:
                problems.append(
                    f"{rec.where}: no {key!r} value, but {with_margin[0].where} has one: give "
                    f"every row a margin or none (or set data.margin_key=null)"
                )
            elif isinstance(value, (bool, np.bool_)) or not isinstance(
                value, (int, float, np.integer, np.floating)
            ):
                problems.append(f"{rec.where}: {key!r} must be a number, got {_shown(value)}")
            elif not math.isfinite(float(value)):
                problems.append(f"{rec.where}: {key!r} must be finite, got {value!r}")
        return records, problems

    def _tokenize(self, row: dict[str, Any]) -> dict[str, Any]:
        encoded = super()._tokenize(row)
        value = row.get(self.margin_key) if self.margin_key is not None else None
        encoded["margin"] = 0.0 if value is None else float(value)
        return encoded


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:57] + '...' if len(text) > 60 else text}"


def collate_reward_pairs(
    items: Sequence[dict[str, Any]], pad_token_id: int
) -> dict[str, torch.Tensor]:
    """One forward batch of ``B`` pairs: :func:`collate_preference`'s ``2B`` rows (chosen
    first; ``input_ids`` / ``attention_mask`` / ``position_ids`` ``(2B, P + R)``, prompts
    left-padded, completions right-padded) plus ``margin`` ``(B,)`` float32 (0 where an item
    has none)."""
    batch = collate_preference(items, pad_token_id, paired=True)
    batch["margin"] = torch.tensor([float(it.get("margin", 0.0)) for it in items])
    return batch


# ---------------------------------------------------------------------- arithmetic pairs


def _wrong_answers(
    rng: random.Random, problem: tuple[int, str, int], k: int, top: int, kinds: Sequence[str]
) -> list[tuple[int, str]]:
    """Up to ``k`` distinct wrong non-negative answers to ``problem`` with their kind."""
    from verl.data.arithmetic import OPERATORS

    a, op, b = problem
    answer = OPERATORS[op](a, b)
    operator = sorted({f(max(a, b), min(a, b)) for o, f in OPERATORS.items() if o != op} - {answer})
    out: dict[int, str] = {}
    for _ in range(50 * k):
        if len(out) == k:
            break
        kind = rng.choice(list(kinds))
        if kind == "nearby":
            wrong = answer + rng.choice((-10, -3, -2, -1, 1, 2, 3, 10))
        elif kind == "operator":
            if not operator:
                continue
            wrong = rng.choice(operator)
        else:
            wrong = rng.randint(0, top)
        if wrong >= 0 and wrong != answer and wrong not in out:
            out[wrong] = kind
    return list(out.items())


def make_answer_pairs(
    n: int,
    digits: int | tuple[int, int] = 1,
    ops: Sequence[str] = ("+", "-", "*"),
    seed: int = 0,
    split: str = "train",
    exclude: set | None = None,
    wrong_per_problem: int = 2,
    kinds: Sequence[str] = WRONG_KINDS,
    margin: float | None = None,
) -> list[dict[str, Any]]:
    """Pairs on ``n`` arithmetic problems (``verl.data.arithmetic.make_arithmetic_rows``,
    drawn with ``seed``, none in ``exclude``): ``wrong_per_problem`` pairs per problem, each
    the right answer (chosen) against a distinct wrong one (rejected) of a kind drawn from
    ``kinds``. Rows: ``prompt`` (chat messages), ``chosen``, ``rejected``, ``error`` (the
    wrong answer's kind), and ``margin`` when ``margin`` is given. Deterministic for a seed.
    """
    from verl.data.arithmetic import OPERATORS, make_arithmetic_rows, row_problem

    if wrong_per_problem < 1:
        raise ValueError(f"wrong_per_problem={wrong_per_problem}: must be >= 1")
    unknown = [k for k in kinds if k not in WRONG_KINDS]
    if unknown or not kinds:
        raise ValueError(f"kinds={list(kinds)}: choose a non-empty subset of {WRONG_KINDS}")
    if margin is not None and not math.isfinite(margin):
        raise ValueError(f"margin={margin}: must be a finite number or None")
    rng = random.Random(seed * 7919 + 29)
    rows = make_arithmetic_rows(n, digits, ops, seed, split, "chat", exclude)
    problems = [row_problem(r) for r in rows]
    top = max((OPERATORS[op](a, b) for a, op, b in problems), default=0) + 10
    out = []
    for row, problem in zip(rows, problems):
        answer = OPERATORS[problem[1]](problem[0], problem[2])
        for wrong, kind in _wrong_answers(rng, problem, wrong_per_problem, top, kinds):
            pair = {
                "prompt": row["prompt"],
                "chosen": str(answer),
                "rejected": str(wrong),
                "error": kind,
            }
            if margin is not None:
                pair["margin"] = float(margin)
            out.append(pair)
    return out


def write_answer_pairs(
    out_dir: str | os.PathLike,
    train_problems: int,
    val_problems: int,
    digits: int | tuple[int, int] = 1,
    ops: Sequence[str] = ("+", "-", "*"),
    seed: int = 0,
    wrong_per_problem: int = 2,
    exclude: set | None = None,
) -> tuple[str, str | None]:
    """Write ``rm_train.parquet`` and (``val_problems > 0``) ``rm_test.parquet`` of
    :func:`make_answer_pairs`; the validation problems (seed ``2 * seed + 1``) and
    ``exclude`` are kept out of train (seed ``2 * seed``). Returns the paths."""
    from verl.data.arithmetic import make_arithmetic_rows, row_problem

    val_rows = make_answer_pairs(
        val_problems, digits, ops, 2 * seed + 1, "test", exclude, wrong_per_problem
    )
    drawn = make_arithmetic_rows(val_problems, digits, ops, 2 * seed + 1, "test", "chat", exclude)
    held_out = set(exclude or ()) | {row_problem(r) for r in drawn}
    train_rows = make_answer_pairs(
        train_problems, digits, ops, 2 * seed, "train", held_out, wrong_per_problem
    )
    train_path = write_records(train_rows, os.path.join(out_dir, "rm_train.parquet"))
    val_path = None
    if val_problems > 0:
        val_path = write_records(val_rows, os.path.join(out_dir, "rm_test.parquet"))
    return train_path, val_path
