"""Preference data: tokenisation of prompt/completion, validation errors naming file and
row, truncation, KTO rows, and the prompt-left / completion-right batch layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from verl.data.io import DatasetValidationError, write_records
from verl.data.preference_dataset import (
    PreferenceDataset,
    collate_preference,
    encode_prompt_completion,
    make_arithmetic_preference_rows,
)


def test_encode_with_chat_template(tokenizer):
    prompt_ids, completion_ids = encode_prompt_completion(tokenizer, "What is 2 + 2?", "4")
    expected_prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    assert prompt_ids == list(expected_prompt)
    assert tokenizer.decode(completion_ids) == "4<|im_end|>"  # the trailing newline is not scored
    # messages give the same ids as text
    msgs = encode_prompt_completion(
        tokenizer,
        [{"role": "user", "content": "What is 2 + 2?"}],
        [{"role": "assistant", "content": "4"}],
    )
    assert msgs == (prompt_ids, completion_ids)


def test_encode_plain_text(tokenizer):
    prompt_ids, completion_ids = encode_prompt_completion(
        tokenizer, "2 + 2 =", " 4", apply_chat_template=False
    )
    assert tokenizer.decode(prompt_ids) == "2 + 2 ="
    assert tokenizer.decode(completion_ids) == " 4<|im_end|>"


def test_pairs_dataset_and_collate_layout(tmp_path: Path, tokenizer):
    rows = [
        {"prompt": "What is 1 + 1?", "chosen": "2", "rejected": "3"},
        {
            "prompt": [{"role": "user", "content": "Say hello to the world please"}],
            "chosen": [{"role": "assistant", "content": "Hello world!"}],
            "rejected": "no",
        },
    ]
    ds = PreferenceDataset(write_records(rows, tmp_path / "pairs.jsonl"), tokenizer)
    assert ds.paired and len(ds) == 2
    batch = collate_preference([ds[0], ds[1]], pad_token_id=tokenizer.pad_token_id, paired=True)
    p = max(len(ds[i]["prompt_ids"]) for i in range(2))
    r = max(len(ds[i][k]) for i in range(2) for k in ("chosen_ids", "rejected_ids"))
    assert batch["input_ids"].shape == (4, p + r)
    assert batch["response_mask"].shape == (4, r)
    # rows: chosen 0, chosen 1, rejected 0, rejected 1
    for row, (i, key) in enumerate(
        [(0, "chosen"), (1, "chosen"), (0, "rejected"), (1, "rejected")]
    ):
        prompt, completion = ds[i]["prompt_ids"], ds[i][f"{key}_ids"]
        ids, mask = batch["input_ids"][row], batch["attention_mask"][row]
        assert ids[p - len(prompt) : p].tolist() == prompt  # left-padded prompt
        assert ids[p : p + len(completion)].tolist() == completion  # right-padded completion
        assert batch["response_mask"][row].sum() == len(completion)
        assert mask.sum() == len(prompt) + len(completion)
        first = p - len(prompt)
        assert batch["position_ids"][row, first : p + len(completion)].tolist() == list(
            range(len(prompt) + len(completion))
        )
    assert "ref_chosen_logps" not in batch
    ds.set_reference_log_probs(ref_chosen_logps=[-1.0, -2.0], ref_rejected_logps=[-3.0, -4.0])
    assert ds.has_reference_log_probs
    batch = collate_preference([ds[1]], pad_token_id=tokenizer.pad_token_id, paired=True)
    assert batch["ref_chosen_logps"].tolist() == [-2.0]
    assert batch["ref_rejected_logps"].tolist() == [-4.0]


def test_kto_rows_and_unpairing(tmp_path: Path, tokenizer):
    rows = [
        {"prompt": "1 + 1?", "completion": "2", "label": True},
        {"prompt": "1 + 1?", "completion": "5", "label": False},
    ]
    ds = PreferenceDataset(write_records(rows, tmp_path / "kto.parquet"), tokenizer)
    assert not ds.paired and [ds[i]["label"] for i in range(2)] == [True, False]
    batch = collate_preference([ds[0], ds[1]], pad_token_id=0, paired=False)
    assert batch["labels"].tolist() == [True, False] and batch["input_ids"].shape[0] == 2

    pairs = PreferenceDataset(
        write_records(make_arithmetic_preference_rows(3, seed=1), tmp_path / "p.jsonl"), tokenizer
    )
    pairs.set_reference_log_probs(ref_chosen_logps=[1.0, 2.0, 3.0], ref_rejected_logps=[4, 5, 6])
    singles = pairs.to_unpaired()
    assert len(singles) == 6 and not singles.paired
    assert [singles[i]["label"] for i in range(6)] == [True, False] * 3
    assert [singles[i]["ref_logps"] for i in range(6)] == [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
    assert singles[1]["completion_ids"] == pairs[0]["rejected_ids"]


def test_arithmetic_pairs_have_right_and_wrong_answers():
    rows = make_arithmetic_preference_rows(20, digits=1, ops=["+", "*"], seed=0)
    for row in rows:
        a, op, b = row["prompt"][0]["content"].removeprefix("What is ").split("?")[0].split()
        assert row["chosen"] == str(int(a) + int(b) if op == "+" else int(a) * int(b))
        assert row["rejected"] != row["chosen"] and int(row["rejected"]) >= 0


def test_bad_rows_are_all_reported_with_file_and_row(tmp_path: Path, tokenizer):
    rows = [
        {"prompt": "fine", "chosen": "a", "rejected": "b"},
        {"prompt": "no rejected", "chosen": "a"},
        {"prompt": "", "chosen": "a", "rejected": "b"},
        {"prompt": "empty chosen", "chosen": "  ", "rejected": "b"},
        {"prompt": "typed", "chosen": 7, "rejected": "b"},
        {"prompt": "roles", "chosen": [{"role": "user", "content": "x"}], "rejected": "b"},
    ]
    path = write_records(rows, tmp_path / "bad.jsonl")
    with pytest.raises(DatasetValidationError) as err:
        PreferenceDataset(path, tokenizer)
    text = "\n".join(err.value.problems)
    assert len(err.value.problems) == 5
    assert "bad.jsonl line 2: missing column(s) ['rejected']" in text
    assert "bad.jsonl line 3: empty prompt" in text
    assert "bad.jsonl line 4: empty chosen: 'chosen' is blank" in text
    assert "bad.jsonl line 5: 'chosen' must be a list of chat messages" in text
    assert "bad.jsonl line 6: 'chosen' messages must all have role 'assistant'" in text


def test_kto_label_must_be_bool(tmp_path: Path, tokenizer):
    rows = [
        {"prompt": "a", "completion": "b", "label": True},
        {"prompt": "a", "completion": "b", "label": 1},
        {"prompt": "a", "completion": "b", "label": "yes"},
    ]
    path = write_records(rows, tmp_path / "labels.jsonl")
    with pytest.raises(DatasetValidationError) as err:
        PreferenceDataset(path, tokenizer)
    assert err.value.problems == [
        f"{path} line 2: 'label' must be a boolean (true = desirable, false = undesirable), "
        "got int 1",
        f"{path} line 3: 'label' must be a boolean (true = desirable, false = undesirable), "
        "got str 'yes'",
    ]


def test_mixed_and_unknown_formats(tmp_path: Path, tokenizer):
    mixed = write_records(
        [
            {"prompt": "a", "chosen": "b", "rejected": "c"},
            {"prompt": "a", "completion": "b", "label": True},
        ],
        tmp_path / "mixed.jsonl",
    )
    with pytest.raises(DatasetValidationError, match=r"mixed row formats: .*line 1.*line 2"):
        PreferenceDataset(mixed, tokenizer)
    neither = write_records([{"prompt": "a", "answer": "b"}], tmp_path / "neither.jsonl")
    with pytest.raises(DatasetValidationError, match=r"line 1: missing column\(s\)"):
        PreferenceDataset(neither, tokenizer)


def test_length_limits(tmp_path: Path, tokenizer):
    rows = [
        {"prompt": "short", "chosen": "yes", "rejected": "no"},
        {"prompt": "a long prompt " * 10, "chosen": "a long answer " * 10, "rejected": "no"},
    ]
    path = write_records(rows, tmp_path / "len.jsonl")
    with pytest.raises(DatasetValidationError, match=r"len.jsonl line 2: prompt \d+ tokens"):
        PreferenceDataset(path, tokenizer, max_prompt_length=16, max_length=32)
    dropped = PreferenceDataset(
        path, tokenizer, max_prompt_length=16, max_length=32, truncation="drop"
    )
    assert len(dropped) == 1 and dropped.num_dropped == 1
    cut = PreferenceDataset(
        path, tokenizer, max_prompt_length=16, max_length=32, truncation="truncate"
    )
    item = cut[1]
    assert len(item["prompt_ids"]) == 16
    assert len(item["prompt_ids"]) + len(item["chosen_ids"]) == 32
    full = PreferenceDataset(path, tokenizer)[1]
    assert item["prompt_ids"] == full["prompt_ids"][-16:]  # the end of the prompt is kept
    assert item["chosen_ids"] == full["chosen_ids"][:16]  # the start of the completion is kept
    assert item["rejected_ids"] == full["rejected_ids"]


def test_collate_returns_long_tensors(tokenizer):
    items = [{"prompt_ids": [5, 6], "completion_ids": [7], "label": False}]
    batch = collate_preference(items, pad_token_id=0, paired=False)
    assert batch["input_ids"].dtype == torch.long and batch["input_ids"].tolist() == [[5, 6, 7]]
    assert batch["response_mask"].tolist() == [[1]]
