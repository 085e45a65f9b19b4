"""bench/bench_memory_phases.py without training: arguments, the table, and the phase
sampler on a real forked child (its private memory counts in the phase's peak)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
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


_SAMPLER_SCRIPT = """
import json, multiprocessing as mp, sys, time
sys.path.insert(0, sys.argv[1])
import bench_memory_phases as phases

def hold(mib):
    block = bytearray(mib * 1024 * 1024)
    block[::4096] = b"x" * len(block[::4096])  # its pages are the child's own
    time.sleep(1.0)

if __name__ == "__main__":
    sampler = phases.PhaseSampler(interval_s=0.01, children_interval_s=0.05)
    time.sleep(0.1)
    sampler.enter("child")
    proc = mp.get_context("fork").Process(target=hold, args=(64,))
    proc.start()
    proc.join()
    sampler.enter("after")
    time.sleep(0.1)
    record = sampler.close()
    print(json.dumps({"exitcode": proc.exitcode, **record}))
"""


def test_sampler_counts_a_forked_childs_private_memory():
    # in a fresh process: the test process's own children (a Ray session) would count too
    out = subprocess.run(
        [sys.executable, "-c", _SAMPLER_SCRIPT, str(BENCH)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    record = json.loads(out.stdout.strip().splitlines()[-1])
    assert record["exitcode"] == 0
    peaks = record["peak_mib"]
    assert peaks["child"] >= peaks["start"] + 60
    assert peaks["after"] < peaks["child"] - 50  # the ended child no longer counts
    assert record["marks_mib"][-1][0] == "end"
