"""The sandbox's disk bounds: a quota on the run's directory (``RLIMIT_FSIZE`` bounds one
file; a program writing many files filled 1.5 GB of the host's temp directory in 5 s), and
no directory left behind by a trainer killed mid-run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl.rewards import sandbox_dirs
from verl.rewards.sandbox import run_python
from verl.rewards.sandbox_dirs import clean_stale_dirs

FILL = """
block = b"x" * (512 * 1024)  # each file under RLIMIT_FSIZE
for n in range(1, 801):      # 400 MB in all
    with open(f"f{n}", "wb") as f:
        f.write(block)
    print(n, flush=True)
"""


def _run_dirs(pid: int) -> list[Path]:
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    return [p for p in tmp.iterdir() if p.name.startswith(f"verl-sandbox-{_ns()}-{pid}-")]


def _ns() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def test_a_program_filling_its_directory_is_killed_at_the_quota():
    result = run_python(FILL, timeout_s=30, max_disk_bytes=8 << 20)
    assert result.status == "output_limit"
    assert "max_disk_bytes=8388608" in result.stderr
    written = int(result.stdout.split()[-1])
    assert written < 800  # stopped long before its 400 MB (one poll interval past 8 MB)
    assert _run_dirs(os.getpid()) == []  # and its directory is gone
    # a run within the quota is untouched
    ok = run_python("open('a', 'wb').write(b'x' * 100_000); print('ok')", max_disk_bytes=1 << 20)
    assert ok.status == "ok" and ok.stdout.strip() == "ok"


def test_a_program_making_too_many_files_is_killed():
    code = "for n in range(100_000):\n    open(f'f{n}', 'w').close()\nprint('all')"
    result = run_python(code, timeout_s=30)
    assert result.status == "output_limit" and "more than 4096 files" in result.stderr


def test_bad_quota_is_refused():
    with pytest.raises(ValueError, match="max_disk_bytes=0"):
        run_python("pass", max_disk_bytes=0)


TRAINER = """
import sys
from verl.rewards.sandbox import run_python
print("started", flush=True)
run_python("import time; time.sleep(120)", timeout_s=120)
"""


def test_directories_of_a_trainer_killed_mid_run_are_removed_at_the_next_start(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", TRAINER], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 60
        while not _run_dirs(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _run_dirs(child.pid), "the child's run never started"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    left = _run_dirs(child.pid)
    assert left  # SIGKILL left it behind (the sandbox itself died with the trainer)
    # a live trainer's directory and unrelated names are kept
    mine = Path(os.environ.get("TMPDIR", "/tmp")) / f"verl-sandbox-{_ns()}-{os.getpid()}-keep"
    mine.mkdir()
    try:
        removed = clean_stale_dirs()
        assert set(map(str, left)) <= set(removed)
        assert not any(p.exists() for p in left) and mine.exists()
    finally:
        mine.rmdir()


def test_clean_stale_dirs_removes_unreadable_leftovers(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    pid = int(dead.stdout)
    stale = tmp_path / f"verl-sandbox-{_ns()}-{pid}-abc"
    (stale / "locked" / "deep").mkdir(parents=True)
    (stale / "locked" / "deep" / "file").write_text("x")
    (stale / "locked").chmod(0)
    other_ns = tmp_path / f"verl-sandbox-{_ns() + 1}-{pid}-abc"  # another PID namespace's
    other_ns.mkdir()
    assert clean_stale_dirs(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and other_ns.exists()
    assert sandbox_dirs._DIR_RE.match(Path(sandbox_dirs.dir_prefix() + "x").name)
