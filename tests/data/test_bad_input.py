"""The bad-input catalogue (docs/errors.md) for prompt data: each entry's message text.

Every case builds an `RLHFDataset` (what the trainer does at construction, before any
worker starts) from a deliberately broken file and checks that the error names the file,
the row/line and what is wrong.
"""

from __future__ import annotations

import logging
import os

import pytest

import verl.data.io as data_io
from verl.data import DatasetValidationError, RLHFDataset
from verl.data.io import write_records


def _jsonl(path, lines: list[bytes]) -> str:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return str(path)


GOOD = (
    b'{"data_source": "arithmetic", "prompt": [{"role": "user", "content": "1+1?"}], '
    b'"reward_model": {"ground_truth": "2"}}'
)


# ---------------------------------------------------------------------- missing / unreadable
def test_nonexistent_file(tmp_path, tokenizer):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=f"data file '{path}' does not exist"):
        RLHFDataset(str(path), tokenizer)


def test_directory_instead_of_file(tmp_path, tokenizer):
    folder = tmp_path / "train.parquet"
    folder.mkdir()
    with pytest.raises(IsADirectoryError, match=f"data file '{folder}' is a directory"):
        RLHFDataset(str(folder), tokenizer)


def test_unreadable_file_is_reported_before_reading(tmp_path, tokenizer, monkeypatch):
    path = _jsonl(tmp_path / "locked.jsonl", [GOOD])

    def refuse(file, *args, **kwargs):
        raise PermissionError(13, "Permission denied", file)

    # Shadows the builtin inside verl.data.io only (root ignores chmod, so fake it).
    monkeypatch.setattr(data_io, "open", refuse, raising=False)
    with pytest.raises(PermissionError) as err:
        RLHFDataset(path, tokenizer)
    assert f"data file '{path}' cannot be read: Permission denied" in str(err.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of permissions")
def test_unreadable_file_permissions(tmp_path, tokenizer):
    path = _jsonl(tmp_path / "locked.jsonl", [GOOD])
    os.chmod(path, 0)
    with pytest.raises(PermissionError, match="cannot be read"):
        RLHFDataset(path, tokenizer)


def test_corrupt_parquet(tmp_path, tokenizer):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR1 this is not really parquet")
    with pytest.raises(ValueError, match=f"{path}: cannot read as parquet"):
        RLHFDataset(str(path), tokenizer)


def test_invalid_json_line(tmp_path, tokenizer):
    path = _jsonl(tmp_path / "t.jsonl", [GOOD, b'{"data_source": "arithmetic", "prompt": [}'])
    with pytest.raises(DatasetValidationError) as err:
        RLHFDataset(path, tokenizer)
    assert err.value.problems == [f"{path} line 2: invalid JSON at column 42: Expecting value"]


# ---------------------------------------------------------------------- bad rows
def test_parquet_missing_column(tmp_path, tokenizer):
    path = write_records(
        [{"data_source": "arithmetic", "prompt": [{"role": "user", "content": "q"}]}],
        tmp_path / "t.parquet",
    )
    with pytest.raises(DatasetValidationError) as err:
        RLHFDataset(path, tokenizer)
    assert f"{path}: missing required column(s) ['reward_model']" in str(err.value)


def test_wrong_type_names_line_column_and_value(tmp_path, tokenizer):
    bad = b'{"data_source": 3, "prompt": "q", "reward_model": {"ground_truth": "1"}}'
    path = _jsonl(tmp_path / "t.jsonl", [GOOD, GOOD, bad])
    with pytest.raises(DatasetValidationError) as err:
        RLHFDataset(path, tokenizer)
    assert err.value.problems == [f"{path} line 3: 'data_source' must be a string, got int 3"]


def test_wrong_type_in_parquet_names_row(tmp_path, tokenizer):
    prompt = [{"role": "user", "content": "q"}]
    good = {"data_source": "a", "prompt": prompt, "reward_model": {"ground_truth": "1"}}
    bad = {**good, "reward_model": {"ground_truth": None}}
    path = write_records([good, bad], tmp_path / "t.parquet")
    with pytest.raises(DatasetValidationError) as err:
        RLHFDataset(path, tokenizer)
    assert err.value.problems == [
        f"{path} row 2: missing ground truth: 'reward_model' has no 'ground_truth' value"
    ]


def test_empty_prompt(tmp_path, tokenizer):
    empty = b'{"data_source": "a", "prompt": [], "reward_model": {"ground_truth": "1"}}'
    blank = b'{"data_source": "a", "prompt": "   ", "reward_model": {"ground_truth": "1"}}'
    path = _jsonl(tmp_path / "t.jsonl", [empty, GOOD, blank])
    with pytest.raises(DatasetValidationError) as err:
        RLHFDataset(path, tokenizer)
    assert err.value.problems == [
        f"{path} line 1: empty prompt: 'prompt' has no messages",
        f"{path} line 3: empty prompt: every message content is blank",
    ]


def test_non_utf8_line(tmp_path, tokenizer):
    bad = b'{"data_source": "a", "prompt": "caf\xe9", "reward_model": {"ground_truth": "1"}}'
    path = _jsonl(tmp_path / "t.jsonl", [GOOD, bad])
    with pytest.raises(DatasetValidationError) as err:
        RLHFDataset(path, tokenizer)
    assert err.value.problems == [
        f"{path} line 2: not valid UTF-8 (byte 0xe9 at column 36); re-encode the file as UTF-8"
    ]


def test_lone_surrogate_names_line_and_column(tmp_path, tokenizer):
    """A "\\ud800" escape decodes to half a UTF-16 pair, which no tokenizer or writer takes
    (it used to surface as the tokenizer's TypeError, a raw traceback)."""
    bad = (
        b'{"data_source": "a", "prompt": [{"role": "user", "content": "1+\\ud800?"}], '
        b'"reward_model": {"ground_truth": "2"}}'
    )
    pair = (
        b'{"data_source": "a", "prompt": "\\ud83d\\ude00", "reward_model": {"ground_truth": "1"}}'
    )
    path = _jsonl(tmp_path / "t.jsonl", [GOOD, bad, pair])
    with pytest.raises(DatasetValidationError) as err:
        RLHFDataset(path, tokenizer)
    assert err.value.problems == [
        f"{path} line 2: column 'prompt' [0] 'content' character 3 (\\ud800) is a lone "
        "surrogate, not a Unicode character (a \\uXXXX escape of half a UTF-16 pair); it "
        "cannot be tokenised or written as UTF-8: remove it or write the whole character"
    ]
    str(err.value).encode("utf-8")  # the message itself is printable
    # a whole pair (an emoji written with ensure_ascii) is one character and loads
    assert len(RLHFDataset(_jsonl(tmp_path / "ok.jsonl", [GOOD, pair]), tokenizer)) == 2
    # a .json array the same
    array = tmp_path / "t.json"
    array.write_bytes(b"[" + GOOD + b", " + bad + b"]")
    with pytest.raises(DatasetValidationError, match=r"t.json item 2: column 'prompt' \[0\]"):
        RLHFDataset(str(array), tokenizer)


def test_non_utf8_parquet_string_names_row_and_column(tmp_path, tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    prompts = [b"1+1?", b"caf\xe9?", b"2+2?"]  # row 2 holds Latin-1 bytes, not UTF-8
    table = pa.table(
        {
            "data_source": ["a"] * 3,
            "prompt": pa.array(prompts, pa.binary()).cast(pa.string(), safe=False),
            "reward_model": [{"ground_truth": "2"}] * 3,
        }
    )
    path = str(tmp_path / "t.parquet")
    pq.write_table(table, path)
    with pytest.raises(DatasetValidationError) as err:
        RLHFDataset(path, tokenizer)
    assert len(err.value.problems) == 1
    assert err.value.problems[0].startswith(f"{path} row 2: column 'prompt' is not valid UTF-8")


# ---------------------------------------------------------------------- prompt length
@pytest.fixture
def long_and_short(tmp_path):
    long = (
        b'{"data_source": "a", "prompt": "' + b"word " * 40 + b'", '
        b'"reward_model": {"ground_truth": "1"}}'
    )
    return _jsonl(tmp_path / "t.jsonl", [GOOD, long, GOOD])


def test_prompt_too_long_is_an_error_by_default(long_and_short, tokenizer):
    with pytest.raises(ValueError) as err:
        RLHFDataset(long_and_short, tokenizer, max_prompt_length=30)
    msg = str(err.value)
    assert "1 prompt(s) exceed max_prompt_length=30; the longest is " in msg
    assert f"{long_and_short} line 2 with " in msg
    assert "truncation='drop'" in msg


def test_prompt_too_long_drop_is_logged_and_counted(long_and_short, tokenizer, caplog):
    with caplog.at_level(logging.WARNING, logger="verl.data.rl_dataset"):
        ds = RLHFDataset(long_and_short, tokenizer, max_prompt_length=30, truncation="drop")
    assert len(ds) == 2 and ds.num_dropped == 1
    assert ds.dropped_rows == [f"{long_and_short} line 2"]
    assert (
        f"dropped 1 prompt(s) longer than max_prompt_length=30: {long_and_short} line 2"
        in caplog.text
    )


def test_prompt_too_long_left_truncation_is_logged_and_counted(long_and_short, tokenizer, caplog):
    with caplog.at_level(logging.WARNING, logger="verl.data.rl_dataset"):
        ds = RLHFDataset(long_and_short, tokenizer, max_prompt_length=30, truncation="left")
    assert len(ds) == 3 and ds.num_truncated == 1
    assert int(ds.prompt_lengths.max()) == 30
    assert "left-truncated 1 prompt(s) to max_prompt_length=30" in caplog.text


# ---------------------------------------------------------------------- tokenizer
def test_tokenizer_without_chat_template(tmp_path, tokenizer):
    path = _jsonl(tmp_path / "t.jsonl", [GOOD])
    template, tokenizer.chat_template = tokenizer.chat_template, None
    try:
        with pytest.raises(ValueError) as err:
            RLHFDataset(path, tokenizer)
        # Raw mode works for base models.
        assert len(RLHFDataset(path, tokenizer, apply_chat_template=False)) == 1
    finally:
        tokenizer.chat_template = template
    msg = str(err.value)
    assert "has no chat template, and data.apply_chat_template=True needs one" in msg
    assert "data.apply_chat_template=false" in msg


# ---------------------------------------------------------------------- no half-written output
def test_failed_write_leaves_nothing_behind(tmp_path):
    target = tmp_path / "out.jsonl"
    with pytest.raises(TypeError):
        write_records([{"ok": 1}, {"bad": object()}], target)
    assert list(tmp_path.iterdir()) == []


def test_catalogue_names_existing_tests():
    """Every `file.py::test_name` that docs/errors.md cites exists."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "errors.md").read_text()
    cited = re.findall(r"`(?:tests/\w+/)?(test_\w+\.py)::(test_\w+)`", doc)
    assert len(cited) >= 20
    files = {p.name: p for p in (root / "tests").rglob("test_*.py")}
    for name, test in cited:
        assert name in files, f"docs/errors.md cites a missing test file {name}"
        assert f"def {test}(" in files[name].read_text(), f"{name} has no {test}"
