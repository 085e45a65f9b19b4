"""verl.data.base: one reading / validation / length-limit base and one truncation vocabulary
for the RL, SFT and preference datasets."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from verl.config import load_config
from verl.config.schema_offline import load_dpo_config, load_sft_config
from verl.data.base import TRUNCATION_MODES, resolve_truncation, validate_messages
from verl.data.io import DatasetValidationError, write_records
from verl.data.preference_dataset import PreferenceDataset
from verl.data.rl_dataset import RLHFDataset
from verl.data.sft_dataset import SFTDataset


def test_vocabulary_and_aliases():
    assert TRUNCATION_MODES == ("error", "drop", "truncate")
    for mode in TRUNCATION_MODES:
        assert resolve_truncation(mode) == mode
    assert resolve_truncation("left", {"left": "truncate"}) == "truncate"
    with pytest.raises(ValueError, match=r"truncation='left'; choose one of \('error', 'drop'"):
        resolve_truncation("left")


@pytest.fixture
def files(tmp_path: Path, make_row) -> dict[str, str]:
    long_q = "a much longer question " * 8
    rl = write_records([make_row("short", "1"), make_row(long_q, "2")], tmp_path / "rl.jsonl")
    sft = write_records(
        [{"prompt": "short", "response": "ok"}, {"prompt": long_q, "response": "an answer " * 8}],
        tmp_path / "sft.jsonl",
    )
    pref = write_records(
        [
            {"prompt": "short", "chosen": "yes", "rejected": "no"},
            {"prompt": long_q, "chosen": "a long answer " * 10, "rejected": "no"},
        ],
        tmp_path / "pref.jsonl",
    )
    return {"rl": rl, "sft": sft, "pref": pref}


def _build(kind: str, path: str, tokenizer, truncation: str):
    if kind == "rl":
        return RLHFDataset(path, tokenizer, max_prompt_length=12, truncation=truncation)
    if kind == "sft":
        return SFTDataset(path, tokenizer, max_length=80, truncation=truncation)
    return PreferenceDataset(
        path, tokenizer, max_prompt_length=12, max_length=24, truncation=truncation
    )


@pytest.mark.parametrize("kind", ["rl", "sft", "pref"])
def test_one_vocabulary_for_every_dataset(kind, files, tokenizer):
    path = files[kind]
    with pytest.raises(DatasetValidationError, match=r"line 2"):
        _build(kind, path, tokenizer, "error")
    dropped = _build(kind, path, tokenizer, "drop")
    assert len(dropped) == 1 and dropped.num_dropped == 1 and dropped.num_truncated == 0
    assert dropped.dropped_rows == [f"{path} line 2"]
    cut = _build(kind, path, tokenizer, "truncate")
    assert len(cut) == 2 and cut.num_truncated == 1 and cut.num_dropped == 0
    assert cut.truncation == "truncate"


def test_old_spellings_are_aliases_of_truncate_where_they_named_the_same_cut(files, tokenizer):
    left = _build("rl", files["rl"], tokenizer, "left")
    cut = _build("rl", files["rl"], tokenizer, "truncate")
    assert left.truncation == "truncate"
    assert left[1]["input_ids"].tolist() == cut[1]["input_ids"].tolist()
    assert len(cut[1]["input_ids"]) == 12
    right = _build("sft", files["sft"], tokenizer, "right")
    cut = _build("sft", files["sft"], tokenizer, "truncate")
    assert right.truncation == "truncate"
    assert right[1]["input_ids"].tolist() == cut[1]["input_ids"].tolist()
    assert len(cut[1]["input_ids"]) == 80
    # a spelling that names the other side is refused, not silently reinterpreted
    with pytest.raises(ValueError, match=r"truncation='right'; choose one of .*'left'"):
        _build("rl", files["rl"], tokenizer, "right")
    with pytest.raises(ValueError, match=r"truncation='left'; choose one of .*'right'"):
        _build("sft", files["sft"], tokenizer, "left")
    with pytest.raises(ValueError, match=r"truncation='left'"):
        _build("pref", files["pref"], tokenizer, "left")


def test_configs_accept_the_vocabulary_and_the_old_spellings():
    assert load_config(overrides=["data.truncation=truncate"]).data.truncation == "truncate"
    assert load_config(overrides=["data.truncation=left"]).data.truncation == "left"
    assert load_sft_config(overrides=["data.truncation=truncate"]).data.truncation == "truncate"
    assert load_sft_config(overrides=["data.truncation=right"]).data.truncation == "right"
    assert load_dpo_config(overrides=["data.truncation=truncate"]).data.truncation == "truncate"


def test_truncate_drops_a_row_left_with_nothing_to_train_on(tmp_path, tokenizer, caplog):
    # preference: a prompt that fills max_length leaves no room for a completion
    rows = [{"prompt": "p", "chosen": "y", "rejected": "n"}] * 2
    rows[1] = {"prompt": "word " * 40, "chosen": "y", "rejected": "n"}
    path = write_records(rows, tmp_path / "p.jsonl")
    with caplog.at_level(logging.WARNING):
        ds = PreferenceDataset(path, tokenizer, max_length=16, truncation="truncate")
    assert len(ds) == 1 and ds.num_dropped == 1 and ds.dropped_rows == [f"{path} line 2"]
    assert "nothing left to train on" in caplog.text
    # every row dropped: an error naming the limit, whatever the dataset
    with pytest.raises(ValueError, match=r"every row exceeds max_prompt_length=None, max_length=2"):
        PreferenceDataset(path, tokenizer, max_length=2, truncation="drop")
    with pytest.raises(ValueError, match=r"every sample exceeds max_length=2"):
        SFTDataset(
            write_records([{"prompt": "p", "response": "r"}], tmp_path / "s.jsonl"),
            tokenizer,
            max_length=2,
            truncation="drop",
        )


def test_shared_checks_name_file_and_row(tmp_path, tokenizer):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    for build in (
        lambda: RLHFDataset(str(empty), tokenizer),
        lambda: SFTDataset(str(empty), tokenizer),
        lambda: PreferenceDataset(str(empty), tokenizer),
    ):
        with pytest.raises(DatasetValidationError, match=rf"{empty}: the file has no rows"):
            build()
    path = write_records([{"prompt": "p", "response": "r"}], tmp_path / "s.jsonl")
    template, tokenizer.chat_template = tokenizer.chat_template, None
    try:
        for build in (SFTDataset, PreferenceDataset):
            with pytest.raises(ValueError, match=r"data\.apply_chat_template=false"):
                build(path, tokenizer)
    finally:
        tokenizer.chat_template = template
    assert validate_messages([{"role": "user", "content": 3}], "'m'") == [
        "'m' message 0 'content' must be a string, got int 3"
    ]
    assert validate_messages([{"role": "user", "content": " "}], "'p'", nonblank="prompt") == [
        "empty prompt: every message content is blank"
    ]
