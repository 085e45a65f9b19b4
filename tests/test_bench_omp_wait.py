"""bench/bench_omp_wait.py: each policy's child environment, the paired ratios and the table
on fake runs, and one real run of the tiny model (each child really ran under its policy)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_omp_wait.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_omp_wait", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_child_env_replaces_every_wait_setting(bench):
    base = {"PATH": "/bin", "OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "5"}
    assert bench.child_env("default", base) == {"PATH": "/bin"}
    assert bench.child_env("passive", base) == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}
    assert bench.child_env("spin10k", base) == {"PATH": "/bin", "GOMP_SPINCOUNT": "10000"}
    with pytest.raises(ValueError, match="policy must be one of"):
        bench.child_env("sleepy", base)


def _run(condition, policy, update, decode):
    secs = {"update": update, "decode": decode}
    return {"condition": condition, "policy": policy, "seconds": secs, "cpu_seconds": secs}


def test_summary_pairs_each_round_against_the_default(bench):
    runs = [
        _run("idle", "default", 1.0, 2.0),
        _run("idle", "passive", 1.0, 1.0),
        _run("idle", "default", 3.0, 2.0),
        _run("idle", "passive", 1.0, 4.0),
        _run("busy", "default", 8.0, 8.0),
        _run("busy", "passive", 2.0, 1.0),
    ]
    rows = bench.summarize(runs, ["default", "passive"])
    by = {(r["condition"], r["phase"]): r for r in rows}
    assert by["idle", "update"]["default_over"]["passive"] == pytest.approx(2.0)  # 1/1, 3/1
    assert by["idle", "decode"]["default_over"]["passive"] == pytest.approx(1.25)  # 2/1, 2/4
    assert by["busy", "decode"]["default_over"]["passive"] == pytest.approx(8.0)
    assert by["idle", "update"]["seconds"] == {"default": 2.0, "passive": 1.0}
    text = bench.table(rows, ["default", "passive"])
    assert "| busy | update | 8.000 (8.000) | 2.000 (2.000) | 4.00 |" in text


def test_a_condition_without_every_policy_is_left_out(bench):
    runs = [_run("idle", "default", 1.0, 1.0)]
    assert bench.summarize(runs, ["default", "passive"]) == []


@pytest.mark.slow
def test_tiny_run_measures_each_policy_in_its_own_child(tmp_path):
    out = tmp_path / "omp.json"
    cmd = [sys.executable, str(BENCH), "--tiny", "--repeats", "1", "--reps", "1"]
    cmd += ["--conditions", "idle", "--decode-steps", "2", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    waits = {r["policy"]: r["wait_env"] for r in result["runs"]}
    assert waits == {
        "default": {},
        "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
        "spin10k": {"GOMP_SPINCOUNT": "10000"},
    }
    assert {(r["condition"], r["phase"]) for r in result["summary"]} == {
        ("idle", "update"),
        ("idle", "decode"),
    }
    assert all(t > 0 for r in result["runs"] for t in r["seconds"].values())
    assert "| idle | decode |" in proc.stdout
