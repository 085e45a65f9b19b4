"""GSM8K converter on synthetic rows in GSM8K's format."""

from __future__ import annotations

import json

import pytest

from verl.data.gsm8k import INSTRUCTION, convert_gsm8k, extract_gsm8k_answer, main
from verl.data.io import DatasetValidationError, read_records
from verl.data.rl_dataset import RLHFDataset

ROWS = [
    {
        "question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
        "answer": "He has 3 + 4 = <<3+4=7>>7 apples.\n#### 7",
    },
    {
        "question": "A car costs $1,200 and a bike $250. What do both cost?",
        "answer": "1,200 + 250 = <<1200+250=1450>>1450\n#### 1,450",
    },
    {
        "question": "The temperature was 5 and fell by 8. What is it now?",
        "answer": "5 - 8 = -3\n####  -3 ",
    },
]


def write_lines(path, lines) -> str:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return str(path)


def test_extract_answer():
    assert extract_gsm8k_answer("work\n#### 72") == "72"
    assert extract_gsm8k_answer("a #### b\n#### 1,234,567") == "1234567"
    assert extract_gsm8k_answer("#### -2.5") == "-2.5"
    with pytest.raises(ValueError, match="no '####'"):
        extract_gsm8k_answer("the answer is 72")
    with pytest.raises(ValueError, match="not a number: 'seventy'"):
        extract_gsm8k_answer("#### seventy")


@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_convert(tmp_path, tokenizer, suffix):
    src = write_lines(tmp_path / "train.jsonl", ROWS)
    out = tmp_path / f"out.{suffix}"
    assert convert_gsm8k(src, out) == 3
    rows = [r.data for r in read_records(out).records]
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["7", "1450", "-3"]
    assert all(r["data_source"] == "openai/gsm8k" for r in rows)
    assert rows[0]["prompt"] == [
        {"role": "user", "content": f"{ROWS[0]['question']} {INSTRUCTION}"}
    ]
    assert '"####"' in INSTRUCTION
    assert rows[1]["extra_info"] == {
        "split": "train",
        "index": 1,
        "question": ROWS[1]["question"],
        "answer": ROWS[1]["answer"],
    }
    ds = RLHFDataset(str(out), tokenizer)
    assert len(ds) == 3 and ds[2]["ground_truth"] == "-3"


def test_malformed_rows_reported_with_line_numbers(tmp_path):
    src = write_lines(
        tmp_path / "test.jsonl",
        [
            ROWS[0],
            {"question": "No marker?", "answer": "It is 5."},
            "{not json",
            {"answer": "#### 3"},
            {"question": "Words?", "answer": "#### five"},
            ROWS[1],
        ],
    )
    out = tmp_path / "out.parquet"
    with pytest.raises(DatasetValidationError) as exc:
        convert_gsm8k(src, out)
    problems = exc.value.problems
    assert [p.split(": ", 1)[0] for p in problems] == [f"{src} line {n}" for n in (2, 3, 4, 5)]
    assert "no '####'" in problems[0]
    assert "invalid JSON" in problems[1]
    assert "'question' must be a non-empty string, got None" in problems[2]
    assert "not a number: 'five'" in problems[3]
    assert not out.exists()

    assert convert_gsm8k(src, out, split="eval", skip_invalid=True) == 2
    rows = [r.data for r in read_records(out).records]
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["7", "1450"]
    assert [r["extra_info"]["index"] for r in rows] == [0, 1]
    assert rows[0]["extra_info"]["split"] == "eval"


def test_cli(tmp_path, capsys):
    src = write_lines(tmp_path / "train.jsonl", ROWS)
    out = tmp_path / "gsm8k" / "train.parquet"
    assert main(["--input", src, "--out", str(out)]) == 0
    assert len(read_records(out).records) == 3
    assert "wrote 3 rows" in capsys.readouterr().out
    bad = write_lines(tmp_path / "bad.jsonl", [{"question": "q", "answer": "a"}])
    assert main(["--input", bad, "--out", str(tmp_path / "bad.parquet")]) == 1
    assert f"{bad} line 1" in capsys.readouterr().err
    assert main(["--input", str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 1
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--input", src, "--out", str(tmp_path / "x.csv")])
