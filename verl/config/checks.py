"""What every config check builds on: :class:`Checks`, which collects problems and warnings,
each naming the key, the value and the fix, and checks every field against the bounds the
schema declares (``entry(..., ge=, ...)``). The checks themselves live with the features
that read the config (``verl.trainer.config_checks`` for the sections every trainer shares,
``verl.trainer.rl.config_checks``, ``verl.trainer.offline.config_checks``), registered in
``verl.registry.CONFIG_CHECKS`` (``verl.config.validate``).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import os
from collections.abc import Collection, Mapping
from typing import Any

from verl.config._fields import EMBEDDED_MODEL
from verl.config.load import ConfigProblem
from verl.utils.yaml_text import show


def divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


class Checks:
    """Accumulates problems and warnings; each helper names the key, the value and the fix."""

    def __init__(self, skip_paths: Collection[str]) -> None:
        self.skip = set(skip_paths)
        self.problems: list[ConfigProblem] = []
        self.warnings: list[str] = []

    def _skipped(self, key: str) -> bool:
        parts = key.split(".")
        return any(".".join(parts[: i + 1]) in self.skip for i in range(len(parts)))

    def error(self, keys: str | tuple[str, ...], message: str) -> None:
        keys = (keys,) if isinstance(keys, str) else keys
        if not any(self._skipped(k) for k in keys):
            self.problems.append(ConfigProblem(keys[0], message, keys))

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def fields(self, obj: Any, prefix: str = "", inactive: Collection[str] = ()) -> None:
        """Check every field of the dataclass tree ``obj`` against the bounds declared with
        ``entry(..., ge=, gt=, le=, lt=, off=, nonempty=)``; ``inactive`` sections are skipped."""
        for f in dataclasses.fields(obj):
            path, value = f"{prefix}{f.name}", getattr(obj, f.name)
            if path in inactive or value is None:
                continue
            if dataclasses.is_dataclass(value):
                self.fields(value, path + ".", inactive)
            elif f.metadata.get("nonempty") and isinstance(value, str) and not value.strip():
                self.error(path, f"{path}={show(value)}: must not be empty")
            elif isinstance(value, (int, float)) and value != f.metadata.get("off", value + 1):
                self._bounds(path, value, f.metadata)

    def _bounds(self, path: str, value: float, m: Mapping[str, Any]) -> None:
        lo, hi = m.get("ge", m.get("gt")), m.get("le", m.get("lt"))
        above = lo is None or value > lo or (value == lo and "ge" in m)
        below = hi is None or value < hi or (value == hi and "le" in m)
        if above and below:
            return
        if "off" in m:
            rule = f"must be {m['off']} (off) or >= {lo}"
        elif lo is not None and hi is not None:
            left, right = "[" if "ge" in m else "(", "]" if "le" in m else ")"
            rule = f"must be in {left}{lo}, {hi}{right}"
        elif lo is not None:
            rule = f"must be {'>=' if 'ge' in m else '>'} {lo}"
        else:
            rule = f"must be {'<=' if 'le' in m else '<'} {hi}"
        self.error(path, f"{path}={show(value)}: {rule}")

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
