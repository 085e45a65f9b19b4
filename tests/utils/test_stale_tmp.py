"""`verl.utils.stale_tmp`: which owned temporary directories count as stale."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from verl.utils.stale_tmp import (
    OWNER_FILE,
    make_owned_tmpdir,
    owned_tmpdir,
    remove_stale_tmpdirs,
)

PREFIX = "verl-test-model-"


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _dir(root: Path, pid: int, owner: str | None, age_s: float = 0.0) -> Path:
    path = root / f"{PREFIX}{pid}-abc{len(list(root.iterdir()))}"
    path.mkdir()
    (path / "config.json").write_text("{}")
    if owner is not None:
        (path / OWNER_FILE).write_text(owner)
    if age_s:
        old = time.time() - age_s
        os.utime(path, (old, old))
    return path


def test_only_the_directories_of_dead_owners_on_this_host_go(tmp_path):
    host, dead = socket.gethostname(), _dead_pid()
    gone = _dir(tmp_path, dead, f"{host} {dead}\n")
    unowned_old = _dir(tmp_path, dead, None, age_s=120)
    kept = [
        _dir(tmp_path, os.getpid(), f"{host} {os.getpid()}\n"),  # alive: this process
        _dir(tmp_path, 1, f"{host} 1\n"),  # alive: init
        _dir(tmp_path, dead, f"another-host {dead}\n"),  # a /tmp shared with another host
        _dir(tmp_path, dead, None),  # no owner file yet, just created
    ]
    other = tmp_path / "verl-test-model-notapid"
    other.mkdir()
    made = Path(make_owned_tmpdir(PREFIX, tmp_path))
    assert made.name.startswith(f"{PREFIX}{os.getpid()}-")
    assert (made / OWNER_FILE).read_text() == f"{host} {os.getpid()}\n"
    removed = remove_stale_tmpdirs(PREFIX, tmp_path)
    assert sorted(removed) == sorted([str(gone), str(unowned_old)])
    assert not gone.exists() and not unowned_old.exists()
    assert all(p.is_dir() for p in [*kept, other, made])
    assert remove_stale_tmpdirs(PREFIX, tmp_path / "missing") == []


def test_a_killed_owners_directory_is_removed_and_a_live_ones_kept(tmp_path):
    code = (
        "import sys, time\n"
        "from verl.utils.stale_tmp import make_owned_tmpdir\n"
        "print(make_owned_tmpdir(sys.argv[1], sys.argv[2]), flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, PREFIX, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        left = Path(child.stdout.readline().strip())
        assert left.is_dir()
        assert remove_stale_tmpdirs(PREFIX, tmp_path) == []  # its owner runs
    finally:
        child.kill()  # SIGKILL: no cleanup runs
        child.wait()
        child.stdout.close()
    assert left.is_dir()
    assert remove_stale_tmpdirs(PREFIX, tmp_path) == [str(left)]
    with owned_tmpdir(PREFIX, tmp_path) as path:
        assert Path(path).is_dir()
    assert list(tmp_path.iterdir()) == []
