"""Check that an output file can be written before the work that produces it starts.

    check_output_file("gens.parquet", "--out")   # raises OutputPathError naming the problem

A command that computes for minutes and only then finds its output path unusable loses the
work. :func:`check_output_file` answers up front, without leaving anything behind: the
path must not be a directory, an existing file must not be read-only, and its directory
must exist (or be creatable: the nearest existing ancestor is a directory) and accept a new
file (a probe file is created there and removed at once, which also catches a read-only
filesystem, missing permissions and a full inode table). Writing itself stays atomic
(:mod:`verl.utils.atomic_io`): a disk that fills up mid-write leaves the old file, or none.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

__all__ = ["OutputPathError", "check_output_file"]


class OutputPathError(ValueError):
    """An output path cannot be written; the message names the path and the reason."""


def check_output_file(path: str | os.PathLike[str], what: str = "output") -> Path:
    """``path`` as a :class:`Path`, or :class:`OutputPathError` saying why it cannot be
    written (``what`` names the option in the message, e.g. ``"--out"``)."""
    path = Path(path)
    where = f"{what} {str(path)!r}"
    if path.is_dir():
        raise OutputPathError(f"{where} is a directory; give a file name inside it")
    if path.exists():
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode):
            raise OutputPathError(f"{where} exists and is not a regular file")
        if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(path, os.W_OK):
            raise OutputPathError(f"{where} is read-only; make it writable or choose another file")
    parent = path.parent
    existing = parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise OutputPathError(f"{where}: cannot create its directory, {str(existing)!r} is a file")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.probe-", dir=existing)
    except OSError as exc:
        raise OutputPathError(
            f"{where}: cannot write in {str(existing)!r} ({exc.strerror or exc})"
        ) from exc
    os.close(fd)
    os.unlink(probe)
    return path
