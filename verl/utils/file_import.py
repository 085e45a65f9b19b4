"""Import a named callable from a user's Python file (reward functions, tools, interactions).

The file is executed as a fresh module whose name is derived from its absolute path (so
two files both called ``reward.py`` do not clash) and registered in ``sys.modules`` while
it runs (dataclasses and pickling inside the file need that). Every failure raises an
error naming the file, what it was loaded as, and what to change.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from typing import Any

__all__ = ["load_callable"]


def _module_name(path: str, what: str) -> str:
    digest = hashlib.sha1(path.encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(path))[0])
    kind = "".join(c if c.isalnum() else "_" for c in what)
    return f"_verl_{kind}_{stem}_{digest}"


def load_callable(path: str, name: str, what: str, hint: str) -> tuple[str, Any]:
    """Import the file ``path`` and return ``(absolute path, its callable attribute name)``.

    Args:
        path: the Python file (``~`` expanded, relative to the working directory).
        name: the attribute to return; it must be callable (a function, or an object with
            ``__call__`` such as a ready ``verl.tools.Tool``).
        what: how the file is named in errors, e.g. ``"custom reward function file"``.
        hint: the fix for a missing file, e.g. ``"set custom_reward_function.path to an
            existing .py file"``.

    Raises:
        FileNotFoundError: ``path`` is not an existing file.
        ImportError: executing the file failed (the original error is chained).
        AttributeError: the file defines nothing called ``name`` (its callables are listed).
        TypeError: ``name`` exists but is not callable.
    """
    abs_path = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isfile(abs_path):
        raise FileNotFoundError(f"{what} not found: {path!r} (resolved to {abs_path!r}); {hint}")
    module_name = _module_name(abs_path, what)
    spec = importlib.util.spec_from_file_location(module_name, abs_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {what} {abs_path!r} as a Python module (a .py file?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ImportError(
            f"importing {what} {abs_path!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not hasattr(module, name):
        available = sorted(
            attr
            for attr, value in vars(module).items()
            if callable(value) and not attr.startswith("_") and not isinstance(value, type)
        )
        raise AttributeError(
            f"{what} {abs_path!r} defines no {name!r}; callables it defines: {available or 'none'}"
        )
    obj = getattr(module, name)
    if not callable(obj):
        raise TypeError(
            f"{name!r} in {what} {abs_path!r} is a {type(obj).__name__}, not a callable"
        )
    return abs_path, obj
