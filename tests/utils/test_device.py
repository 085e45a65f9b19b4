"""trainer.device resolution."""

from __future__ import annotations

import pytest
import torch

from verl.utils.device import resolve_device


def test_cpu_and_auto():
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected


def test_cuda_without_cuda_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"trainer\.device=cuda but torch\.cuda\.is_available"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="expected 'auto', 'cpu' or 'cuda'"):
        resolve_device("tpu")
