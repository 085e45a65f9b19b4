"""The config checks every trainer shares (RL, SFT, DPO, RM): the sections they have in
common (data files, optimizer, run keys) and the registry-backed names a caller adds. The RL
checks (``verl.trainer.rl.config_checks``) and the offline ones
(``verl.trainer.offline.config_checks``) call them; :class:`~verl.config.checks.Checks`
collects what they find.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping
from typing import Any

from verl.config._fields import PATH_FIELDS
from verl.config.checks import Checks
from verl.config.load import get_path
from verl.config.schema_roles import OptimConfig
from verl.utils.yaml_text import show

__all__ = ["check_data_source", "check_optim", "check_registries", "check_run"]


def check_registries(c: Checks, cfg: Any, registries: Mapping[str, Iterable[str]] | None) -> None:
    """Registry-backed string keys (``{key path: allowed names}``) hold a registered name."""
    for path, names in (registries or {}).items():
        c.one_of(path, get_path(cfg, path), list(names))


def check_data_source(c: Checks, d: Any, builtin: bool) -> None:
    """Training/validation files exist, or the built-in data (every trainer's ``data``)."""
    for key, files in (("data.train_files", d.train_files), ("data.val_files", d.val_files)):
        for f in files:
            c.file(key, f)
    if not d.train_files and d.builtin is None:
        c.error(
            ("data.train_files", "data.builtin"),
            "data.train_files=[]: no training data; set data.train_files=[file, ...] "
            "or data.builtin=arithmetic",
        )
    if builtin and not d.arithmetic.ops:
        c.error("data.arithmetic.ops", "data.arithmetic.ops=[]: give at least one of +, -, *")
    a = d.arithmetic
    if builtin and a.max_digits is not None and a.max_digits < a.digits:
        c.error(
            ("data.arithmetic.max_digits", "data.arithmetic.digits"),
            f"data.arithmetic.max_digits={a.max_digits} is below data.arithmetic.digits="
            f"{a.digits}; operands have digits..max_digits digits",
        )


def check_optim(c: Checks, prefix: str, o: OptimConfig) -> None:
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        c.error(f"{prefix}.betas", f"{prefix}.betas={show(o.betas)}: must be two numbers in [0, 1)")


def check_run(c: Checks, t: Any, p: str = "trainer") -> None:
    """The resume keys, directory templates and loggers of every trainer's ``trainer``
    section (RL and SFT/DPO alike)."""
    if t.resume_mode == "resume_path":
        if t.resume_from_path is None:
            c.error(
                (f"{p}.resume_mode", f"{p}.resume_from_path"),
                f"{p}.resume_mode=resume_path: {p}.resume_from_path is null; give a checkpoint",
            )
        else:
            c.file(f"{p}.resume_from_path", t.resume_from_path, "checkpoint")
    elif t.resume_from_path is not None:
        c.warn(f"{p}.resume_from_path is ignored unless {p}.resume_mode=resume_path")
    if t.resume_force and t.resume_mode == "disable":
        c.warn(f"{p}.resume_force is ignored with {p}.resume_mode=disable")
    for name in ("log_dir", "default_local_dir"):
        template = getattr(t, name)
        try:
            names = [n for _, n, _, _ in string.Formatter().parse(template) if n is not None]
            unknown = [n for n in names if n not in PATH_FIELDS]
        except ValueError as exc:
            unknown = [f"(malformed: {exc})"]
        if unknown:
            c.error(
                f"{p}.{name}",
                f"{p}.{name}={show(template)}: unknown field {unknown[0]}; only "
                "{project_name} and {experiment_name} are filled in",
            )
    for name, extra in (("tensorboard", "tracking"), ("wandb", "tracking"), ("mlflow", "mlflow")):
        if name in t.logger:
            c.package(f"{p}.logger", name, name, f"pip install 'verl[{extra}]' or drop it")
