"""vLLM checks in a child process, as the vLLM tests run them: vLLM's start-up configures
and seeds the whole process, so each engine check gets a fresh interpreter with one OpenMP
thread and the repository on ``PYTHONPATH``; a check script prints its result as a JSON
object on its last line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def child_env(drop: Sequence[str] = ()) -> dict[str, str]:
    """This process's environment with one OpenMP thread and the repository importable,
    without the variables named in ``drop``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    for name in drop:
        env.pop(name, None)
    return env


def run_child(
    args: Sequence[str], timeout: float, cwd: Path, drop_env: Sequence[str] = ()
) -> subprocess.CompletedProcess:
    """``python *args`` in ``cwd`` with :func:`child_env`; asserts that it exited 0 (its
    stderr's tail in the message)."""
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=child_env(drop_env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def last_json(proc: subprocess.CompletedProcess) -> dict[str, Any]:
    """The JSON object on the last line of a check script's output."""
    return json.loads(proc.stdout.strip().splitlines()[-1])
