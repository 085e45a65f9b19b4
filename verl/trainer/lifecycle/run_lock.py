"""One writer per run directory: an exclusive lock on the checkpoint and log directories.

Two runs pointed at the same ``trainer.default_local_dir`` would overwrite each other's
``global_step_N`` and ``huggingface/`` directories, delete each other's in-progress saves and
interleave their metric rows. :class:`RunLock` prevents that: a run takes an exclusive
``flock`` on ``<dir>/.verl-run.lock`` in each of its directories for as long as it trains, and
writes who holds it (pid, host, start time, command) into the file. A second run gets
:class:`RunDirectoryInUse` naming the holder before it touches anything.

The lock is the kernel's (``fcntl.flock``), so it dies with its process: a run killed by
SIGKILL leaves no lock behind, only the holder's description in the file. The next run takes
the lock over and logs a WARNING naming the dead holder. On a network file system ``flock``
is as reliable as the server's locking (Linux NFS maps it to POSIX byte-range locks). Where
``fcntl`` does not exist (Windows) runs are not locked, with a warning.

The lock file is opened with ``O_NOFOLLOW`` and must be a regular file: a ``.verl-run.lock``
planted as a symbolic link (which would make the run truncate and overwrite the file it
points to), a directory, a FIFO or a device is refused with :class:`RunLockError` naming it,
and nothing is written.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import socket
import stat
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

__all__ = ["LOCK_FILE", "RunDirectoryInUse", "RunLock", "RunLockError"]

LOCK_FILE = ".verl-run.lock"

# Descriptors of the locks this process holds. A forked child (a reward worker) would share
# the lock through its copy of the descriptor and keep it alive after the run died, so each
# child closes its copies at once; exec'd children never get them (O_CLOEXEC).
_HELD_FDS: set[int] = set()


def _close_inherited_locks() -> None:
    for fd in _HELD_FDS:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD_FDS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited_locks)


class RunLockError(RuntimeError):
    """A run directory cannot be locked: its lock file is unusable, or another run holds it."""


class RunDirectoryInUse(RunLockError):
    """Another live process holds the lock of a run directory."""


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another process (it has not written its description yet)"
    return (
        f"pid {holder.get('pid')} on host {holder.get('host')}, running since "
        f"{holder.get('started')} ({holder.get('command', '?')})"
    )


def _read_holder(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
        return json.loads(text) if text.strip() else {}
    except (OSError, ValueError):
        return {}


class RunLock:
    """Exclusive locks on a run's directories, held between :meth:`acquire` and
    :meth:`release` (or inside ``with lock:``). Re-entrant within one object.

    Args:
        dirs: the run's directories (duplicates and nesting are fine; each distinct one is
            locked). They must exist.
    """

    def __init__(self, dirs: Iterable[str | os.PathLike[str]]) -> None:
        unique: dict[str, Path] = {}
        for d in dirs:
            path = Path(d).resolve()
            unique.setdefault(str(path), path)
        self.paths = [p / LOCK_FILE for p in unique.values()]
        self._fds: list[tuple[int, bool]] = []  # (descriptor, wrote a description)
        self._depth = 0

    @property
    def held(self) -> bool:
        return self._depth > 0

    def check(self) -> None:
        """Raise :class:`RunDirectoryInUse` if another process holds any of the locks now
        (a fail-fast check before a run builds anything; :meth:`acquire` is the real one)."""
        if self.held:
            return
        self.acquire(_quiet=True)
        self.release()

    def acquire(self, _quiet: bool = False) -> None:
        """Take every lock or none; raise :class:`RunDirectoryInUse` naming the holder."""
        self._depth += 1
        if self._depth > 1 or fcntl is None:
            if fcntl is None and self._depth == 1 and not _quiet:
                logger.warning("fcntl is unavailable: run directories are not locked")
            return
        try:
            for path in self.paths:
                self._fds.append((self._lock_one(path, quiet=_quiet), not _quiet))
        except BaseException:
            self._depth = 1
            self.release()
            raise

    def release(self) -> None:
        """Give the locks back (our description is erased first, so that a description
        found in an unlocked file means its writer died holding the lock)."""
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth > 0:
            return
        fds, self._fds = self._fds, []
        for fd, wrote in fds:
            try:
                if wrote:
                    os.ftruncate(fd, 0)
            finally:
                _HELD_FDS.discard(fd)
                os.close(fd)  # the last descriptor of the lock closed drops the flock

    def _lock_one(self, path: Path, quiet: bool) -> int:
        fd = _open_lock_file(path)
        _HELD_FDS.add(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _HELD_FDS.discard(fd)
            os.close(fd)
            raise RunDirectoryInUse(
                f"{path.parent} is in use by another run: {_describe(_read_holder(path))}. "
                "Two runs writing one directory overwrite each other's checkpoints and logs: "
                "wait for it to finish, stop it, or give this run another "
                "trainer.default_local_dir / trainer.log_dir"
            ) from None
        except BaseException:
            _HELD_FDS.discard(fd)
            os.close(fd)
            raise
        previous = _read_holder(path)
        if previous and not quiet:
            logger.warning(
                "taking over the lock of %s: its holder (%s) ended without releasing it (killed?)",
                path.parent,
                _describe(previous),
            )
        if not quiet:
            holder = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "command": " ".join(sys.argv)[:300],
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(holder).encode(), 0)
        return fd

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _unusable(what: str) -> RunLockError:
    return RunLockError(
        f"{what}. verl writes who holds the lock into this file; remove or rename it, or give "
        "this run another trainer.default_local_dir / trainer.log_dir"
    )


def _open_lock_file(path: Path) -> int:
    """A descriptor of the regular file ``path`` (created if missing), never through a
    symbolic link; :class:`RunLockError` for anything else found there."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        found = None
    except OSError as err:
        raise _unusable(f"cannot inspect the run lock {path}: {err.strerror or err}") from None
    if found is not None and stat.S_ISLNK(found.st_mode):
        raise _unusable(
            f"the run lock {path} is a symbolic link (to {os.readlink(path)}), not a file"
        )
    if found is not None and stat.S_ISDIR(found.st_mode):
        raise _unusable(f"the run lock {path} is a directory")
    if found is not None and not stat.S_ISREG(found.st_mode):
        raise _unusable(f"the run lock {path} is not a regular file")
    # O_NOFOLLOW: a link planted between the check and the open is refused all the same;
    # O_NONBLOCK: a FIFO planted then does not block the open (it is refused below).
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EMLINK):
            what = f"the run lock {path} is a symbolic link, not a file"
        elif err.errno == errno.EISDIR:
            what = f"the run lock {path} is a directory"
        else:
            what = f"cannot open the run lock {path}: {err.strerror or err}"
        raise _unusable(what) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _unusable(f"the run lock {path} is not a regular file")
    return fd
