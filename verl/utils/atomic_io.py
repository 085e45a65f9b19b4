"""Crash-safe writes, the one place verl does them: write under a temporary name, flush to
disk, rename into place.

``os.replace`` of a file (or ``os.rename`` of a directory) within one filesystem is atomic:
readers see the old content or the new, never a mix. It is durable only once the new
file's data *and* the directory entry are on disk, hence the ``fsync`` calls.

Files:
    :func:`atomic_path` (for writers that take a path: ``torch.save``, safetensors,
    pyarrow), :func:`write_bytes_atomic`, :func:`write_text_atomic`,
    :func:`write_json_atomic`.
Directories:
    :func:`replace_dir_atomically` (build a new directory, then swap it in) over
    :func:`publish_dir` (swap an already built directory in).

Temporary names are hidden siblings, ``.{name}.tmp-{pid}-{random}``, so concurrent writers
(threads, processes) never share one, and a crash leaves only dot-files behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_path",
    "fsync_dir",
    "fsync_tree",
    "publish_dir",
    "replace_dir_atomically",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_text_atomic",
]

TMP_MARK = ".tmp-"


def _sibling(path: Path, mark: str) -> Path:
    return path.with_name(f".{path.name}{mark}{os.getpid()}-{uuid.uuid4().hex[:8]}")


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


def _fsync_file(path: str | os.PathLike[str]) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_tree(root: str | os.PathLike[str]) -> int:
    """``fsync`` every file and directory under ``root`` (files first); returns bytes seen."""
    total = 0
    for dirpath, _, filenames in os.walk(root, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            _fsync_file(path)
            total += os.path.getsize(path)
        fsync_dir(dirpath)
    return total


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary sibling path for the block to write; it then replaces ``path``.

    The parent directory is created if missing. If the block raises, the temporary file is
    removed and ``path`` is untouched. On success the file is fsynced, renamed over
    ``path`` and the directory entry fsynced.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(path, TMP_MARK)
    try:
        yield tmp
        if not tmp.is_file():
            raise FileNotFoundError(f"the block wrote nothing to {tmp} (meant for {path})")
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically and durably."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike[str], obj: Any) -> None:
    """:func:`write_text_atomic` of ``obj`` as JSON (floats round-trip exactly).

    The object is serialised before any file is touched, so an unserialisable object
    raises ``TypeError`` and leaves ``path`` as it was.
    """
    write_text_atomic(path, json.dumps(obj, indent=1, allow_nan=True))


def publish_dir(
    tmp: str | os.PathLike[str],
    out: str | os.PathLike[str],
    aside: str | os.PathLike[str] | None = None,
) -> None:
    """Move the complete directory ``tmp`` to ``out`` (a sibling on the same filesystem).

    An existing ``out`` is first renamed to ``aside`` (default: a hidden
    ``.{name}.old-...`` sibling), the new one renamed in, the parent's entries fsynced and
    only then the old one deleted: at every instant ``out`` is absent, old or new.
    """
    tmp, out = Path(tmp), Path(out)
    old = None
    if out.exists():
        old = Path(aside) if aside is not None else _sibling(out, ".old-")
        out.rename(old)
    tmp.rename(out)
    fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def replace_dir_atomically(out: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a new temporary sibling directory of ``out``; publish it as ``out`` once the
    block ends (:func:`publish_dir`).

    The block writes the new directory's content; if it raises, the temporary directory is
    removed and ``out`` is untouched.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(out, TMP_MARK)
    tmp.mkdir()
    try:
        yield tmp
        publish_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
