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
from collections.abc import Callable
from typing import Any

from verl.utils.file_import import load_callable


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


def load_reward_function(path: str, name: str = "compute_score") -> Callable[..., Any]:
    """Import `path` and return its callable attribute `name`.

    Raises:
        FileNotFoundError: `path` is not an existing file.
        ImportError: importing the file failed (the original error is chained).
        AttributeError: the file defines nothing called `name`.
        TypeError: `name` exists but is not callable.
    """
    abs_path, fn = load_callable(
        path,
        name,
        "custom reward function file",
        "point the reward function path (custom_reward_function.path) at an existing .py file",
    )
    return FileRewardFunction(abs_path, name, fn)
