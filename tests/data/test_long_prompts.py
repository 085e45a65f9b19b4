"""A prompt far over `max_prompt_length` is cut to a character window before tokenising:
the same last tokens, the same errors, and the tokenizer never sees the whole text (a
10 MB prompt took 3.5 GB and 24-35 s before; about 0.1 s after)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from verl.data import RLHFDataset
from verl.data.rl_dataset import char_window
from verl.models.tiny import build_tiny_tokenizer

LONG = "12 + 34 = ? what is it, exactly? " * 20_000  # 660k characters


class _Recording:
    """The tokenizer, recording the longest text it was asked to encode."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.longest = 0

    def __call__(self, texts, **kwargs):
        self.longest = max(self.longest, *(len(t) for t in texts))
        return self._tokenizer(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def _write(tmp_path: Path, contents: list[str]) -> Path:
    path = tmp_path / "prompts.jsonl"
    rows = [
        {
            "prompt": [{"role": "user", "content": c}],
            "data_source": "arithmetic",
            "reward_model": {"ground_truth": "46"},
        }
        for c in contents
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("chat", [True, False])
def test_truncate_keeps_the_same_last_tokens_without_tokenising_everything(tmp_path, chat):
    tokenizer = build_tiny_tokenizer()
    if chat and tokenizer.chat_template is None:
        pytest.skip("the tiny tokenizer has no chat template")
    recording = _Recording(tokenizer)
    ds = RLHFDataset(
        _write(tmp_path, [LONG, "1 + 1 = ?"]),
        recording,
        max_prompt_length=48,
        truncation="truncate",
        apply_chat_template=chat,
    )
    window = char_window(tokenizer, 48)
    assert recording.longest <= window < len(LONG) // 10
    messages = [{"role": "user", "content": LONG}]
    full_text = (
        tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if chat
        else LONG
    )
    full = tokenizer(full_text, add_special_tokens=not chat)["input_ids"]
    assert ds[0]["input_ids"].tolist() == full[-48:]
    assert ds.num_truncated == 1 and len(ds) == 2


def test_error_and_drop_on_a_huge_prompt(tmp_path):
    tokenizer = build_tiny_tokenizer()
    path = _write(tmp_path, [LONG, "1 + 1 = ?"])
    with pytest.raises(ValueError) as err:
        RLHFDataset(path, tokenizer, max_prompt_length=48, truncation="error")
    found = re.search(r"line 1 with (\d+) characters \(at least \d+ tokens", str(err.value))
    assert found and int(found.group(1)) >= len(LONG), str(err.value)
    assert "exceed max_prompt_length=48" in str(err.value)
    ds = RLHFDataset(path, tokenizer, max_prompt_length=48, truncation="drop")
    assert len(ds) == 1 and ds.num_dropped == 1


def test_char_window_bounds_tokens():
    tokenizer = build_tiny_tokenizer()
    window = char_window(tokenizer, 10)
    text = "x" * window
    assert len(tokenizer(text)["input_ids"]) > 10
    assert char_window(tokenizer, None) is None
