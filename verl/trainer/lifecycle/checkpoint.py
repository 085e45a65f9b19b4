"""Run checkpoint directories: written atomically, found, validated, retained.

A run checkpoint is a directory ``{trainer.default_local_dir}/global_step_N``::

    {trainer.default_local_dir}/
      latest_checkpointed_iteration.txt    N of the newest complete checkpoint (atomic)
      global_step_N/
        actor/                             the actor engine (model, optimizer, LR schedule;
                                           sharded DCP under fsdp2) + worker_state_rank{r}.json
                                           (RNG and call counters of rank r)
          huggingface/                     HF config, generation config, tokenizer (export)
        critic/                            the same for the critic, when there is one
        trainer_state.json                 step, data-loader position, KL controller, reward
                                           normalisation, the driver's RNG
        config.yaml                        the resolved config of the run
        checkpoint.json                    manifest, written last: roles, world sizes, every
                                           file with its size and CRC-32

What goes in and how a run resumes from it is ``verl.trainer.lifecycle.resume``; this module is the
directory mechanics, which do not depend on the trainer.

Atomicity (:class:`CheckpointManager`): everything is written into a hidden sibling
``.global_step_N.tmp-<pid>-<id>``, every file and directory is fsynced, the manifest goes in
last, and only then is the directory renamed to ``global_step_N`` and the ``latest`` pointer
replaced. A crash or a full disk at any point leaves the previous checkpoints and the pointer
untouched; a directory without a valid manifest (or whose files do not match it) is never
resumed from. Loading verifies every file against the size and CRC-32 the manifest recorded
(:func:`read_manifest` with ``verify=True``; CRC-32 runs at ~6 GB/s, so this costs a fraction
of reading the files); :meth:`CheckpointManager.newest_verified` reports a damaged checkpoint
at WARNING, renames it aside (``global_step_N.damaged-<time>``, never overwritten or deleted)
and falls back to the previous complete one. Older checkpoints beyond ``trainer.max_ckpt_to_keep`` are removed only after
the new one is complete (renamed aside first, so a half-deleted one never looks complete).

Nothing is unpickled on load: tensors come from safetensors or DCP (whose metadata and
non-tensor values are read through ``verl.engine.dcp_io``'s restricted loaders), the
optimizer tensors of the single engine with ``torch.load(weights_only=True)``, and
everything else from JSON / YAML. See ``docs/checkpoints.md``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import time
import uuid
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl.config.roles import ROLES, TRAINABLE_ROLES
from verl.utils.atomic_io import (
    fsync_dir,
    fsync_tree,
    publish_dir,
    write_json_atomic,
    write_text_atomic,
)

logger = logging.getLogger(__name__)

__all__ = [
    "CONFIG_FILE",
    "HF_CONFIG_DIR",
    "LATEST_FILE",
    "MANIFEST_FILE",
    "ROLE_DIRS",
    "TRAINER_STATE_FILE",
    "CheckpointError",
    "CheckpointManager",
    "ChecksumsMissing",
    "checkpoint_name",
    "complete_checkpoints",
    "describe_write_error",
    "latest_checkpoint",
    "read_manifest",
]

CHECKPOINT_PREFIX = "global_step_"
LATEST_FILE = "latest_checkpointed_iteration.txt"
MANIFEST_FILE = "checkpoint.json"
TRAINER_STATE_FILE = "trainer_state.json"
CONFIG_FILE = "config.yaml"
HF_CONFIG_DIR = "huggingface"
# Role (placement name) -> its directory in a checkpoint.
ROLE_DIRS = {ROLES[role].group: role for role in TRAINABLE_ROLES}  # actor_rollout_ref -> actor
FORMAT_VERSION = 1

_STEP_DIR = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")
_TMP_MARK = ".tmp-"
_TRASH_MARK = ".deleting-"
# Less free space than this after a failed write: report the disk as full.
_FULL_DISK_BYTES = 1 << 20


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or incompatible, or saving one failed."""


class ChecksumsMissing(CheckpointError):
    """A manifest lists files without their CRC-32 (:func:`read_manifest` with
    ``require_checksums``): their bytes cannot be verified."""


# ---------------------------------------------------------------------- directory layout


def checkpoint_name(step: int) -> str:
    """``global_step_{step}``."""
    return f"{CHECKPOINT_PREFIX}{step}"


def _step_of(name: str) -> int | None:
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def _file_sizes(root: Path) -> dict[str, int]:
    """``{relative path: size}`` of every file under ``root``."""
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            out[path.relative_to(root).as_posix()] = path.stat().st_size
    return dict(sorted(out.items()))


def _crc32(path: Path, chunk: int = 16 * 2**20) -> str:
    """CRC-32 of a file's bytes as 8 hex digits (detects damage, not tampering)."""
    crc = 0
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


def _damaged_files(path: Path, manifest: dict[str, Any], verify: bool) -> list[str]:
    """``"file: reason"`` for each file that is missing, resized or (``verify``) altered."""
    actual = _file_sizes(path)
    checksums = manifest.get("crc32", {})
    out = []
    for name, size in manifest["files"].items():
        if name == MANIFEST_FILE:
            continue
        if name not in actual:
            out.append(f"{name}: missing")
        elif actual[name] != size:
            out.append(f"{name}: {actual[name]} bytes, saved with {size}")
        elif verify and name in checksums and _crc32(path / name) != checksums[name]:
            out.append(f"{name}: CRC-32 {_crc32(path / name)}, saved with {checksums[name]}")
    return out


def read_manifest(
    path: str | os.PathLike[str], verify: bool = False, *, require_checksums: bool = False
) -> dict[str, Any]:
    """The manifest of a complete checkpoint directory.

    Args:
        verify: also compare every file's CRC-32 with the manifest (reads every byte);
            without it only presence and sizes are checked.
        require_checksums: with ``verify``, a manifest that lacks the CRC-32 of any file it
            lists (no ``crc32`` table, or entries removed) is refused
            (:class:`ChecksumsMissing`); without it such files are checked by size alone.

    Raises:
        CheckpointError: ``path`` is missing, a temporary directory of an interrupted save,
            has no (valid) manifest, or a file listed in the manifest is missing, has another
            size or (``verify``) other bytes (the directory was damaged after it was written).
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist (or is not a directory)")
    if _TMP_MARK in path.name or _TRASH_MARK in path.name:
        raise CheckpointError(
            f"{path} is the temporary directory of an interrupted checkpoint save or delete, "
            "not a complete checkpoint; resume from a global_step_N directory"
        )
    manifest_file = path / MANIFEST_FILE
    if not manifest_file.is_file():
        hint = ""
        newest = latest_checkpoint(path)
        if newest is not None:
            hint = f"; it is a run directory: did you mean {newest}?"
        raise CheckpointError(
            f"{path} is not a complete checkpoint: it has no {MANIFEST_FILE} (written last "
            f"by a save that finished){hint}"
        )
    try:
        manifest = json.loads(manifest_file.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{manifest_file} is unreadable: {err}") from err
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{manifest_file} has format_version={manifest.get('format_version')!r}; this "
            f"version of verl reads {FORMAT_VERSION}"
        )
    damaged = _damaged_files(path, manifest, verify)
    if damaged:
        shown = "; ".join(damaged[:5]) + (
            f" and {len(damaged) - 5} more" if len(damaged) > 5 else ""
        )
        raise CheckpointError(
            f"checkpoint {path} is damaged: {len(damaged)} file(s) differ from what was "
            f"saved ({shown})"
        )
    if verify and require_checksums:
        checksums = manifest.get("crc32")
        checksums = checksums if isinstance(checksums, dict) else {}
        missing = [n for n in manifest["files"] if n != MANIFEST_FILE and n not in checksums]
        if missing:
            shown = ", ".join(missing[:5]) + (
                f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            )
            raise ChecksumsMissing(
                f"checkpoint {path}: its manifest has no CRC-32 for {len(missing)} file(s) "
                f"({shown}), so their bytes cannot be verified"
            )
    return manifest


def _is_complete(path: Path) -> bool:
    try:
        read_manifest(path)
    except CheckpointError as err:
        logger.warning("ignoring %s: %s", path, err)
        return False
    return True


def complete_checkpoints(root: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """``(step, path)`` of every complete ``global_step_N`` directory under ``root``, oldest
    first; temporary and incomplete directories are skipped."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        step = _step_of(child.name)
        if step is not None and child.is_dir() and _is_complete(child):
            found.append((step, child))
    return sorted(found)


def latest_checkpoint(root: str | os.PathLike[str]) -> Path | None:
    """The complete checkpoint with the highest step under ``root``, or None."""
    found = complete_checkpoints(root)
    return found[-1][1] if found else None


def describe_write_error(
    err: BaseException,
    root: Path,
    fix: str = "free space or point trainer.default_local_dir elsewhere",
) -> str:
    """What went wrong in a write under ``root``, in words; a full disk is named (followed by
    ``fix``) even when the writer's own error hides it (torch.save reports a full disk as
    "file write failed", safetensors as "I/O error: No space left on device")."""
    full = f"the disk is full: {fix}"
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC:
            return f"{full} (ENOSPC)"
        seen = seen.__cause__ or seen.__context__
    if "No space left on device" in str(err):
        return full
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = None
    if free is not None and free < _FULL_DISK_BYTES:
        return (
            f"{full} ({free} bytes free under {root}; the writer said {type(err).__name__}: {err})"
        )
    return f"{type(err).__name__}: {err}"


class CheckpointManager:
    """Atomic ``global_step_N`` directories, the ``latest`` pointer and retention.

    Args:
        root: the run's checkpoint directory (``trainer.default_local_dir``, resolved).
        max_to_keep: complete checkpoints kept after a save (None: all).
    """

    def __init__(self, root: str | os.PathLike[str], max_to_keep: int | None = None) -> None:
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep={max_to_keep} must be >= 1 (or None to keep all)")
        self.root = Path(root)
        self.max_to_keep = max_to_keep

    def clean_stale_temporaries(self) -> list[Path]:
        """Remove the temporary directories that interrupted saves left behind."""
        removed = []
        if self.root.is_dir():
            for child in self.root.iterdir():
                stale = child.name.startswith(f".{CHECKPOINT_PREFIX}") and (
                    _TMP_MARK in child.name or _TRASH_MARK in child.name
                )
                if stale and child.is_dir():
                    logger.warning("removing %s, left by an interrupted checkpoint save", child)
                    shutil.rmtree(child, ignore_errors=True)
                    removed.append(child)
        return removed

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        return latest_checkpoint(self.root)

    def newest_verified(self) -> Path | None:
        """The newest checkpoint whose every file matches its manifest (sizes and CRC-32).

        Newer ``global_step_N`` directories whose files fail the check are reported at
        WARNING with the file and the reason and renamed aside to
        ``global_step_N.damaged-<time>`` (kept for inspection; no later save or retention
        touches them). Directories without a manifest are skipped and left in place.
        """
        if not self.root.is_dir():
            return None
        named = ((_step_of(child.name), child) for child in self.root.iterdir())
        steps = sorted(((step, c) for step, c in named if step is not None), reverse=True)
        for _, path in steps:
            if not path.is_dir():
                continue
            if not (path / MANIFEST_FILE).is_file():
                # Not written by a save of ours (they rename only after the manifest is in):
                # someone else's directory, left as it is.
                logger.warning("skipping %s: it has no %s", path, MANIFEST_FILE)
                continue
            try:
                read_manifest(path, verify=True)
                return path
            except CheckpointError as err:
                aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
                path.rename(aside)
                logger.warning("%s; renamed it to %s and looking further back", err, aside)
        return None

    def save(self, step: int, write: Callable[[Path], dict[str, Any]]) -> Path:
        """Write checkpoint ``step``: ``write(tmp_dir)`` fills a temporary directory and
        returns manifest fields; the directory then becomes ``global_step_{step}``.

        Raises:
            CheckpointError: writing failed (the temporary directory is removed, the
                previous checkpoints and the ``latest`` pointer are untouched).
        """
        self.root.mkdir(parents=True, exist_ok=True)
        name = checkpoint_name(step)
        final = self.root / name
        tmp = self.root / f".{name}{_TMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        start = time.perf_counter()
        try:
            tmp.mkdir()
            extra = write(tmp)
            fsync_tree(tmp)
            files = _file_sizes(tmp)
            manifest = {
                "format_version": FORMAT_VERSION,
                "global_step": step,
                "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                **extra,
                "total_bytes": sum(files.values()),
                "files": files,
                "crc32": {name: _crc32(tmp / name) for name in files},
            }
            write_json_atomic(tmp / MANIFEST_FILE, manifest)
            fsync_dir(tmp)
            self._move_into_place(tmp, final)
        except BaseException as err:
            # Described before the partial files go: their removal frees the full disk.
            reason = describe_write_error(err, self.root) if isinstance(err, Exception) else ""
            shutil.rmtree(tmp, ignore_errors=True)
            if not isinstance(err, Exception):
                raise  # KeyboardInterrupt etc.: no wrapping
            previous = self.latest()
            kept = (
                f"the newest complete checkpoint is still {previous} and {LATEST_FILE} "
                "still points to it"
                if previous is not None
                else "no complete checkpoint exists yet"
            )
            raise CheckpointError(
                f"saving checkpoint {name} under {self.root} failed: {reason}. The partial "
                f"checkpoint was removed; {kept}"
            ) from err
        try:
            write_text_atomic(self.root / LATEST_FILE, f"{step}\n")
        except OSError as err:
            raise CheckpointError(
                f"checkpoint {final} is complete, but updating {LATEST_FILE} failed: "
                f"{describe_write_error(err, self.root)} (auto-resume finds {final} without it)"
            ) from err
        self._retain(step)
        logger.info(
            "saved checkpoint %s (%.1f MB) in %.2f s",
            final,
            manifest["total_bytes"] / 2**20,
            time.perf_counter() - start,
        )
        return final

    def _move_into_place(self, tmp: Path, final: Path) -> None:
        # the same step saved again (e.g. resumed from an older one) sets the old one aside
        aside = final.with_name(f".{final.name}{_TRASH_MARK}{uuid.uuid4().hex[:8]}")
        publish_dir(tmp, final, aside=aside)

    def _retain(self, newest: int) -> None:
        """Delete the oldest complete checkpoints so that ``max_to_keep`` remain (the one
        just written included); checkpoints of higher steps than it are left alone."""
        if self.max_to_keep is None:
            return
        older = [path for step, path in complete_checkpoints(self.root) if step < newest]
        for path in older[: max(0, len(older) - (self.max_to_keep - 1))]:
            # Rename first: a crash while deleting must not leave a damaged directory under
            # a name that resume would consider.
            trash = path.with_name(f".{path.name}{_TRASH_MARK}{uuid.uuid4().hex[:8]}")
            path.rename(trash)
            shutil.rmtree(trash, ignore_errors=True)
            logger.info("removed %s (trainer.max_ckpt_to_keep=%d)", path, self.max_to_keep)
