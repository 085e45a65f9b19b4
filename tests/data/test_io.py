"""write_records / read_records round trips keep every key of every row."""

from __future__ import annotations

import pytest

from verl.data.io import read_records, write_records


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_keys_missing_from_the_first_row_are_kept(tmp_path, suffix):
    rows = [{"prompt": "a"}, {"prompt": "b", "extra": 3}]
    path = write_records(rows, tmp_path / f"rows{suffix}")
    back = [record.data for record in read_records(path).records]
    assert [r["prompt"] for r in back] == ["a", "b"]
    assert back[1]["extra"] == 3
    assert back[0].get("extra") is None
