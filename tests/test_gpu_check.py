"""scripts/gpu_check.sh, the device check, runs in its CPU mode here so that it cannot rot:
every check reports pass (or skip where the device is the CPU) and the JSON says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "gpu_check.json"
    run = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu_check.sh"), "--device", "cpu", "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": sys.executable},
    )
    return run, (json.loads(out.read_text()) if out.exists() else {})


def test_the_device_checks_pass_on_the_cpu(tmp_path):
    only = ["autocast_step", "fsdp2_mesh", "fp8_weight_only", "native_rollout", "device_vs_cpu"]
    run, report = _run(tmp_path, "--only", *only)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    checks = report["checks"]
    assert list(checks) == only
    assert {k: v["status"] for k, v in checks.items()} == {
        **{k: "pass" for k in only},
        "device_vs_cpu": "skip",
    }
    assert checks["fsdp2_mesh"]["backend"] == "gloo"
    assert checks["fsdp2_mesh"]["grad_max_diff"] <= 1e-5
    assert checks["native_rollout"]["greedy_equals_generate"] is True
    assert checks["autocast_step"]["last_loss"] < checks["autocast_step"]["first_loss"]
    assert "| fsdp2_mesh | pass |" in run.stdout


def test_a_bad_argument_is_refused_before_any_check(tmp_path):
    run, report = _run(tmp_path, "--only", "fsdp3")
    assert run.returncode == 2 and report == {}
    assert "unknown checks ['fsdp3']" in run.stderr


@pytest.mark.slow
def test_grpo_learns_on_the_cpu_through_the_device_check(tmp_path):
    run, report = _run(tmp_path, "--only", "grpo_learns", "--steps", "30")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = report["checks"]["grpo_learns"]
    assert result["status"] == "pass"
    assert result["reward_last5"] >= result["reward_first5"] + 0.3
