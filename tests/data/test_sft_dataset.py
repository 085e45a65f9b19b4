"""SFT data: assistant-only loss masks (single and multi-turn), row validation, truncation,
packing and collation."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from verl.data.io import DatasetValidationError, write_records
from verl.data.sft_dataset import (
    PackedSFTDataset,
    SFTDataset,
    collate_sft,
    make_arithmetic_sft_rows,
    pack_lengths,
    tokenize_conversation,
)
from verl.models.tiny import build_tiny_tokenizer


def spans(tokenizer, ids, mask) -> list[tuple[int, str]]:
    """Runs of equal mask value, decoded: [(mask, text), ...]."""
    out = []
    for flag, group in itertools.groupby(zip(ids, mask), key=lambda x: x[1]):
        out.append((flag, tokenizer.decode([i for i, _ in group])))
    return out


def test_single_turn_mask_covers_answer_and_end_of_turn(tokenizer):
    messages = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "The answer is 5."},
    ]
    ids, mask = tokenize_conversation(tokenizer, messages)
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    assert ids == tokenizer(full, add_special_tokens=False)["input_ids"]
    assert spans(tokenizer, ids, mask) == [
        (0, "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"),
        (1, "The answer is 5.<|im_end|>"),
        (0, "\n"),
    ]
    # The prompt part is exactly what a generation from this prompt would see.
    prompt_ids = tokenizer.apply_chat_template(
        messages[:1], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert ids[: len(prompt_ids)] == list(prompt_ids)
    assert mask[: len(prompt_ids)] == [0] * len(prompt_ids)


def test_multi_turn_mask_covers_every_assistant_turn_only(tokenizer):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "And 4 + 4?"},
        {"role": "assistant", "content": "It is 8."},
    ]
    ids, mask = tokenize_conversation(tokenizer, messages)
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    assert ids == tokenizer(full, add_special_tokens=False)["input_ids"]
    trained = [text for flag, text in spans(tokenizer, ids, mask) if flag]
    assert trained == ["5<|im_end|>", "It is 8.<|im_end|>"]
    assert mask[0] == 0


def test_template_that_rewrites_history_is_rejected_with_row(tmp_path: Path):
    tok = build_tiny_tokenizer()
    # Drops the content of earlier assistant turns (as reasoning templates do).
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] != 'assistant' or loop.last %}{{ m['content'] }}{% endif %}"
        "<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    chat = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
        {"role": "assistant", "content": "bye"},
    ]
    path = write_records([{"messages": chat}], tmp_path / "chats.jsonl")
    with pytest.raises(DatasetValidationError, match=r"chats.jsonl line 1: .*prefix-consistent"):
        SFTDataset(path, tok)


def test_prompt_response_rows_equal_the_chat_form(tmp_path: Path, tokenizer):
    chat = [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "2"}]
    rows = [
        {"messages": chat},
        {"prompt": "What is 1 + 1?", "response": "2"},
        {"prompt": chat[:1], "response": chat[1:]},
    ]
    ds = SFTDataset(write_records(rows, tmp_path / "mixed.jsonl"), tokenizer)
    first = ds[0]
    for i in (1, 2):
        assert ds[i]["input_ids"].tolist() == first["input_ids"].tolist()
        assert ds[i]["loss_mask"].tolist() == first["loss_mask"].tolist()
    assert first["position_ids"].tolist() == list(range(len(first["input_ids"])))


def test_prompt_and_response_inside_a_mapping_column(tmp_path: Path, tokenizer):
    """Upstream's GSM8K SFT layout: prompt_key=extra_info with prompt_dict_keys=[question]."""
    flat = SFTDataset(
        write_records([{"prompt": "What is 2 + 3?", "response": "5"}], tmp_path / "flat.jsonl"),
        tokenizer,
    )
    rows = [
        {"extra_info": {"question": "What is 2 + 3?", "answer": "5", "index": 0}},
        {"extra_info": {"question": "What is 1 + 1?"}},  # no answer
        {"extra_info": "not a mapping"},
    ]
    path = write_records(rows, tmp_path / "nested.jsonl")
    keys = dict(
        prompt_key="extra_info",
        response_key="extra_info",
        prompt_path=["question"],
        response_path=["answer"],
    )
    with pytest.raises(DatasetValidationError) as err:
        SFTDataset(path, tokenizer, **keys)
    assert [p.replace(f"{tmp_path}/", "") for p in err.value.problems] == [
        "nested.jsonl line 2: missing column(s) ['extra_info.answer']: a row needs 'messages' "
        "(chat messages) or 'extra_info.question' and 'extra_info.answer'",
        "nested.jsonl line 3: missing column(s) ['extra_info.question', 'extra_info.answer']: "
        "a row needs 'messages' (chat messages) or 'extra_info.question' and "
        "'extra_info.answer'",
    ]
    nested = SFTDataset(write_records(rows[:1], tmp_path / "one.jsonl"), tokenizer, **keys)
    assert nested[0]["input_ids"].tolist() == flat[0]["input_ids"].tolist()
    assert nested[0]["loss_mask"].tolist() == flat[0]["loss_mask"].tolist()


def test_plain_text_rows_train_on_response_and_eos(tmp_path: Path, tokenizer):
    path = write_records([{"prompt": "3 + 4 =", "response": " 7"}], tmp_path / "plain.jsonl")
    ds = SFTDataset(path, tokenizer, apply_chat_template=False)
    item = ds[0]
    assert spans(tokenizer, item["input_ids"].tolist(), item["loss_mask"].tolist()) == [
        (0, "3 + 4 ="),
        (1, " 7<|im_end|>"),
    ]


def test_bad_rows_are_all_reported_with_file_and_line(tmp_path: Path, tokenizer):
    rows = [
        {"prompt": "ok", "response": "fine"},
        {"prompt": "no response here"},
        {"messages": "not a list"},
        {"messages": [{"role": "user", "content": "only a user"}]},
        {"prompt": "x", "response": "   "},
        {"prompt": 3, "response": "y"},
        {"messages": [{"role": "assistant", "content": 5}]},
    ]
    path = write_records(rows, tmp_path / "bad.jsonl")
    with pytest.raises(DatasetValidationError) as err:
        SFTDataset(path, tokenizer)
    problems = err.value.problems
    assert len(problems) == 6
    text = "\n".join(problems)
    assert "bad.jsonl line 2: missing column(s) ['response']" in text
    assert "bad.jsonl line 3: 'messages' must be a list of chat messages" in text
    assert "bad.jsonl line 4: 'messages' has no assistant message with content" in text
    assert "bad.jsonl line 5: empty response" in text
    assert "bad.jsonl line 6: 'prompt' must be a list of chat messages" in text
    assert "bad.jsonl line 7: 'messages' message 0 'content' must be a string, got int" in text


def _long_and_short(tmp_path: Path) -> str:
    rows = [
        {"prompt": "short", "response": "ok"},
        {"prompt": "a much longer question " * 8, "response": "and a long answer " * 8},
    ]
    return write_records(rows, tmp_path / "lengths.jsonl")


def test_truncation_error_names_rows_and_fix(tmp_path: Path, tokenizer):
    with pytest.raises(DatasetValidationError) as err:
        SFTDataset(_long_and_short(tmp_path), tokenizer, max_length=100)
    (problem,) = err.value.problems
    assert "lengths.jsonl line 2: 133 tokens > max_length=100" in problem
    assert "data.truncation=right" in problem


def test_truncation_right_and_drop(tmp_path: Path, tokenizer):
    path = _long_and_short(tmp_path)
    # the long row: 133 tokens, its response starts at token 73
    right = SFTDataset(path, tokenizer, max_length=100, truncation="right")
    assert len(right) == 2 and right.num_truncated == 1
    assert len(right[1]["input_ids"]) == 100 and right[1]["loss_mask"].sum() == 100 - 73
    dropped = SFTDataset(path, tokenizer, max_length=100, truncation="drop")
    assert len(dropped) == 1 and dropped.dropped_rows == [f"{path} line 2"]
    # cut before the response starts: nothing left to learn, so the row is dropped
    prompt_only = SFTDataset(path, tokenizer, max_length=60, truncation="right")
    assert len(prompt_only) == 1 and prompt_only.num_dropped == 1


def test_pack_lengths_fills_bins_without_overflow():
    lengths = [7, 3, 5, 2, 8, 1, 4]
    bins = pack_lengths(lengths, 10)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins)
    assert len(bins) == 3  # 30 tokens in bins of 10
    with pytest.raises(ValueError, match="max_length=5"):
        pack_lengths([6], 5)


def test_packed_items_restart_positions_and_collate_pads_as_new_segment(tmp_path, tokenizer):
    rows = make_arithmetic_sft_rows(6, seed=3)
    ds = SFTDataset(write_records(rows, tmp_path / "arith.parquet"), tokenizer)
    packed = PackedSFTDataset(ds, max_length=2 * int(ds.lengths.max()))
    assert len(packed) < len(ds)
    item = packed[0]
    starts = np.flatnonzero(item["position_ids"] == 0)
    assert len(starts) == item["num_samples"] >= 2
    assert (item["loss_mask"][starts] == 0).all()  # nothing predicts a sample's first token
    assert sum(packed[i]["num_samples"] for i in range(len(packed))) == len(ds)
    assert sum(int(packed[i]["loss_mask"].sum()) for i in range(len(packed))) == sum(
        int(ds[i]["loss_mask"].sum()) for i in range(len(ds))
    )

    batch = collate_sft([ds[0], item], pad_token_id=tokenizer.pad_token_id)
    n0 = len(ds[0]["input_ids"])
    assert batch["input_ids"].shape == (2, len(item["input_ids"]))
    assert (batch["input_ids"][0, n0:] == tokenizer.pad_token_id).all()
    assert batch["attention_mask"][0].sum() == n0
    assert (batch["loss_mask"][0, n0:] == 0).all()
    assert batch["position_ids"][0, n0:].tolist() == list(range(batch["input_ids"].shape[1] - n0))
    assert int(batch["num_samples"]) == 1 + item["num_samples"]
    assert batch["input_ids"].dtype == torch.long


def test_chat_template_errors_name_the_row(tmp_path: Path):
    tok = build_tiny_tokenizer()
    tok.chat_template = (
        "{% if messages[0]['role'] != 'system' %}"
        "{{ raise_exception('the first message must be a system message') }}{% endif %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    rows = [{"prompt": "hi", "response": "hello"}]
    path = write_records(rows, tmp_path / "rows.jsonl")
    with pytest.raises(
        DatasetValidationError, match=r"rows\.jsonl line 1: cannot tokenise: the first"
    ):
        SFTDataset(path, tok)
