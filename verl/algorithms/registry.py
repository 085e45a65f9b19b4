"""A tiny name -> object registry used by every algorithm extension point.

Advantage estimators, policy losses, KL estimators, loss-aggregation modes and KL controllers
are each kept in a :class:`Registry`. Adding an algorithm is one decorated function::

    ADVANTAGE_ESTIMATORS = Registry("advantage estimator")

    @ADVANTAGE_ESTIMATORS.register("my_estimator", needs_index=True)
    def my_estimator(token_level_rewards, response_mask, index, **kwargs): ...

``get(name)`` raises :class:`UnknownNameError` that lists the registered names and, when the
name looks like a typo, suggests the closest one. Entries may carry metadata (keyword
arguments of ``register``) that callers read with :meth:`Registry.info`, e.g. whether an
advantage estimator needs a critic.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

__all__ = ["Registry", "UnknownNameError"]


class UnknownNameError(KeyError, ValueError):
    """Raised when a name is not registered.

    Subclasses both ``KeyError`` (a failed lookup) and ``ValueError`` (a bad config value) so
    either ``except`` clause catches it. ``str()`` is the plain message (a bare ``KeyError``
    would wrap it in quotes).
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Maps names (and aliases) to objects, with optional per-entry metadata.

    Args:
        kind: what the registry holds, used in error messages ("advantage estimator").
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._info: dict[str, dict[str, Any]] = {}
        self._canonical: dict[str, str] = {}  # alias or name -> canonical name

    def register(self, name: str, *aliases: str, **info: Any) -> Callable[[T], T]:
        """Decorator registering an object under ``name`` (and ``aliases``).

        Keyword arguments are stored as metadata, returned by :meth:`info`. Registering a
        name twice raises ``ValueError`` (silently replacing an algorithm hides bugs).
        """

        def decorator(obj: T) -> T:
            for key in (name, *aliases):
                if key in self._canonical:
                    raise ValueError(
                        f"{self.kind} {key!r} is already registered "
                        f"(as {self._canonical[key]!r}); pick another name"
                    )
            self._entries[name] = obj
            self._info[name] = dict(info)
            for key in (name, *aliases):
                self._canonical[key] = name
            return obj

        return decorator

    def canonical_name(self, name: str) -> str:
        """The registered name behind ``name`` (resolves aliases); raises if unknown."""
        try:
            return self._canonical[name]
        except (KeyError, TypeError):
            raise UnknownNameError(self._unknown_message(name)) from None

    def get(self, name: str) -> T:
        """The object registered under ``name`` or one of its aliases."""
        return self._entries[self.canonical_name(name)]

    def info(self, name: str) -> dict[str, Any]:
        """A copy of the metadata registered with ``name``."""
        return dict(self._info[self.canonical_name(name)])

    def names(self, include_aliases: bool = False) -> list[str]:
        """Sorted registered names (optionally with aliases)."""
        return sorted(self._canonical if include_aliases else self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._canonical

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def _unknown_message(self, name: object) -> str:
        known = self.names(include_aliases=True)
        msg = f"unknown {self.kind} {name!r}; available: {', '.join(known)}"
        if isinstance(name, str):
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            if close:
                msg += f". Did you mean {close[0]!r}?"
        return msg
