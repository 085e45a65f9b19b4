"""The run directories of the code sandbox (`verl.rewards.sandbox`): names, the disk quota
while a run lasts, and removal of those that killed trainers left behind.

Contract: a run's directory is named ``verl-sandbox-<pid namespace>-<trainer pid>-...``
(`dir_prefix`), so that `clean_stale_dirs` can tell the directories of trainers of this
PID namespace that no longer run from those of live ones (and of other namespaces, which
it leaves alone); `clean_stale_dirs_once` does that the first time a process runs code.
`wait_within_quota` waits for a run's process while measuring its directory every
`DISK_POLL_S` seconds against `max_disk_bytes` (allocated bytes) and
`DEFAULT_MAX_DISK_FILES` entries (`over_quota`), and says which came first. Nothing here
kills a process: the caller does.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import select
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_DISK_BYTES",
    "DEFAULT_MAX_DISK_FILES",
    "DISK_POLL_S",
    "clean_stale_dirs",
    "clean_stale_dirs_once",
    "dir_prefix",
    "over_quota",
    "wait_within_quota",
]

DEFAULT_MAX_DISK_BYTES = 64 << 20  # allocated bytes of the run's directory
DEFAULT_MAX_DISK_FILES = 4096  # files and directories in it
DISK_POLL_S = 0.02  # how often the directory is measured while the run lasts
_DIR_RE = re.compile(r"^verl-sandbox-([0-9]+)-([0-9]+)-")


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def dir_prefix() -> str:
    """Prefix of this process's run directories: ``verl-sandbox-<pid ns>-<pid>-``."""
    return f"verl-sandbox-{_pid_namespace()}-{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _remove_tree(path: str) -> None:
    """``shutil.rmtree`` that also removes what a program made unreadable (``chmod 0``)."""

    def retry(func: Callable[..., object], target: str, _exc: object) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(target), stat.S_IRWXU)
            if os.path.isdir(target) and not os.path.islink(target):
                os.chmod(target, stat.S_IRWXU)
                shutil.rmtree(target, ignore_errors=True)
            else:
                func(target)

    shutil.rmtree(path, onerror=retry)


def clean_stale_dirs(root: str | None = None) -> list[str]:
    """Remove the run directories (under ``root``, default the temp directory) of trainers
    of this PID namespace that no longer run; a process killed mid-run (SIGKILL) left them.
    Returns the paths removed. Called once per process, by its first run."""
    root = root or tempfile.gettempdir()
    namespace, removed = _pid_namespace(), []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        match = _DIR_RE.match(entry.name)
        if match is None or int(match[1]) != namespace or not entry.is_dir(follow_symlinks=False):
            continue
        pid = int(match[2])
        if pid == os.getpid() or _alive(pid):
            continue
        _remove_tree(entry.path)
        if not os.path.exists(entry.path):
            removed.append(entry.path)
    if removed:
        logger.info(
            "code sandbox: removed %d directories of dead runs under %s", len(removed), root
        )
    return removed


@functools.lru_cache(maxsize=1)
def clean_stale_dirs_once() -> None:
    """:func:`clean_stale_dirs` of the temp directory, the first time only (per process)."""
    clean_stale_dirs()


def over_quota(path: str, max_bytes: int, max_files: int) -> str | None:
    """Why the directory ``path`` is over its quota (allocated bytes, entries), or None.
    Stops as soon as it is over; a directory it cannot read counts as over."""
    total = files = 0
    stack = [path]
    while stack:
        try:
            scan = os.scandir(stack.pop())
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"a directory could not be measured ({exc.strerror})"
        with scan:
            for entry in scan:
                files += 1
                try:
                    info = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                total += info.st_blocks * 512
                if stat.S_ISDIR(info.st_mode):
                    stack.append(entry.path)
                if total > max_bytes:
                    return f"its files passed max_disk_bytes={max_bytes}"
                if files > max_files:
                    return f"it made more than {max_files} files"
    return None


def wait_within_quota(
    proc: subprocess.Popen, timeout_s: float, workdir: str, max_disk_bytes: int
) -> tuple[bool, str | None]:
    """Wait up to `timeout_s` for `proc` to exit, measuring `workdir` every `DISK_POLL_S`:
    ``(exited, why the directory is over its quota or None)``; it stops at the first.

    Through a pidfd where the kernel has them: `Popen.wait(timeout=...)` polls with a
    doubling sleep (0.5 ms ... 50 ms), so a 33 ms run was noticed only after ~64 ms.
    """
    deadline = time.monotonic() + timeout_s
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        while (left := deadline - time.monotonic()) > 0:
            step = min(left, DISK_POLL_S)
            if pidfd is not None:
                if select.select([pidfd], [], [], step)[0]:
                    return True, None
            else:
                try:
                    proc.wait(timeout=step)
                    return True, None
                except subprocess.TimeoutExpired:
                    pass
            over = over_quota(workdir, max_disk_bytes, DEFAULT_MAX_DISK_FILES)
            if over is not None:
                return False, over
        return proc.poll() is not None, None
    finally:
        if pidfd is not None:
            os.close(pidfd)
