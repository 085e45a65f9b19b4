"""The one registry type behind every extension point: name -> entry, with declared needs.

An :class:`Entry` is what a name stands for: its target (an object, or a ``"module:attr"``
string imported on first use), its aliases, what it *needs* (``info``: e.g. whether an
advantage estimator needs a critic) and its named *hyperparameters* with their defaults.
The registry declares which ``needs`` keys its entries may state (with defaults) and which
arguments its call site passes itself (``inputs``); every other keyword parameter of a
target with a default is a hyperparameter that the config may set through an open mapping
such as ``algorithm.adv_estimator_kwargs``.

One duplicate-name rule everywhere: registering a name or alias that is already bound to a
*different* target raises ``ValueError`` unless ``override=True`` (which replaces the entry);
registering the same target again under the same name is a no-op.

This module imports nothing of verl and nothing heavy: names, aliases and needs of lazy
entries are known without importing their targets, so the config can be validated against
the registries without torch. Hyperparameters come from the target's signature, so asking
for them imports a lazy target.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["Entry", "Registry", "UnknownNameError"]

_MISSING = object()


class UnknownNameError(KeyError, ValueError):
    """Raised when a name is not registered.

    Subclasses both ``KeyError`` (a failed lookup) and ``ValueError`` (a bad config value) so
    either ``except`` clause catches it. ``str()`` is the plain message (a bare ``KeyError``
    would wrap it in quotes).
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def did_you_mean(name: object, known: Iterable[str]) -> str | None:
    """The closest of ``known`` to ``name`` when it looks like a typo, else None."""
    if not isinstance(name, str):
        return None
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return close[0] if close else None


class Entry(Generic[T]):
    """One registered name: target (possibly lazy), aliases, needs and hyperparameters."""

    def __init__(
        self,
        registry: Registry[T],
        name: str,
        target: T | str,
        aliases: tuple[str, ...],
        info: dict[str, Any],
    ) -> None:
        self.registry = registry
        self.name = name
        self.aliases = aliases
        self.info = info
        self._target: Any = target

    @property
    def lazy(self) -> bool:
        """Whether the target is still an unimported ``"module:attr"`` string."""
        return isinstance(self._target, str)

    @property
    def target(self) -> T:
        """The registered object (imports a lazy ``"module:attr"`` target the first time)."""
        if isinstance(self._target, str):
            module_name, _, attr = self._target.partition(":")
            try:
                obj = getattr(importlib.import_module(module_name), attr)
            except (ImportError, AttributeError) as exc:
                raise ImportError(
                    f"{self.registry.kind} {self.name!r} is registered as {self._target!r}, "
                    f"which cannot be imported: {exc}"
                ) from exc
            self._target = obj
        return self._target

    def _signature(self) -> inspect.Signature | None:
        try:
            return inspect.signature(self.target)
        except (TypeError, ValueError):  # builtins without a signature
            return None

    @property
    def hyperparameters(self) -> dict[str, Any]:
        """``{name: default}`` of the target's keyword parameters that the call site does
        not pass itself (imports a lazy target)."""
        sig = self._signature()
        if sig is None:
            return {}
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        return {
            p.name: p.default
            for p in sig.parameters.values()
            if p.kind in kinds
            and p.default is not inspect.Parameter.empty
            and p.name not in self.registry.inputs
        }

    def accepts(self, arg: str) -> bool:
        """Whether the target takes keyword ``arg`` (always, when it has ``**kwargs``)."""
        sig = self._signature()
        if sig is None:
            return True
        params = sig.parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return True
        p = params.get(arg)
        return p is not None and p.kind is not inspect.Parameter.POSITIONAL_ONLY

    def kwargs_problems(self, kwargs: Mapping[str, Any], key: str) -> list[str]:
        """Why ``kwargs`` (the config mapping at ``key``) cannot go to this entry, if at all.

        A key must be one of the entry's hyperparameters; a key the call site passes
        itself is pointed at the config key that sets it.
        """
        allowed = self.hyperparameters
        problems = []
        for arg in kwargs:
            if arg in allowed:
                continue
            source = self.registry.inputs.get(arg)
            if source is not None:
                problems.append(
                    f"{key}.{arg}: {self.registry.kind} {self.name!r} gets {arg!r} from "
                    f"{source}, not from {key}"
                )
                continue
            names = ", ".join(sorted(allowed)) or "none"
            hint = did_you_mean(arg, allowed)
            problems.append(
                f"{key}.{arg}: unknown hyperparameter of {self.registry.kind} {self.name!r}; "
                f"its hyperparameters are: {names}" + (f"; did you mean {hint}?" if hint else "")
            )
        return problems

    def call_kwargs(
        self, provided: Mapping[str, Any], kwargs: Mapping[str, Any] | None = None, key: str = ""
    ) -> dict[str, Any]:
        """The keyword arguments of a call: the ``provided`` call-site values this target
        takes, plus the validated hyperparameter overrides ``kwargs``.

        Raises ``ValueError`` naming every key of ``kwargs`` the entry does not declare.
        """
        kwargs = dict(kwargs or {})
        problems = self.kwargs_problems(kwargs, key or f"{self.registry.kind} kwargs")
        if problems:
            raise ValueError("; ".join(problems))
        out = {arg: value for arg, value in provided.items() if self.accepts(arg)}
        out.update(kwargs)
        return out

    def __repr__(self) -> str:
        return f"Entry({self.registry.kind!r}, {self.name!r}, info={self.info!r})"


class Registry(Generic[T]):
    """Maps names (and aliases) to :class:`Entry` objects.

    Args:
        kind: what the registry holds, used in error messages ("advantage estimator").
        needs: the ``info`` keys an entry may declare, with their defaults (e.g.
            ``{"needs_critic": False}``); ``None`` accepts any keys with no defaults.
        inputs: arguments the call site passes itself, each with where its value comes from
            (``{"gamma": "algorithm.gamma"}``); they are not hyperparameters.
    """

    def __init__(
        self,
        kind: str,
        *,
        needs: Mapping[str, Any] | None = None,
        inputs: Mapping[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self.need_defaults = None if needs is None else dict(needs)
        self.inputs: dict[str, str] = dict(inputs or {})
        self._entries: dict[str, Entry[T]] = {}
        self._canonical: dict[str, str] = {}  # alias or name -> canonical name

    # ------------------------------------------------------------------ registration
    def register(
        self, name: str, *aliases: str, override: bool = False, **info: Any
    ) -> Callable[[T], T]:
        """Decorator registering an object under ``name`` (and ``aliases``) with ``info``."""

        def decorator(obj: T) -> T:
            self.add(name, obj, *aliases, override=override, **info)
            return obj

        return decorator

    def add(
        self, name: str, target: T | str, *aliases: str, override: bool = False, **info: Any
    ) -> None:
        """Register ``target`` (an object or a lazy ``"module:attr"`` string) as ``name``.

        Raises ``ValueError`` if ``name`` or an alias is bound to another target (unless
        ``override=True``), ``TypeError`` for a ``needs`` key this registry does not know.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if isinstance(target, str) and (target.count(":") != 1 or target.startswith(":")):
            raise ValueError(
                f"{self.kind} {name!r}: a lazy target must be 'module:attr', got {target!r}"
            )
        if self.need_defaults is not None:
            unknown = sorted(set(info) - set(self.need_defaults))
            if unknown:
                raise TypeError(
                    f"{self.kind} {name!r}: unknown needs {unknown}; a {self.kind} may declare "
                    f"{', '.join(sorted(self.need_defaults)) or 'nothing'}"
                )
            info = {**self.need_defaults, **info}
        existing = self._entries.get(name)
        if existing is not None and not override and self._same(existing, target, aliases, info):
            return  # the same registration again (e.g. a module imported twice)
        for key in (name, *aliases):
            bound = self._canonical.get(key)
            if bound is None:
                continue
            if not override:
                raise ValueError(
                    f"{self.kind} {key!r} is already registered (as {bound!r}); pick another "
                    "name or pass override=True to replace it"
                )
            logger.info("%s %r re-registered (override=True)", self.kind, key)
            self.remove(bound)
        self._entries[name] = Entry(self, name, target, tuple(aliases), dict(info))
        for key in (name, *aliases):
            self._canonical[key] = name

    @staticmethod
    def _same(entry: Entry[T], target: Any, aliases: tuple[str, ...], info: dict) -> bool:
        return (
            (entry._target is target or entry._target == target)
            and entry.aliases == tuple(aliases)
            and entry.info == info
        )

    def remove(self, name: str) -> None:
        """Unregister ``name`` (or the entry an alias points to) and all its aliases."""
        canonical = self.canonical_name(name)
        entry = self._entries.pop(canonical)
        for key in (canonical, *entry.aliases):
            self._canonical.pop(key, None)

    def copy(self) -> Registry[T]:
        """An independent registry with the same entries (tests register into a copy)."""
        other: Registry[T] = Registry(self.kind, needs=self.need_defaults, inputs=self.inputs)
        for name, entry in self._entries.items():
            other._entries[name] = Entry(other, name, entry._target, entry.aliases, entry.info)
        other._canonical = dict(self._canonical)
        return other

    # ------------------------------------------------------------------ lookup
    def canonical_name(self, name: str) -> str:
        """The registered name behind ``name`` (resolves aliases); raises if unknown."""
        try:
            return self._canonical[name]
        except (KeyError, TypeError):
            raise UnknownNameError(self.unknown_message(name)) from None

    def entry(self, name: str) -> Entry[T]:
        """The :class:`Entry` registered under ``name`` or one of its aliases."""
        return self._entries[self.canonical_name(name)]

    def get(self, name: str) -> T:
        """The object registered under ``name`` or one of its aliases (imported if lazy)."""
        return self.entry(name).target

    def info(self, name: str) -> dict[str, Any]:
        """A copy of what entry ``name`` declared it needs (defaults filled in)."""
        return dict(self.entry(name).info)

    def needs(self, name: str, what: str, default: Any = False) -> Any:
        """``info(name)[what]``, or ``default`` when ``name`` is not registered (validation
        reports unknown names on its own; derived values must not fail before it)."""
        if name not in self:
            return default
        return self.entry(name).info.get(what, default)

    def hyperparameters(self, name: str) -> dict[str, Any]:
        """``{hyperparameter: default}`` of entry ``name`` (imports a lazy target)."""
        return self.entry(name).hyperparameters

    def names(self, include_aliases: bool = False) -> list[str]:
        """Sorted registered names (optionally with aliases)."""
        return sorted(self._canonical if include_aliases else self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._canonical

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"

    def unknown_message(self, name: object) -> str:
        """``unknown <kind> 'x'; available: a, b. Did you mean 'a'?``"""
        known = self.names(include_aliases=True)
        msg = f"unknown {self.kind} {name!r}; available: {', '.join(known)}"
        close = did_you_mean(name, known)
        if close:
            msg += f". Did you mean {close!r}?"
        return msg
