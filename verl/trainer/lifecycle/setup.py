"""Run set-up shared by the trainers: seeding, run directories and the built-in data."""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.config import TrainerConfig

logger = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and, when present, CUDA) generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resolve_run_dirs(cfg: TrainerConfig) -> tuple[Path, Path]:
    """``(log_dir, checkpoint_dir)`` of this run, created if missing and checked writable
    (a ``ValueError`` naming the key otherwise, before anything is loaded).

    ``trainer.default_local_dir`` and ``trainer.log_dir`` may contain ``{project_name}`` and
    ``{experiment_name}`` placeholders.
    """
    t = cfg.trainer
    log_dir = _writable_dir("trainer.log_dir", t.log_dir or t.default_local_dir, t)
    ckpt_dir = _writable_dir("trainer.default_local_dir", t.default_local_dir, t)
    return log_dir, ckpt_dir


def resolve_sample_dirs(cfg: TrainerConfig) -> tuple[Path | None, Path | None]:
    """``(rollout_data_dir, validation_data_dir)``: created and checked writable like
    :func:`resolve_run_dirs`, or None where not set."""
    t = cfg.trainer
    return tuple(  # type: ignore[return-value]
        None if value is None else _writable_dir(f"trainer.{key}", value, t)
        for key, value in (
            ("rollout_data_dir", t.rollout_data_dir),
            ("validation_data_dir", t.validation_data_dir),
        )
    )


def _writable_dir(key: str, template: str, t: Any) -> Path:
    """The directory of ``template`` (``{project_name}``, ``{experiment_name}`` filled in),
    created if missing; a ``ValueError`` naming ``key`` if it cannot be written."""
    names = {"project_name": t.project_name, "experiment_name": t.experiment_name}
    path = Path(os.path.expanduser(template.format(**names)))
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".verl-write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise ValueError(
            f"{key}={str(path)!r} is not a writable directory ({err.strerror or err}): "
            "point it at a directory this user can create and write"
        ) from err
    return path


def prepare_data_files(cfg: TrainerConfig, run_dir: Path) -> tuple[list[str], list[str]]:
    """The train and validation files, generating the built-in data set when asked for.

    With ``data.builtin="arithmetic"`` and no ``data.train_files``, the arithmetic generator
    writes ``train.parquet`` / ``test.parquet`` under ``<run_dir>/data`` (deterministic for
    ``data.seed``), so the default run needs no data download.
    """
    d = cfg.data
    train_files = list(d.train_files)
    val_files = list(d.val_files)
    if not train_files and d.builtin == "arithmetic":
        from verl.data import write_arithmetic_dataset

        a = d.arithmetic
        train_path, val_path = write_arithmetic_dataset(
            run_dir / "data",
            train_size=a.train_size,
            val_size=a.val_size,
            digits=a.digit_range,
            ops=list(a.ops),
            seed=d.seed,
            balance_digits=a.balance_digits,
            negative=a.negative,
            phrasings=list(a.phrasings),
        )
        logger.info("built-in arithmetic data: %s, %s", train_path, val_path)
        train_files = [str(train_path)]
        if not val_files and val_path is not None:
            val_files = [str(val_path)]
    if not train_files:
        raise ValueError(
            "no training data: set data.train_files=[...] (parquet or jsonl) "
            "or data.builtin=arithmetic"
        )
    return train_files, val_files


# what every checkpoint holds: exact resume needs all of it
RESUME_CONTENTS = ("model", "optimizer", "extra")


class NotSupportedYet(NotImplementedError):
    """A configured feature that this build of the trainer does not implement yet."""


def check_supported(cfg: TrainerConfig) -> None:
    """Refuse, before any model loads, settings that would otherwise be silently ignored.

    Every key in the schema is meant to work; the ones listed here are declared (so the
    configs users bring from upstream verl parse) but their feature has not landed.
    """
    problems = []
    for section, ckpt in (
        ("actor_rollout_ref.actor.checkpoint", cfg.actor_rollout_ref.actor.checkpoint),
        ("critic.checkpoint", cfg.critic.checkpoint),
    ):
        missing = [part for part in RESUME_CONTENTS if part not in ckpt.save_contents]
        if missing:
            problems.append(
                f"{section}.save_contents={list(ckpt.save_contents)}: partial checkpoints are "
                f"not implemented (it lacks {', '.join(missing)}; a checkpoint always holds "
                "model, optimizer and extra state, which exact resume needs); list all three "
                "(hf_model may be added)"
            )
        load = ckpt.load_contents
        missing = [part for part in RESUME_CONTENTS if load is not None and part not in load]
        if missing:
            problems.append(
                f"{section}.load_contents={list(load)}: partial loads are not implemented (it "
                f"lacks {', '.join(missing)}; resume restores model, optimizer and extra "
                "state); leave it null or list all three"
            )
    if "hf_model" in cfg.critic.checkpoint.save_contents and cfg.critic.model.lora_rank > 0:
        problems.append(
            f"critic.checkpoint.save_contents={list(cfg.critic.checkpoint.save_contents)}: "
            f"hf_model is not implemented for a LoRA critic (critic.model.lora_rank="
            f"{cfg.critic.model.lora_rank}); export it with `verl export --role critic`"
        )
    if problems:
        raise NotSupportedYet("; ".join(problems))
