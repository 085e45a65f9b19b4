"""Temporary directories that name the process owning them, and the removal of those whose
owner died without cleaning up (SIGKILL, OOM killer, power loss).

    path = make_owned_tmpdir("verl-vllm-model-")       # /tmp/verl-vllm-model-4242-k3j9x1
    removed = remove_stale_tmpdirs("verl-vllm-model-")  # at the next start: the dead ones

A directory is ``{dir}/{prefix}{pid}-{random}`` and holds an ``.owner`` file with the
owner's host name and pid. :func:`remove_stale_tmpdirs` removes a directory only when all
of these hold, so a live owner's directory is never touched:

- its name carries a pid and that process does not exist (``kill(pid, 0)`` finds none; a
  process of another user counts as alive);
- it belongs to this user;
- its ``.owner`` names this host (a ``/tmp`` shared between hosts or containers with
  their own process tables), or, without an ``.owner`` (its owner died right after
  creating it), it is older than :data:`UNOWNED_GRACE_S`.

A pid reused by a new process keeps the directory until that process ends too: stale
directories are removed late, never early.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

__all__ = [
    "OWNER_FILE",
    "UNOWNED_GRACE_S",
    "make_owned_tmpdir",
    "owned_tmpdir",
    "remove_stale_tmpdirs",
]

OWNER_FILE = ".owner"
UNOWNED_GRACE_S = 60.0


def make_owned_tmpdir(prefix: str, dir: str | os.PathLike[str] | None = None) -> str:
    """A new directory ``{dir or tempfile's}/{prefix}{pid}-{random}`` with its ``.owner``."""
    path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=dir)
    Path(path, OWNER_FILE).write_text(f"{socket.gethostname()} {os.getpid()}\n")
    return path


@contextlib.contextmanager
def owned_tmpdir(prefix: str, dir: str | os.PathLike[str] | None = None) -> Iterator[str]:
    """:func:`make_owned_tmpdir`, removed when the block ends (like
    ``tempfile.TemporaryDirectory``, errors while removing ignored)."""
    path = make_owned_tmpdir(prefix, dir)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    return True


def _is_stale(path: Path, pid: int, host: str, now: float) -> bool:
    if pid == os.getpid() or _pid_alive(pid):
        return False
    st = path.lstat()
    if not path.is_dir() or path.is_symlink() or st.st_uid != os.getuid():
        return False
    try:
        owner = (path / OWNER_FILE).read_text().split()
    except OSError:
        return now - st.st_mtime > UNOWNED_GRACE_S
    return len(owner) == 2 and owner[0] == host and owner[1] == str(pid)


def remove_stale_tmpdirs(prefix: str, dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Remove the ``{prefix}{pid}-*`` directories of ``dir`` (default: tempfile's) whose
    owner is gone (see the module docstring); returns the removed paths, logged at INFO."""
    root = Path(dir if dir is not None else tempfile.gettempdir())
    pattern = re.compile(re.escape(prefix) + r"(\d+)-[^/]+$")
    host, now = socket.gethostname(), time.time()
    removed = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for path in entries:
        match = pattern.match(path.name)
        if match is None:
            continue
        try:
            if not _is_stale(path, int(match.group(1)), host, now):
                continue
            shutil.rmtree(path)
        except OSError as exc:  # raced with another cleaner, or not ours to remove
            logger.debug("left %s: %s", path, exc)
            continue
        removed.append(str(path))
    if removed:
        logger.info(
            "removed %d temporary director%s left by dead processes: %s",
            len(removed),
            "y" if len(removed) == 1 else "ies",
            ", ".join(removed),
        )
    return removed
