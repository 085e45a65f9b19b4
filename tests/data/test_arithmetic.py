"""Arithmetic dataset generator: correct answers, determinism, disjoint splits, CLI."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pytest

from verl.data.arithmetic import (
    main,
    make_arithmetic_rows,
    problem_space_size,
    row_problem,
    write_arithmetic_dataset,
)
from verl.data.io import read_records
from verl.data.rl_dataset import RLHFDataset

PROMPT = re.compile(r"What is (\d+) ([-+*]) (\d+)\? Answer with just the number\.")


def evaluate(a: int, op: str, b: int) -> int:
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def test_rows_have_correct_answers():
    rows = make_arithmetic_rows(300, digits=2, ops=["+", "-", "*"], seed=5)
    assert len(rows) == 300
    ops_seen = set()
    for i, row in enumerate(rows):
        assert row["data_source"] == "arithmetic"
        assert len(row["prompt"]) == 1 and row["prompt"][0]["role"] == "user"
        a, op, b = PROMPT.fullmatch(row["prompt"][0]["content"]).groups()
        a, b = int(a), int(b)
        assert 10 <= a <= 99 and 10 <= b <= 99
        assert row["reward_model"]["ground_truth"] == str(evaluate(a, op, b))
        assert int(row["reward_model"]["ground_truth"]) >= 0
        info = row["extra_info"]
        assert (info["a"], info["op"], info["b"], info["index"]) == (a, op, b, i)
        assert info["expression"] == f"{a} {op} {b}"
        ops_seen.add(op)
    assert ops_seen == {"+", "-", "*"}
    assert len({row_problem(r) for r in rows}) == 300  # distinct: the space has 22,005


def test_hand_checked_examples_and_plain_style():
    rows = make_arithmetic_rows(40, digits=1, ops=["*"], seed=0, prompt_style="plain")
    for row in rows:
        a, b = row["extra_info"]["a"], row["extra_info"]["b"]
        assert 0 <= a <= 9 and 0 <= b <= 9
        assert row["prompt"][0]["content"] == f"{a} * {b} ="
        assert row["reward_model"]["ground_truth"] == str(a * b)
    assert problem_space_size(1, ["+", "-", "*"]) == 100 + 55 + 100


def test_tool_style_multiplies_three_digit_numbers_with_the_calculator():
    from verl.rewards.scorers.arithmetic import compute_score
    from verl.tools.calculator import calculate

    rows = make_arithmetic_rows(20, digits=3, ops=["*"], seed=0, prompt_style="tool")
    for row in rows:
        info = row["extra_info"]
        assert 100 <= info["a"] <= 999 and 100 <= info["b"] <= 999
        content = row["prompt"][0]["content"]
        assert content.startswith(f"What is {info['a']} * {info['b']}?")
        assert "calculator" in content
        truth = row["reward_model"]["ground_truth"]
        # What the tool returns for the expression is the ground truth, and scores 1.
        assert calculate(info["expression"]) == truth == str(info["a"] * info["b"])
        assert compute_score(f"The answer is {truth}", truth)["acc"] == 1.0
    assert problem_space_size(2, ["-"]) == 90 * 91 // 2


def test_deterministic_per_seed():
    assert make_arithmetic_rows(20, seed=3) == make_arithmetic_rows(20, seed=3)
    assert make_arithmetic_rows(20, seed=3) != make_arithmetic_rows(20, seed=4)


def test_argument_errors():
    with pytest.raises(ValueError, match="digits=0 must be >= 1"):
        make_arithmetic_rows(5, digits=0)
    with pytest.raises(ValueError, match=r"unsupported op\(s\) \['/'\]"):
        make_arithmetic_rows(5, ops=["+", "/"])
    with pytest.raises(ValueError, match="prompt_style"):
        make_arithmetic_rows(5, prompt_style="poem")


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_written_splits_are_disjoint_and_loadable(tmp_path, tokenizer, fmt):
    train, val = write_arithmetic_dataset(
        tmp_path, train_size=150, val_size=40, digits=1, seed=2, fmt=fmt
    )
    assert os.path.basename(train) == f"train.{fmt}" and os.path.basename(val) == f"test.{fmt}"
    train_rows = [r.data for r in read_records(train).records]
    val_rows = [r.data for r in read_records(val).records]
    assert (len(train_rows), len(val_rows)) == (150, 40)
    train_set = {row_problem(r) for r in train_rows}
    val_set = {row_problem(r) for r in val_rows}
    assert train_set.isdisjoint(val_set)
    assert len(train_set) == 150 and len(val_set) == 40  # 255 problems: room for both
    assert {r["extra_info"]["split"] for r in val_rows} == {"test"}
    ds = RLHFDataset([train, val], tokenizer)
    assert len(ds) == 190
    item = ds[0]
    assert item["ground_truth"] == str(evaluate(*row_problem(train_rows[0])))


def test_small_space_stays_disjoint_and_repeats(tmp_path, caplog):
    # 1-digit addition has 100 problems: 30 go to val, train can only use the other 70.
    with caplog.at_level(logging.WARNING, logger="verl.data.arithmetic"):
        train, val = write_arithmetic_dataset(
            tmp_path, train_size=200, val_size=30, digits=1, ops=["+"], fmt="jsonl"
        )
    train_set = {row_problem(r.data) for r in read_records(train).records}
    val_set = {row_problem(r.data) for r in read_records(val).records}
    assert len(val_set) == 30 and len(train_set) == 70
    assert train_set.isdisjoint(val_set)
    assert "only 70 distinct ones are available" in caplog.text
    with pytest.raises(ValueError, match="lower val_size"):
        write_arithmetic_dataset(tmp_path, train_size=5, val_size=100, digits=1, ops=["+"])


def test_cli(tmp_path, capsys):
    out = tmp_path / "arith"
    argv = ["--out", str(out), "--train-size", "12", "--val-size", "4", "--digits", "2"]
    assert main([*argv, "--ops", "+", "-", "--format", "jsonl", "--seed", "9"]) == 0
    rows = [r.data for r in read_records(out / "train.jsonl").records]
    assert len(rows) == 12 and {r["extra_info"]["op"] for r in rows} <= {"+", "-"}
    assert "train:" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--digits", "0"])
    assert exc.value.code == 2
    assert "--digits 0: must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*argv, "--ops", "+", "README.md"])
    assert "each op must be one of + - '*'" in capsys.readouterr().err


def test_module_entry_point(tmp_path):
    args = ["--out", str(tmp_path), "--train-size", "8", "--val-size", "2", "--ops", "-", "*"]
    result = subprocess.run(
        [sys.executable, "-m", "verl.data.arithmetic", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    rows = [r.data for r in read_records(tmp_path / "train.parquet").records]
    assert len(rows) == 8 and {r["extra_info"]["op"] for r in rows} <= {"-", "*"}


def test_digit_range_draws_one_and_two_digit_operands(tmp_path, capsys):
    # (1, 2): operands 0..99, so the space is 100 * 100 for + and 100 * 101 / 2 for -
    assert problem_space_size((1, 2), ["+", "-"]) == 100 * 100 + 100 * 101 // 2
    rows = make_arithmetic_rows(400, digits=(1, 2), ops=["+", "-", "*"], seed=0)
    operands = [v for r in rows for v in (r["extra_info"]["a"], r["extra_info"]["b"])]
    assert min(operands) >= 0 and max(operands) <= 99
    assert any(v < 10 for v in operands) and any(v >= 10 for v in operands)
    for r in rows:
        a, op, b = row_problem(r)
        assert r["reward_model"]["ground_truth"] == str(evaluate(a, op, b))
    with pytest.raises(ValueError, match=r"digits=\(2, 1\) must be >= 1"):
        make_arithmetic_rows(5, digits=(2, 1))
    out = tmp_path / "range"
    argv = ["--out", str(out), "--train-size", "40", "--val-size", "8", "--format", "jsonl"]
    assert main([*argv, "--digits", "1", "--max-digits", "2"]) == 0
    cli_rows = [r.data for r in read_records(out / "train.jsonl").records]
    assert max(max(r["extra_info"]["a"], r["extra_info"]["b"]) for r in cli_rows) >= 10
    with pytest.raises(SystemExit):
        main([*argv, "--digits", "2", "--max-digits", "1"])
    assert "--max-digits 1: must be >= --digits 2" in capsys.readouterr().err


def _one_digit_share(rows) -> float:
    operands = [v for r in rows for v in (r["extra_info"]["a"], r["extra_info"]["b"])]
    return sum(v < 10 for v in operands) / len(operands)


def test_balance_digits_draws_digit_counts_uniformly(tmp_path):
    # uniform over 0..99: 10% of operands have one digit; balanced: each count about half
    # (a little less, since the 200 one-by-one-digit + and * problems run out of new ones)
    plain = make_arithmetic_rows(400, digits=(1, 2), ops=["+", "*"], seed=0)
    balanced = make_arithmetic_rows(400, digits=(1, 2), ops=["+", "*"], seed=0, balance_digits=True)
    assert _one_digit_share(plain) < 0.15
    assert 0.4 < _one_digit_share(balanced) < 0.55
    assert len({row_problem(r) for r in balanced}) == 400
    for r in balanced:
        a, op, b = row_problem(r)
        assert 0 <= a <= 99 and 0 <= b <= 99
        assert r["reward_model"]["ground_truth"] == str(evaluate(a, op, b))
    # (2, 3): operands 10..999, half of them two-digit
    three = make_arithmetic_rows(300, digits=(2, 3), ops=["+"], seed=1, balance_digits=True)
    operands = [v for r in three for v in (r["extra_info"]["a"], r["extra_info"]["b"])]
    assert min(operands) >= 10 and max(operands) <= 999
    assert 0.4 < sum(v < 100 for v in operands) / len(operands) < 0.6
    # a single digit count is unchanged by the flag
    same = make_arithmetic_rows(20, digits=2, seed=3, balance_digits=True)
    assert same == make_arithmetic_rows(20, digits=2, seed=3)
    # the CLI flag and the written splits: disjoint, balanced
    argv = ["--out", str(tmp_path), "--train-size", "300", "--val-size", "100"]
    assert main([*argv, "--digits", "1", "--max-digits", "2", "--balance-digits"]) == 0
    train = [r.data for r in read_records(tmp_path / "train.parquet").records]
    val = [r.data for r in read_records(tmp_path / "test.parquet").records]
    assert not {row_problem(r) for r in train} & {row_problem(r) for r in val}
    assert _one_digit_share(train) > 0.35 and _one_digit_share(val) > 0.35


def test_tool_transcripts_train_the_call_and_the_answer_only(tmp_path, tokenizer):
    from verl.data.arithmetic import tool_transcript_row, write_tool_transcripts
    from verl.data.base import render_chat
    from verl.data.sft_dataset import SFTDataset
    from verl.rollout.tool_calls import parse_tool_calls
    from verl.tools.calculator import CALCULATOR_SCHEMA, calculate

    row = tool_transcript_row((123, "*", 456), [CALCULATOR_SCHEMA])
    system, user, call, tool, answer = row["messages"]
    # The system message is what RLHFDataset puts in the RL prompts for this template.
    rl_prompt = render_chat(tokenizer, [user], True, tools=[CALCULATOR_SCHEMA])
    assert (
        tokenizer.apply_chat_template([system, user], tokenize=False, add_generation_prompt=True)
        == rl_prompt
    )
    (parsed,) = parse_tool_calls(call["content"])
    assert (parsed.name, parsed.arguments) == ("calculator", {"expression": "123 * 456"})
    assert (
        tool == {"role": "tool", "content": calculate("123 * 456")} and tool["content"] == "56088"
    )
    assert answer == {"role": "assistant", "content": "56088"}

    path = write_tool_transcripts(
        tmp_path / "sft.jsonl", 6, [CALCULATOR_SCHEMA], digits=3, exclude={(123, "*", 456)}
    )
    records = [r.data for r in read_records(path).records]
    assert len(records) == 6
    assert all("What is 123 * 456?" not in r["messages"][1]["content"] for r in records)
    ds = SFTDataset(path, tokenizer)
    item = ds[0]
    trained = tokenizer.decode(item["input_ids"][item["loss_mask"].astype(bool)])
    first = records[0]["messages"]
    # Loss on the two assistant turns (content and end-of-turn), nothing else.
    assert trained == f"{first[2]['content']}<|im_end|>{first[4]['content']}<|im_end|>"
    short = tool_transcript_row((1, "*", 2), [CALCULATOR_SCHEMA], system="Tools: calculator")
    assert short["messages"][0] == {"role": "system", "content": "Tools: calculator"}
    with pytest.raises(ValueError, match="include its schema"):
        tool_transcript_row((1, "*", 2), [])


def test_no_validation_split(tmp_path):
    # val_size=0 (allowed by data.arithmetic.val_size) writes only the training file
    train, val = write_arithmetic_dataset(tmp_path, train_size=6, val_size=0, ops=["+"])
    assert val is None and sorted(p.name for p in tmp_path.iterdir()) == ["train.parquet"]
    assert len(read_records(train).records) == 6
    with pytest.raises(ValueError, match="val_size=-1 >= 0"):
        write_arithmetic_dataset(tmp_path, train_size=6, val_size=-1)


def test_digits_beyond_int64_are_refused_with_a_message(tmp_path, capsys):
    """`--digits 50` used to end in pyarrow's OverflowError traceback (the operands are
    int64 columns); 18 digits is the most an int64 holds, and it writes."""
    from verl import cli

    out = tmp_path / "big"
    argv = ["data", "arithmetic", "--out", str(out), "--train-size", "3", "--val-size", "2"]
    assert cli.main([*argv, "--digits", "50"]) == 2
    err = capsys.readouterr().err
    assert "--digits 50: must be >= 1 and <= 18" in err and "Traceback" not in err
    assert cli.main([*argv, "--digits", "2", "--max-digits", "19"]) == 2
    assert "--max-digits 19: must be >= --digits 2 and <= 18" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(ValueError, match=r"digits=\(1, 40\): operands may have at most 18"):
        make_arithmetic_rows(3, digits=(1, 40))
    assert cli.main([*argv, "--digits", "18", "--ops", "*"]) == 0
    rows = [r.data for r in read_records(out / "train.parquet").records]
    a, b = rows[0]["extra_info"]["a"], rows[0]["extra_info"]["b"]
    assert len(str(a)) == len(str(b)) == 18
    assert rows[0]["reward_model"]["ground_truth"] == str(a * b)
