"""Load a user's reward function from a Python file path.

The file is imported as a fresh module (`importlib.util.spec_from_file_location`) under a
name derived from its absolute path, so two files both called `reward.py` do not clash.
The function is called by the reward manager with keyword arguments:

    compute_score(data_source=..., solution_str=..., ground_truth=..., extra_info=...)

and returns a float or a dict with a "score" key (plus optional extras such as "acc").

The returned callable pickles as `(path, name)` and re-imports the file when unpickled, so
it can be sent to worker processes started with the "spawn" method.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any


class FileRewardFunction:
    """A reward function loaded from `path`; behaves like the function itself."""

    def __init__(self, path: str, name: str, fn: Callable[..., Any]) -> None:
        functools.update_wrapper(self, fn)
        self.path = path
        self.name = name
        self._fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def __reduce__(self):
        return (load_reward_function, (self.path, self.name))

    def __repr__(self) -> str:
        return f"FileRewardFunction(path={self.path!r}, name={self.name!r})"


def _module_name(path: str) -> str:
    digest = hashlib.sha1(path.encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() else "_" for c in os.path.splitext(os.path.basename(path))[0])
    return f"_verl_custom_reward_{stem}_{digest}"


def load_reward_function(path: str, name: str = "compute_score") -> Callable[..., Any]:
    """Import `path` and return its callable attribute `name`.

    Raises:
        FileNotFoundError: `path` is not an existing file.
        ImportError: importing the file failed (the original error is chained).
        AttributeError: the file defines nothing called `name`.
        TypeError: `name` exists but is not callable.
    """
    abs_path = os.path.abspath(os.path.expanduser(str(path)))
    if not os.path.isfile(abs_path):
        raise FileNotFoundError(
            f"custom reward function file not found: {path!r} (resolved to {abs_path!r}); "
            "point the reward function path at an existing .py file"
        )
    module_name = _module_name(abs_path)
    spec = importlib.util.spec_from_file_location(module_name, abs_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {abs_path!r} as a Python module (is it a .py file?)")
    module = importlib.util.module_from_spec(spec)
    # Registered before executing so that dataclasses and pickling inside the file work.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ImportError(
            f"importing custom reward function file {abs_path!r} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not hasattr(module, name):
        available = sorted(
            attr
            for attr, value in vars(module).items()
            if callable(value) and not attr.startswith("_") and not isinstance(value, type)
        )
        raise AttributeError(
            f"custom reward function file {abs_path!r} defines no {name!r}; "
            f"callables it defines: {available or 'none'}"
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise TypeError(
            f"{name!r} in custom reward function file {abs_path!r} is a "
            f"{type(fn).__name__}, not a callable"
        )
    return FileRewardFunction(abs_path, name, fn)
