"""Fixtures for the data tests: the tiny ChatML tokenizer and verl-format row builders."""

from __future__ import annotations

from typing import Any

import pytest

from verl.models.tiny import build_tiny_tokenizer


@pytest.fixture(scope="session")
def tokenizer():
    """The tiny ChatML byte-level BPE (eos `<|im_end|>`, pad `<|endoftext|>` = id 0)."""
    return build_tiny_tokenizer()


def _make_row(question: str, answer: str, source: str = "arithmetic", **extra: Any) -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"q": question, **extra},
    }


@pytest.fixture
def make_row():
    """`make_row(question, answer, source=..., **extra_info)`: a valid verl prompt row."""
    return _make_row
