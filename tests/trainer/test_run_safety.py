"""One writer per run directory, verified checkpoints, honest logs after a resume.

Each test here reproduces a finding of the reliability review (issue 20) that the run lock,
the manifest checksums, the metric-log rewind or the directory checks now prevent.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from verl.trainer.lifecycle.checkpoint import (
    LATEST_FILE,
    CheckpointError,
    CheckpointManager,
    complete_checkpoints,
    read_manifest,
)
from verl.trainer.lifecycle.run_lock import LOCK_FILE, RunDirectoryInUse, RunLock
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl.trainer import RLTrainer

SAVE_EVERY_STEP = (
    "trainer.save_freq=1",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
)


# ---------------------------------------------------------------------- the run lock


def test_second_lock_on_a_directory_names_the_holder(tmp_path):
    first = RunLock([tmp_path, tmp_path / "."])  # one directory, named twice
    with first:
        holder = json.loads((tmp_path / LOCK_FILE).read_text())
        assert holder["pid"] == os.getpid()
        with pytest.raises(RunDirectoryInUse, match=f"pid {os.getpid()} on host"):
            RunLock([tmp_path]).acquire()
        with first:  # re-entrant for its own holder
            pass
        assert first.held
    assert (tmp_path / LOCK_FILE).read_text() == ""  # released: description erased
    with RunLock([tmp_path]):
        pass


_HOLD = """
import sys, time
from verl.trainer.lifecycle.run_lock import RunLock
lock = RunLock([sys.argv[1]])
lock.acquire()
print("locked", flush=True)
time.sleep(600)
"""


def test_lock_of_a_killed_process_is_taken_over_with_a_warning(tmp_path, caplog):
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirectoryInUse, match=f"pid {child.pid} "):
            RunLock([tmp_path]).check()
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        child.kill()
        child.wait()
    with (
        caplog.at_level(logging.WARNING, logger="verl.trainer.lifecycle.run_lock"),
        RunLock([tmp_path]),
    ):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert f"pid {child.pid} on host" in caplog.text and "taking over" in caplog.text


def test_forked_child_does_not_keep_the_lock(tmp_path):
    lock = RunLock([tmp_path])
    lock.acquire()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a long-lived forked child, like a reward worker
        os.write(ready_w, b"1")  # the at-fork hooks have run when fork() returns here
        time.sleep(30)
        os._exit(0)
    try:
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"1"
        lock.release()
        RunLock([tmp_path]).check()  # free although the child still runs
    finally:
        os.close(ready_r)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_trainer_refuses_a_directory_another_run_holds(rl_config, tmp_path):
    with RunLock([tmp_path]), pytest.raises(RunDirectoryInUse, match="in use by another run"):
        RLTrainer(rl_config())


def test_unwritable_output_directory_is_named_before_loading(rl_config):
    with pytest.raises(ValueError, match=r"trainer.default_local_dir='/dev/full/ck' is not a"):
        RLTrainer(rl_config("trainer.default_local_dir=/dev/full/ck"))


# ---------------------------------------------------------------------- verified checkpoints


def _damage(path: Path, offset: int = 4096, size: int = 64) -> None:
    """Overwrite ``size`` bytes in place: the file keeps its size."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        data = fh.read(size)
        fh.seek(offset)
        fh.write(bytes(b ^ 0xFF for b in data))


@pytest.mark.slow
def test_damaged_newest_checkpoint_is_set_aside_and_resume_falls_back(rl_config, tmp_path, caplog):
    RLTrainer(rl_config(*SAVE_EVERY_STEP)).fit()
    newest = tmp_path / "global_step_2"
    weights = newest / "actor" / "model.safetensors"
    _damage(weights)
    read_manifest(newest)  # sizes still match: only the checksum finds it
    with pytest.raises(CheckpointError, match=r"actor/model.safetensors: CRC-32 [0-9a-f]{8}"):
        read_manifest(newest, verify=True)

    with caplog.at_level(logging.WARNING, logger="verl.trainer.lifecycle.checkpoint"):
        resumed = RLTrainer(rl_config(*SAVE_EVERY_STEP, "trainer.total_training_steps=3"))
        resumed.fit()
    assert resumed.resumed_from == tmp_path / "global_step_1"
    aside = [p.name for p in tmp_path.iterdir() if p.name.startswith("global_step_2.damaged-")]
    assert len(aside) == 1, aside
    assert "actor/model.safetensors" in caplog.text and aside[0] in caplog.text
    # the continuation wrote fresh step-2 and step-3 checkpoints next to the damaged one
    assert [p.name for _, p in complete_checkpoints(tmp_path)] == [
        "global_step_1",
        "global_step_2",
        "global_step_3",
    ]
    read_manifest(tmp_path / "global_step_3", verify=True)


@pytest.mark.slow
def test_resume_path_to_a_damaged_checkpoint_is_refused(rl_config, tmp_path):
    RLTrainer(rl_config(*SAVE_EVERY_STEP, "trainer.total_training_steps=1")).fit()
    step1 = tmp_path / "global_step_1"
    _damage(next((step1 / "actor").glob("*.safetensors")))
    trainer = RLTrainer(
        rl_config(
            *SAVE_EVERY_STEP,
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={step1}",
            f"trainer.default_local_dir={tmp_path / 'other'}",
        )
    )
    with pytest.raises(CheckpointError, match="is damaged: 1 file"):
        trainer.fit()
    assert step1.is_dir()  # an explicitly named checkpoint is reported, not moved


@pytest.mark.slow
def test_checkpoint_of_another_experiment_is_not_resumed(rl_config, tmp_path):
    RLTrainer(rl_config(*SAVE_EVERY_STEP, "trainer.experiment_name=first")).fit()
    second = RLTrainer(rl_config(*SAVE_EVERY_STEP, "trainer.experiment_name=second"))
    with pytest.raises(CheckpointError, match=r"trainer\.experiment_name: checkpoint 'first'"):
        second.fit()


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
    )
    return done.returncode == 0


@pytest.mark.slow
def test_real_full_disk_during_a_save(rl_config, tmp_path):
    disk = tmp_path / "small_disk"
    if not _mount_tmpfs(disk, "1m"):
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN)")
    try:
        trainer = RLTrainer(
            rl_config(
                *SAVE_EVERY_STEP,
                "trainer.total_training_steps=1",
                f"trainer.default_local_dir={disk}",
                f"trainer.log_dir={tmp_path / 'logs'}",
            )
        )
        with pytest.raises(CheckpointError) as err:
            trainer.fit()
        message = str(err.value)
        assert "saving checkpoint global_step_1" in message
        assert "the disk is full" in message and "no complete checkpoint exists yet" in message
        assert sorted(p.name for p in disk.iterdir()) == [LOCK_FILE]  # partial save removed
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


# ---------------------------------------------------------------------- logs after a resume


def test_jsonl_rewind_drops_rolled_back_and_torn_rows(tmp_path):
    tracker = Tracker(["jsonl"], log_dir=tmp_path)
    for step in (1, 2, 3):
        tracker.log({"x": float(step)}, step=step)
    tracker.close()
    path = tmp_path / "metrics.jsonl"
    with open(path, "a") as fh:
        fh.write('{"step": 4, "x"')  # a kill in the middle of a write
    tracker = Tracker(["jsonl"], log_dir=tmp_path)
    tracker.rewind(2)
    tracker.log({"x": 30.0}, step=3)
    tracker.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["step"], r["x"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 30.0)]


class _Crash(RuntimeError):
    pass


@pytest.mark.slow
def test_resumed_run_logs_one_row_per_step(rl_config, tmp_path):
    cfg = rl_config(
        "trainer.total_training_steps=4",
        "trainer.save_freq=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
    )
    first = RLTrainer(cfg)
    real = first.train_step

    def crash_at_4(*args: Any, **kwargs: Any) -> dict[str, Any]:
        if first.global_step >= 4:  # step 3 is logged, its checkpoint never written
            raise _Crash
        return real(*args, **kwargs)

    first.train_step = crash_at_4
    with pytest.raises(_Crash):
        first.fit()
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").open()]
    assert steps == [1, 2, 3]
    assert (tmp_path / LATEST_FILE).read_text().strip() == "2"

    second = RLTrainer(cfg)
    second.fit()
    assert second.resumed_from == tmp_path / "global_step_2"
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert [r["step"] for r in rows if "actor/pg_loss" in r] == [1, 2, 3, 4]


def test_newest_verified_on_a_missing_directory(tmp_path):
    assert CheckpointManager(tmp_path / "nothing").newest_verified() is None
