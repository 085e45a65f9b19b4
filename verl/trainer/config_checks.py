"""What every config check builds on, and the checks every trainer shares (RL, SFT, DPO, RM).

:class:`Checks` collects problems and warnings, each naming the key, the value and the fix,
and checks every field against the bounds the schema declares
(``verl.config.validate.bound_problems``). The shared checks cover the sections the trainers
have in common (data files, optimizer, run keys) and the registry-backed names a caller
adds. The RL checks (``verl.trainer.rl.config_checks``) and the offline ones
(``verl.trainer.offline.config_checks``) call them; they are registered in
``verl.registry.CONFIG_CHECKS`` (``verl.config.validate``).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import string
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from verl.config._fields import EMBEDDED_MODEL, PATH_FIELDS
from verl.config.load import ConfigProblem, get_path
from verl.config.schema_roles import OptimConfig
from verl.config.validate import bound_problems, is_skipped
from verl.utils.yaml_text import show

__all__ = [
    "Checks",
    "check_data_source",
    "check_optim",
    "check_registries",
    "check_run",
    "divisors",
]


def divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


class Checks:
    """Accumulates problems and warnings; each helper names the key, the value and the fix."""

    def __init__(self, skip_paths: Collection[str]) -> None:
        self.skip = set(skip_paths)
        self.problems: list[ConfigProblem] = []
        self.warnings: list[str] = []

    def error(self, keys: str | tuple[str, ...], message: str) -> None:
        keys = (keys,) if isinstance(keys, str) else keys
        if not any(is_skipped(k, self.skip) for k in keys):
            self.problems.append(ConfigProblem(keys[0], message, keys))

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def fields(self, obj: Any, inactive: Collection[str] = ()) -> None:
        """Check every field of the dataclass tree ``obj`` against the bounds declared with
        ``entry(..., ge=, gt=, le=, lt=, off=, nonempty=)``; ``inactive`` sections are skipped."""
        for problem in bound_problems(obj, inactive):
            self.error(problem.path, problem.message)

    def one_of(self, path: str, value: str, names: list[str]) -> None:
        if value not in names:
            close = difflib.get_close_matches(value, names, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            self.error(path, f"{path}={show(value)}: must be one of {', '.join(names)}{hint}")

    def file(self, path: str, value: str, what: str = "file") -> None:
        if not os.path.exists(value):
            self.error(
                path,
                f"{path}: {what} {value!r} does not exist "
                f"(relative paths are resolved from {os.getcwd()})",
            )

    def model(self, prefix: str, model: Any) -> None:
        """``<prefix>.path`` and ``.tokenizer_path`` are local paths or the embedded model."""
        for path, value in (
            (f"{prefix}.path", model.path),
            (f"{prefix}.tokenizer_path", model.tokenizer_path),
        ):
            if value is not None and value != EMBEDDED_MODEL and not os.path.exists(value):
                self.error(
                    path,
                    f"{path}={show(value)}: no such local model directory or file; give a local "
                    f"path or the embedded model '{EMBEDDED_MODEL}' (hub downloads are not done)",
                )

    def package(self, path: str, value: str, module: str, install: str) -> None:
        if importlib.util.find_spec(module) is None:
            self.error(path, f"{path}={show(value)}: needs the '{module}' package; {install}")


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
