"""``scripts/multinode.sh submit``: the job each trainer's submission runs (``ray`` is a
stand-in on PATH that prints its arguments; real machines are not available to tests)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "multinode.sh"


def _submit(tmp_path: Path, trainer: str | None) -> subprocess.CompletedProcess:
    fake = tmp_path / "ray"
    fake.write_text('#!/bin/sh\necho "ray $*"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "PYTHON": "python3"}
    env.pop("VERL_TRAINER", None)
    if trainer is not None:
        env["VERL_TRAINER"] = trainer
    return subprocess.run(
        ["bash", str(SCRIPT), "submit", "trainer.nnodes=2", "trainer.n_gpus_per_node=8"],
        env=env,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize(
    "trainer, job",
    [
        (None, "python3 -m verl.trainer.main_ppo trainer.backend=ray trainer.ray_address=auto"),
        ("sft", "python3 -m verl.trainer.main_sft trainer.ray_address=auto"),
        ("dpo", "python3 -m verl.trainer.main_dpo trainer.ray_address=auto"),
    ],
)
def test_submit_runs_the_trainers_entry_point_on_the_cluster(tmp_path, trainer, job):
    done = _submit(tmp_path, trainer)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "ray job submit --address=http://127.0.0.1:8265 -- "
        f"{job} trainer.nnodes=2 trainer.n_gpus_per_node=8"
    )


def test_submit_refuses_an_unknown_trainer(tmp_path):
    done = _submit(tmp_path, "grpo")
    assert done.returncode == 2
    assert "VERL_TRAINER=grpo: use ppo, sft or dpo" in done.stderr
    assert done.stdout == ""
