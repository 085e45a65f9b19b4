"""Fixtures of the config tests: a working directory with real data files."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def data_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """``(train, val)`` file names that exist, relative to a fresh working directory."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.jsonl").write_text('{"prompt": "1+1="}\n')
    (tmp_path / "val.jsonl").write_text('{"prompt": "2+2="}\n')
    return "train.jsonl", "val.jsonl"
