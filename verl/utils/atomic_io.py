"""Crash-safe file writes: write under a temporary name, flush to disk, rename into place.

``os.replace`` of a file (or ``os.rename`` of a directory) within one filesystem is atomic:
readers see the old content or the new, never a mix. It is durable only once the new
file's data *and* the directory entry are on disk, hence the ``fsync`` calls.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "fsync_dir",
    "fsync_tree",
    "replace_dir_atomically",
    "write_json_atomic",
    "write_text_atomic",
]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Flush a directory's entries (creations, renames) to disk; a no-op where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike[str]) -> int:
    """``fsync`` every file and directory under ``root`` (files first); returns bytes seen."""
    total = 0
    for dirpath, _, filenames in os.walk(root, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            total += os.path.getsize(path)
        fsync_dir(dirpath)
    return total


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with ``text`` atomically and durably."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """:func:`write_text_atomic` of ``obj`` as JSON (floats round-trip exactly)."""
    write_text_atomic(path, json.dumps(obj, indent=1, allow_nan=True))


@contextlib.contextmanager
def replace_dir_atomically(out: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary sibling directory of ``out``; move it to ``out`` once the block ends.

    The block writes the new directory's content; if it raises, the temporary directory is
    removed and ``out`` is untouched. An existing ``out`` is replaced only after the new
    one is complete (renamed aside, the new one renamed in, the old one deleted).
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
