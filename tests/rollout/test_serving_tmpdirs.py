"""A serving engine's model directory (``verl-vllm-model-<pid>-*``) names its process, and
starting an engine removes the ones that SIGKILLed runs left behind."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

# Starts an engine's model directory as vLLM's backend does (``_start_engine``; the engine
# itself is a stand-in), prints the directory, and with ``--wait`` waits to be killed.
ENGINE = """
import sys, tempfile, time
from pathlib import Path
from types import SimpleNamespace
from verl.rollout.serving import ServingRollout

class Engine(ServingRollout):
    engine_name, display_name, role = "vllm", "vLLM", "actor_rollout_ref"
    def generate(self, prompts, params):
        raise NotImplementedError

class Saves:
    def save_pretrained(self, path):
        Path(path, "config.json").write_text("{}")

def start():
    dirs = []
    engine = object.__new__(Engine)
    engine._start_engine(SimpleNamespace(config=Saves()), Saves(), lambda p: dirs.append(p))
    return engine, dirs[0]
"""


def test_an_engine_start_removes_the_model_dirs_of_killed_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ns: dict = {}
    exec(ENGINE, ns)  # the same stand-in in this process
    code = ENGINE + (
        "tempfile.tempdir = sys.argv[1]\n"
        "engine, path = start()\n"
        "print(path, flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        theirs = Path(child.stdout.readline().strip())
        assert theirs.name.startswith(f"verl-vllm-model-{child.pid}-")
        first, ours = ns["start"]()  # their owner is alive: kept
        assert theirs.is_dir() and Path(ours).is_dir()
    finally:
        child.kill()  # SIGKILL: its finalizer never runs
        child.wait()
        child.stdout.close()
    assert theirs.is_dir()
    second, newest = ns["start"]()
    assert not theirs.exists()  # removed at the next engine start
    assert Path(ours).is_dir() and Path(newest).is_dir()  # this process's own stay
    first._cleanup()
    second._cleanup()
    assert list(tmp_path.iterdir()) == []
