"""Fixtures for the rollout tests: a tiny random Qwen2 with varied outputs and prompt batches."""

from __future__ import annotations

import pytest
import torch

from verl.protocol import DataProto

from .token_versions import tiny_tokenizer, varied_tiny_model

PROMPTS = [
    "1+2=",
    "what is the sum of 3 and 4? the answer is",
    "hello",
    "the cat has 5 apples and the dog has",
]


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
    """Tiny models are overhead-bound: on a shared 2-core machine two OpenMP threads spin
    against other processes and run these tests ~10x slower than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tokenizer(pytestconfig):
    return tiny_tokenizer(pytestconfig)


@pytest.fixture(scope="session")
def model(tokenizer):
    """hidden 64, 2 layers, eos = <|im_end|> (id 2), pad id 0, varied weights
    (:func:`tests.rollout.token_versions.varied`)."""
    return varied_tiny_model(tokenizer)


def make_batch(tokenizer, texts: list[str], **non_tensors) -> DataProto:
    """Left-padded prompt batch in the dataset layout, with a ``uid`` per prompt."""
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
    non = {"uid": [f"u{i}" for i in range(len(texts))], **non_tensors}
    return DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": position_ids,
        },
        non_tensors=non,
        meta_info={"step": 7},
    )


@pytest.fixture
def batch(tokenizer) -> DataProto:
    return make_batch(tokenizer, PROMPTS)
