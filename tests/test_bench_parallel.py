"""bench/bench_parallel.py in its tiny mode (a 64-wide Qwen2, 2 sequences of 128 tokens, 2
gloo ranks; ~15 s): the table has a row per configuration, every configuration takes the
same update, and the counted bytes per rank are the sharded ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_parallel.py"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("bench_parallel") / "result.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--tiny", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout


def _rows(tiny) -> dict[str, dict]:
    (workload,) = tiny[0]["workloads"]
    return {row["name"]: row for row in workload["rows"]}


def test_table_has_a_row_per_configuration(tiny):
    table = tiny[1].split("\n\n", 1)[1].splitlines()
    names = [line.split("|")[1].strip() for line in table[3:]]
    assert names == ["one", "data=2", "sequence=2", "tensor=2"]
    assert "| data=2 | 2 |" in table[4] and table[4].endswith("| 1.00x | 1.00x | 1.00x | 1.00x |")
    assert set(_rows(tiny)) == set(names)


def test_every_configuration_takes_the_same_update(tiny):
    rows = _rows(tiny)
    norm = rows["one"]["grad_norm"]
    assert norm > 0
    for name, row in rows.items():
        assert row["grad_norm"] == pytest.approx(norm, rel=1e-4), name
        assert len(row["ranks"]) == row["processes"] == (1 if name == "one" else 2)
    # data ranks split the rows; sequence and tensor ranks all take both
    assert [r["rows"] for r in rows["data=2"]["ranks"]] == [1, 1]
    assert [r["rows"] for r in rows["tensor=2"]["ranks"]] == [2, 2]


def test_counted_state_is_the_local_shards(tiny):
    rows = _rows(tiny)
    one = rows["one"]["per_rank"]
    for name in ("data=2", "sequence=2", "tensor=2"):
        ranks = rows[name]["ranks"]
        for rank in ranks:
            # each rank holds half the weights: FSDP2's shard, or the tensor split (only the
            # norms' few weights are whole on both tensor ranks)
            assert 0.49 < rank["params_mib"] / one["params_mib"] < 0.52, (name, rank)
            assert rank["grads_mib"] == pytest.approx(rank["params_mib"])
            # AdamW: two moments per weight (plus a step counter per tensor)
            assert rank["optim_mib"] == pytest.approx(2 * rank["params_mib"], rel=0.01)
    assert rows["one"]["vs_data"]["state_mib"] == pytest.approx(2.0, rel=0.01)
    assert one["grads_mib"] == pytest.approx(one["params_mib"])
    for row in rows.values():
        assert row["per_rank"]["peak_mib"] > row["per_rank"]["state_mib"] > 0
