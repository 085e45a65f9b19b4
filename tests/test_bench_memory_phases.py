"""bench/bench_memory_phases.py without training: arguments, the table, and the phase
sampler on a real forked child (its private memory counts in the phase's peak)."""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def phases():
    sys.path.insert(0, str(BENCH))  # the bench imports `from _common import ...`
    try:
        spec = importlib.util.spec_from_file_location(
            "bench_memory_phases", BENCH / "bench_memory_phases.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


def test_arguments(phases):
    args = phases.parse_args(["--workload", "W3", "--override", "trainer.mixed_precision=auto"])
    assert (args.workload, args.steps, args.override) == ("W3", 3, ["trainer.mixed_precision=auto"])
    for bad in (["--steps", "0"], ["--override", "no_equals_sign"], ["stray=1"]):
        with pytest.raises(SystemExit):
            phases.parse_args(bad)
    # the child takes main_ppo's overrides as they come
    assert phases.parse_args(["--child", "x.json", "a.b=1"]).rest == ["a.b=1"]


def test_table_lists_marks_then_phase_peaks_with_cpu_time(phases):
    record = {
        "marks_mib": [["import torch", 219], ["step 1 update_actor", 450]],
        "peak_mib": {"step 1 gen": 466, "step 1 update_actor": 626},
        "cpu_s": {"step 1 update_actor": 5.5},
    }
    lines = phases.format_phases(record).splitlines()
    assert lines[1].split() == ["import", "torch", "219"]
    assert lines[-2].split() == ["step", "1", "gen", "466"]
    assert lines[-1].split() == ["step", "1", "update_actor", "626", "5.50"]


def _hold_memory(mib: int, seconds: float) -> None:
    block = bytearray(mib * MiB)  # zero-filled: its pages are the child's own
    block[::4096] = b"x" * len(block[::4096])
    time.sleep(seconds)


def test_sampler_counts_a_forked_childs_private_memory(phases):
    sampler = phases.PhaseSampler(interval_s=0.01, children_interval_s=0.05)
    try:
        time.sleep(0.1)
        sampler.enter("child")
        proc = mp.get_context("fork").Process(target=_hold_memory, args=(64, 1.0))
        proc.start()
        proc.join()
        sampler.enter("after")
        time.sleep(0.1)
    finally:
        record = sampler.close()
    assert proc.exitcode == 0
    assert record["peak_mib"]["child"] >= record["peak_mib"]["start"] + 60
    assert record["peak_mib"]["after"] < record["peak_mib"]["child"] - 50
    assert record["marks_mib"][-1][0] == "end"
