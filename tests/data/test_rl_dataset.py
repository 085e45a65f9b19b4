"""RLHFDataset: reading, validation, tokenization, truncation; collate_fn padding."""

from __future__ import annotations

import json
import logging
import pickle

import pytest
import torch

from verl.data.io import write_records
from verl.data.rl_dataset import (
    DatasetValidationError,
    RLHFDataset,
    collate_fn,
    collate_prompts,
)
from verl.models.tiny import build_tiny_tokenizer
from verl.protocol import DataProto


def chat_ids(tokenizer, messages) -> list[int]:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)


def write_jsonl_lines(path, lines: list) -> str:
    """Write raw lines: dicts are JSON-encoded, str / bytes written as they are."""
    with open(path, "wb") as f:
        for line in lines:
            if isinstance(line, dict):
                line = json.dumps(line)
            if isinstance(line, str):
                line = line.encode("utf-8")
            f.write(line + b"\n")
    return str(path)


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_round_trip(tmp_path, tokenizer, make_row, suffix):
    rows = [make_row("What is 1 + 2?", "3"), make_row("What is 7 * 6?", "42", source="other")]
    rows[1]["prompt"].insert(0, {"role": "system", "content": "Be brief."})
    path = write_records(rows, tmp_path / f"train.{suffix}")
    ds = RLHFDataset(path, tokenizer)
    assert len(ds) == 2
    item = ds[1]
    assert item["input_ids"].dtype == torch.long and item["input_ids"].ndim == 1
    assert item["input_ids"].tolist() == chat_ids(tokenizer, rows[1]["prompt"])
    assert item["raw_prompt"] == rows[1]["prompt"]
    assert item["data_source"] == "other"
    assert item["ground_truth"] == "42"
    assert item["extra_info"] == {"q": "What is 7 * 6?"}
    assert item["index"] == 1
    unit = "row" if suffix == "parquet" else "line"
    assert ds.location(1) == f"{path} {unit} 2"
    assert ds.prompt_lengths.tolist() == [len(chat_ids(tokenizer, r["prompt"])) for r in rows]


def test_multiple_files_and_json_array(tmp_path, tokenizer, make_row):
    a = write_records([make_row("q0", "0"), make_row("q1", "1")], tmp_path / "a.parquet")
    b = write_records([make_row("q2", "2")], tmp_path / "b.jsonl")
    c = tmp_path / "c.json"
    c.write_text(json.dumps([make_row("q3", "3"), make_row("q4", "4")]))
    ds = RLHFDataset([a, b, c], tokenizer)
    assert [ds[i]["ground_truth"] for i in range(len(ds))] == ["0", "1", "2", "3", "4"]
    assert [ds[i]["index"] for i in range(len(ds))] == [0, 1, 2, 3, 4]
    assert ds.location(4) == f"{c} item 2"
    assert ds[-1]["ground_truth"] == "4"
    with pytest.raises(IndexError):
        ds[5]


def test_missing_optional_fields_and_raw_mode(tmp_path, tokenizer):
    row = {
        "data_source": "s",
        "prompt": [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}],
        "reward_model": {"ground_truth": "1"},
    }
    path = write_jsonl_lines(tmp_path / "x.jsonl", [row])
    ds = RLHFDataset(path, tokenizer, apply_chat_template=False)
    assert ds[0]["extra_info"] == {}
    assert ds[0]["input_ids"].tolist() == tokenizer("a\nb")["input_ids"]


def test_plain_text_prompt_is_one_user_message(tmp_path, tokenizer):
    row = {"data_source": "s", "prompt": "What is 1+1?", "reward_model": {"ground_truth": "2"}}
    path = write_jsonl_lines(tmp_path / "t.jsonl", [row])
    ds = RLHFDataset(path, tokenizer)
    messages = [{"role": "user", "content": "What is 1+1?"}]
    assert ds[0]["raw_prompt"] == messages
    assert ds[0]["input_ids"].tolist() == chat_ids(tokenizer, messages)


def test_prompt_key(tmp_path, tokenizer):
    row = dict(GOOD)
    row["messages"] = row.pop("prompt")
    path = write_jsonl_lines(tmp_path / "m.jsonl", [row])
    ds = RLHFDataset(path, tokenizer, prompt_key="messages")
    assert ds[0]["raw_prompt"] == row["messages"]
    assert ds[0]["input_ids"].tolist() == chat_ids(tokenizer, row["messages"])
    with pytest.raises(DatasetValidationError, match="missing required field 'prompt'"):
        RLHFDataset(path, tokenizer)


# ----------------------------------------------------------------------------- collate


def _item(ids, i):
    return {
        "input_ids": torch.tensor(ids, dtype=torch.long),
        "raw_prompt": [{"role": "user", "content": f"q{i}"}],
        "data_source": "s",
        "ground_truth": str(i),
        "extra_info": {"i": i},
        "index": i,
    }


def test_collate_left_pads_and_positions():
    items = [_item([5, 6, 7], 0), _item([8], 1), _item([9, 10], 2)]
    batch = collate_fn(items, pad_token_id=0)
    assert isinstance(batch, DataProto) and len(batch) == 3
    assert batch.batch["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8], [0, 9, 10]]
    assert batch.batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]
    assert batch.batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 1]]
    # Equal-length message lists must stay one object per sample, not a 2-D array.
    raw = batch.non_tensor_batch["raw_prompt"]
    assert raw.dtype == object and raw.shape == (3,)
    assert raw[1] == [{"role": "user", "content": "q1"}]
    assert batch.non_tensor_batch["ground_truth"].tolist() == ["0", "1", "2"]
    assert batch.non_tensor_batch["index"].tolist() == [0, 1, 2]
    assert batch.non_tensor_batch["extra_info"][2] == {"i": 2}


def test_collate_fixed_width_and_errors():
    tensors, _ = collate_prompts([_item([5, 6, 7], 0), _item([8], 1)], 99, max_prompt_length=5)
    assert tensors["input_ids"].tolist() == [[99, 99, 5, 6, 7], [99, 99, 99, 99, 8]]
    assert tensors["attention_mask"].tolist() == [[0, 0, 1, 1, 1], [0, 0, 0, 0, 1]]
    assert tensors["position_ids"].tolist() == [[0, 0, 0, 1, 2], [0, 0, 0, 0, 0]]
    with pytest.raises(ValueError, match="3 tokens, more than max_prompt_length=2"):
        collate_prompts([_item([5, 6, 7], 0)], 0, max_prompt_length=2)
    with pytest.raises(ValueError, match="pad_token_id is None"):
        collate_prompts([_item([5], 0)], None)
    with pytest.raises(ValueError, match="empty"):
        collate_prompts([], 0)


def test_dataset_into_collate(tmp_path, tokenizer, make_row):
    rows = [make_row("What is 1 + 2?", "3"), make_row("What is 11 + 22 + 33?", "66")]
    ds = RLHFDataset(write_records(rows, tmp_path / "t.parquet"), tokenizer)
    batch = collate_fn([ds[0], ds[1]], pad_token_id=tokenizer.pad_token_id)
    short, long = (len(chat_ids(tokenizer, r["prompt"])) for r in rows)
    assert long > short
    assert batch.batch["input_ids"].shape == (2, long)
    assert batch.batch["attention_mask"].sum(-1).tolist() == [short, long]
    assert batch.batch["input_ids"][0, : long - short].eq(tokenizer.pad_token_id).all()
    assert batch.batch["input_ids"][0, long - short :].tolist() == ds[0]["input_ids"].tolist()
    assert batch.batch["position_ids"][0, -1].item() == short - 1


# ----------------------------------------------------------------------------- truncation


@pytest.fixture
def mixed_length_file(tmp_path, make_row):
    questions = ["1+1?", "What is 12 + 34 + 56 + 78 + 90 + 11 + 22?", "2+2?", "What is 9 * 9 * 9?"]
    return write_records([make_row(q, "0") for q in questions], tmp_path / "mixed.jsonl")


def _lengths(tokenizer, path):
    return RLHFDataset(path, tokenizer).prompt_lengths.tolist()


def test_truncation_error_names_longest_row(tokenizer, mixed_length_file):
    lengths = _lengths(tokenizer, mixed_length_file)
    limit = sorted(lengths)[1]  # two rows fit, two do not; the longest is line 2
    assert lengths[1] == max(lengths) and lengths[3] > limit
    with pytest.raises(ValueError) as exc:
        RLHFDataset(mixed_length_file, tokenizer, max_prompt_length=limit)
    msg = str(exc.value)
    assert f"2 prompt(s) exceed max_prompt_length={limit}" in msg
    assert f"{mixed_length_file} line 2 with {lengths[1]} tokens" in msg
    assert "truncation='drop'" in msg


def test_truncation_drop(tokenizer, mixed_length_file, caplog):
    lengths = _lengths(tokenizer, mixed_length_file)
    limit = sorted(lengths)[1]
    with caplog.at_level(logging.WARNING, logger="verl.data.rl_dataset"):
        ds = RLHFDataset(mixed_length_file, tokenizer, max_prompt_length=limit, truncation="drop")
    assert len(ds) == 2 and ds.num_dropped == 2
    assert ds.dropped_rows == [f"{mixed_length_file} line 2", f"{mixed_length_file} line 4"]
    assert [ds[i]["index"] for i in range(2)] == [0, 2]  # source rows kept their index
    assert "dropped 2 prompt(s)" in caplog.text and "line 4" in caplog.text
    with pytest.raises(ValueError, match="every prompt exceeds"):
        RLHFDataset(mixed_length_file, tokenizer, max_prompt_length=1, truncation="drop")


def test_truncation_left(tokenizer, mixed_length_file):
    full = RLHFDataset(mixed_length_file, tokenizer)
    limit = 10
    ds = RLHFDataset(mixed_length_file, tokenizer, max_prompt_length=limit, truncation="left")
    assert len(ds) == 4 and ds.num_truncated == sum(n > limit for n in full.prompt_lengths)
    for i in range(4):
        expected = full[i]["input_ids"].tolist()[-limit:]
        assert ds[i]["input_ids"].tolist() == expected
    # The generation prompt survives: it is at the end.
    assert tokenizer.decode(ds[1]["input_ids"]).endswith("<|im_start|>assistant\n")


def test_argument_errors(tmp_path, tokenizer, make_row):
    path = write_records([make_row("q", "1")], tmp_path / "t.jsonl")
    with pytest.raises(ValueError, match="truncation='right'"):
        RLHFDataset(path, tokenizer, truncation="right")
    with pytest.raises(ValueError, match="max_prompt_length=0"):
        RLHFDataset(path, tokenizer, max_prompt_length=0)
    with pytest.raises(FileNotFoundError, match=r"nope\.parquet"):
        RLHFDataset(tmp_path / "nope.parquet", tokenizer)
    (tmp_path / "t.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported extension"):
        RLHFDataset(tmp_path / "t.csv", tokenizer)
    with pytest.raises(ValueError, match="no data files"):
        RLHFDataset([], tokenizer)
    tokenizer_without_template = build_tiny_tokenizer()
    tokenizer_without_template.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        RLHFDataset(path, tokenizer_without_template)


# ----------------------------------------------------------------------------- validation

GOOD = {
    "data_source": "s",
    "prompt": [{"role": "user", "content": "q"}],
    "reward_model": {"ground_truth": "1"},
}


def _with(**changes):
    row = json.loads(json.dumps(GOOD))
    for key, value in changes.items():
        if value is KeyError:
            row.pop(key)
        else:
            row[key] = value
    return row


MALFORMED = [
    ("missing column", _with(data_source=KeyError), "missing required field 'data_source'"),
    ("missing prompt", _with(prompt=KeyError), "missing required field 'prompt'"),
    ("prompt is a number", _with(prompt=7), "'prompt' must be a list"),
    ("prompt is a blank string", _with(prompt="  "), "every message content is blank"),
    ("message not a dict", _with(prompt=["hi"]), "prompt message 0 must be a dict"),
    ("no role", _with(prompt=[{"content": "q"}]), "prompt message 0 has no 'role'"),
    (
        "no content",
        _with(prompt=[{"role": "user", "content": "q"}, {"role": "user"}]),
        "prompt message 1 has no 'content'",
    ),
    ("content not str", _with(prompt=[{"role": "user", "content": 3}]), "'content' must be a"),
    ("empty prompt", _with(prompt=[]), "empty prompt"),
    ("blank prompt", _with(prompt=[{"role": "user", "content": "  "}]), "empty prompt"),
    ("no ground truth", _with(reward_model={"style": "rule"}), "missing ground truth"),
    ("null ground truth", _with(reward_model={"ground_truth": None}), "missing ground truth"),
    ("reward_model not dict", _with(reward_model="1"), "'reward_model' must be a dict"),
    ("data_source not str", _with(data_source=3), "'data_source' must be a string"),
    ("extra_info not dict", _with(extra_info=[1]), "'extra_info' must be a dict"),
    ("invalid json", '{"data_source": "s", "prompt": [', "invalid JSON"),
    ("not an object", "[1, 2]", "expected a JSON object, got list"),
    ("non-UTF-8", b'{"data_source": "caf\xe9"}', "not valid UTF-8 (byte 0xe9"),
]


@pytest.mark.parametrize(("case", "bad", "phrase"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_row_names_file_and_line(tmp_path, tokenizer, case, bad, phrase):
    path = write_jsonl_lines(tmp_path / "bad.jsonl", [GOOD, "", bad, GOOD])
    with pytest.raises(DatasetValidationError) as exc:
        RLHFDataset(path, tokenizer)
    # Line numbers are 1-based physical lines: the blank line 2 still counts.
    assert len(exc.value.problems) == 1
    assert exc.value.problems[0].startswith(f"{path} line 3: ")
    assert phrase in exc.value.problems[0]
    assert exc.value.problems[0] in str(exc.value)


def test_parquet_missing_column_and_bad_row(tmp_path, tokenizer):
    no_gt_column = write_records(
        [{"data_source": "s", "prompt": [{"role": "user", "content": "q"}]}],
        tmp_path / "a.parquet",
    )
    bad_row = write_records([GOOD, _with(prompt=[])], tmp_path / "b.parquet")
    with pytest.raises(DatasetValidationError) as exc:
        RLHFDataset([no_gt_column, bad_row], tokenizer)
    assert len(exc.value.problems) == 2
    assert exc.value.problems[0].startswith(f"{no_gt_column}: missing required column(s)")
    assert "'reward_model'" in exc.value.problems[0]
    assert exc.value.problems[1] == f"{bad_row} row 2: empty prompt: 'prompt' has no messages"


def test_reports_many_problems_at_once(tmp_path, tokenizer):
    a = write_jsonl_lines(tmp_path / "a.jsonl", [_with(prompt=[]), GOOD, _with(prompt=3)])
    b = write_jsonl_lines(
        tmp_path / "b.jsonl", [GOOD, _with(reward_model={}), "{oops", _with(data_source=None)]
    )
    with pytest.raises(DatasetValidationError) as exc:
        RLHFDataset([a, b], tokenizer, max_reported_problems=3)
    where = [p.split(": ", 1)[0] for p in exc.value.problems]
    assert where == [f"{a} line 1", f"{a} line 3", f"{b} line 2", f"{b} line 3", f"{b} line 4"]
    msg = str(exc.value)
    assert msg.startswith("5 problem(s) in the dataset (rows and lines numbered from 1):")
    assert f"{b} line 2" in msg and f"{b} line 3" not in msg
    assert msg.endswith("... and 2 more")


def test_empty_file_is_a_problem(tmp_path, tokenizer):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n")
    with pytest.raises(DatasetValidationError, match="the file has no rows"):
        RLHFDataset(path, tokenizer)


def test_validation_error_pickles():
    err = DatasetValidationError(["a", "b", "c"], max_reported=1)
    copy = pickle.loads(pickle.dumps(err))
    assert copy.problems == ["a", "b", "c"] and str(copy) == str(err)
    assert str(err).splitlines()[1:] == ["  - a", "  ... and 2 more"]


# ----------------------------------------------------------------------------- tools


def test_tools_go_to_the_template_or_the_system_prompt(tmp_path, tokenizer, make_row):
    from verl.data.base import tools_system_prompt
    from verl.tools.calculator import CALCULATOR_SCHEMA

    rows = [make_row("What is 1 + 2?", "3"), make_row("What is 7 * 6?", "42")]
    rows[1]["prompt"].insert(0, {"role": "system", "content": "Be brief."})
    path = write_records(rows, tmp_path / "train.jsonl")
    tools = [CALCULATOR_SCHEMA]
    # The tiny ChatML template ignores tools=: they are described in the system message,
    # merged into the row's own system message when it has one.
    ds = RLHFDataset(path, tokenizer, tools=tools)
    listing = tools_system_prompt(tools)
    assert '"name": "calculator"' in listing and "<tool_call>" in listing
    assert ds[0]["input_ids"].tolist() == chat_ids(
        tokenizer, [{"role": "system", "content": listing}, *rows[0]["prompt"]]
    )
    assert ds[1]["input_ids"].tolist() == chat_ids(
        tokenizer,
        [{"role": "system", "content": "Be brief.\n\n" + listing}, *rows[1]["prompt"][1:]],
    )
    assert ds[0]["raw_prompt"] == rows[0]["prompt"]  # the row itself is unchanged

    # A template that renders tools itself gets them through tools=.
    tokenizer_with_tools = build_tiny_tokenizer()
    tokenizer_with_tools.chat_template = (
        "{% if tools %}TOOLS:{% for t in tools %}{{ t['function']['name'] }};{% endfor %}"
        "{% endif %}" + tokenizer.chat_template
    )
    ds = RLHFDataset(path, tokenizer_with_tools, tools=tools)
    text = tokenizer_with_tools.decode(ds[0]["input_ids"])
    assert text.startswith("TOOLS:calculator;") and "<tools>" not in text
