"""The entry points make torch's OpenMP threads sleep when they wait (verl/utils/omp_wait.py):
the rule on a fake environment, and the OpenMP runtime of a real entry-point process (GNU
OpenMP prints its settings with ``OMP_DISPLAY_ENV=verbose``: a passive wait spins 0 times)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from verl.utils.omp_wait import PASSIVE, WAIT_POLICY_ENV, prefer_passive_wait


def test_sets_passive_when_unset_and_torch_not_loaded():
    env: dict[str, str] = {}
    assert prefer_passive_wait(env, modules={}) is True
    assert env == {WAIT_POLICY_ENV: PASSIVE}


@pytest.mark.parametrize("value", ["ACTIVE", "passive", ""])
def test_the_users_value_stands(value):
    env = {WAIT_POLICY_ENV: value}
    assert prefer_passive_wait(env, modules={}) is False
    assert env == {WAIT_POLICY_ENV: value}


def test_nothing_is_set_once_torch_is_loaded():
    env: dict[str, str] = {}
    assert prefer_passive_wait(env, modules={"torch": object()}) is False
    assert env == {}


def _runtime_spin_count(entry: str, policy: str | None) -> str:
    """GOMP_SPINCOUNT as the OpenMP runtime of a process that imports ``entry`` (an entry
    module), then torch, reports it."""
    env = {k: v for k, v in os.environ.items() if k not in (WAIT_POLICY_ENV, "GOMP_SPINCOUNT")}
    if policy is not None:
        env[WAIT_POLICY_ENV] = policy
    env["OMP_DISPLAY_ENV"] = "verbose"
    code = f"import {entry}\nimport torch\ntorch.ones(64, 64) @ torch.ones(64, 64)\n"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stderr.splitlines() if "GOMP_SPINCOUNT" in line]
    if not lines:
        pytest.skip("torch's OpenMP runtime is not GNU OpenMP (no GOMP_SPINCOUNT shown)")
    return lines[0].split("=", 1)[1].strip().strip("'")


# main_ppo: the usual entry; sft_trainer imports torch itself, after verl.cli
@pytest.mark.parametrize("entry", ["verl.trainer.main_ppo", "verl.trainer.sft_trainer"])
def test_an_entry_point_process_waits_passively(entry):
    assert _runtime_spin_count(entry, None) == "0"


def test_an_entry_point_keeps_the_users_policy():
    assert _runtime_spin_count("verl.trainer.main_ppo", "ACTIVE") != "0"
