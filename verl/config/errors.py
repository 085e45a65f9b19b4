"""``ConfigError``: every problem found in a config, reported together, one line each."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class ConfigProblem:
    """One problem: the key path it is about, and a message naming the value and the fix.

    ``keys`` lists every key path the problem involves (``path`` included); a check that
    involves a key whose value already failed its type check is not reported.
    """

    path: str
    message: str
    keys: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.message


class ConfigError(ValueError):
    """The config is invalid; ``.problems`` holds every problem, ``str()`` lists them."""

    def __init__(self, problems: Iterable[ConfigProblem]) -> None:
        self.problems = list(problems)
        super().__init__(self.render())

    def render(self) -> str:
        n = len(self.problems)
        if n == 1:
            return f"invalid config: {self.problems[0].message}"
        lines = [f"invalid config ({n} problems):"]
        lines += [f"  - {p.message}" for p in self.problems]
        return "\n".join(lines)
