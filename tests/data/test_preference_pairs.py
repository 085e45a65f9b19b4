"""verl/data/preference_pairs.py: arithmetic answer pairs (right answer chosen, distinct wrong
ones rejected, held-out problems kept out) and the reward-pair dataset's margin column."""

from __future__ import annotations

import pytest
import torch

from verl.data.arithmetic import OPERATORS
from verl.data.io import DatasetValidationError, read_records, write_records
from verl.data.preference_pairs import (
    RewardPairDataset,
    collate_reward_pairs,
    make_answer_pairs,
    write_answer_pairs,
)


def _problem(pair: dict) -> tuple[int, str, int]:
    a, op, b = pair["prompt"][0]["content"].removeprefix("What is ").split("?")[0].split(" ")
    return int(a), op, int(b)


def test_answer_pairs_are_right_against_distinct_wrong_answers():
    rows = make_answer_pairs(40, 1, ["+", "-", "*"], seed=3, wrong_per_problem=3)
    assert rows == make_answer_pairs(40, 1, ["+", "-", "*"], seed=3, wrong_per_problem=3)
    assert len(rows) == 120
    assert {r["error"] for r in rows} == {"nearby", "operator", "random"}
    by_prompt: dict[str, list[dict]] = {}
    for row in rows:
        a, op, b = _problem(row)
        assert row["chosen"] == str(OPERATORS[op](a, b))
        assert row["rejected"] != row["chosen"] and int(row["rejected"]) >= 0
        assert "margin" not in row
        by_prompt.setdefault(row["prompt"][0]["content"], []).append(row)
    for group in by_prompt.values():
        wrong = [r["rejected"] for r in group]
        assert len(wrong) == len(set(wrong))  # distinct per problem
    with_margin = make_answer_pairs(4, 1, ["+"], seed=0, kinds=["nearby"], margin=0.5)
    assert {r["margin"] for r in with_margin} == {0.5}
    assert {r["error"] for r in with_margin} == {"nearby"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"wrong_per_problem": 0}, r"wrong_per_problem=0: must be >= 1"),
        ({"kinds": ["typo"]}, r"kinds=\['typo'\]: choose a non-empty subset"),
        ({"margin": float("inf")}, r"margin=inf: must be a finite number"),
    ],
)
def test_bad_generator_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_answer_pairs(2, 1, ["+"], **kwargs)


def test_written_pairs_keep_validation_and_excluded_problems_out_of_train(tmp_path):
    excluded = {(1, "+", 2), (3, "*", 4)}
    train, val = write_answer_pairs(tmp_path, 60, 10, 1, ["+", "*"], seed=2, exclude=excluded)
    train_rows = [r.data for r in read_records(train).records]
    val_rows = [r.data for r in read_records(val).records]
    assert len(train_rows) == 120 and len(val_rows) == 20
    train_problems = {_problem(r) for r in train_rows}
    val_problems = {_problem(r) for r in val_rows}
    assert not train_problems & val_problems
    assert not (train_problems | val_problems) & excluded
    assert write_answer_pairs(tmp_path / "none", 4, 0)[1] is None


def test_margin_column_read_and_collated(tmp_path, tokenizer):
    rows = make_answer_pairs(3, 1, ["+"], seed=0, wrong_per_problem=1)
    rows = [{**r, "margin": m} for r, m in zip(rows, (0.0, 1.5, 2))]
    ds = RewardPairDataset(write_records(rows, tmp_path / "m.parquet"), tokenizer)
    assert ds.has_margins and [it["margin"] for it in ds] == [0.0, 1.5, 2.0]
    batch = collate_reward_pairs(list(ds), tokenizer.pad_token_id)
    assert batch["input_ids"].shape[0] == 6  # chosen rows, then rejected rows
    assert torch.equal(batch["margin"], torch.tensor([0.0, 1.5, 2.0]))
    plain = RewardPairDataset(
        write_records(make_answer_pairs(2, 1, ["+"]), tmp_path / "p.jsonl"), tokenizer
    )
    assert not plain.has_margins and {it["margin"] for it in plain} == {0.0}


def test_bad_margins_are_listed_with_their_rows(tmp_path, tokenizer):
    rows = make_answer_pairs(4, 1, ["+"], seed=0, wrong_per_problem=1)
    rows[0]["margin"] = 1.0
    rows[2]["margin"] = float("nan")
    rows[3]["margin"] = "1"
    with pytest.raises(DatasetValidationError) as info:
        RewardPairDataset(write_records(rows, tmp_path / "bad.jsonl"), tokenizer)
    problems = info.value.problems
    assert any("bad.jsonl line 2: no 'margin' value, but" in p for p in problems)
    assert any("line 3: 'margin' must be finite, got nan" in p for p in problems)
    assert any("line 4: 'margin' must be a number, got str '1'" in p for p in problems)
