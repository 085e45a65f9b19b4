"""Validation of a whole config before any worker starts: every problem, reported at once.

``validate(cfg)`` resolves what the config leaves to be resolved on ``cfg`` itself, then
type-checks a rebuilt copy and runs the semantic checks of its class; problems raise one
``ConfigError``, oddities are logged warnings. :func:`load_checked` runs the same checks on
a freshly loaded tree (``load_config``, ``load_sft_config`` ...). Nothing is loaded: files
are tested for existence, packages with ``find_spec``.

The semantic checks of a config class live next to the feature that reads the config (the
RL run's in ``verl.trainer.rl.config_checks``, the offline trainers' in
``verl.trainer.offline.config_checks``) and are registered by import string in
``verl.registry.CONFIG_CHECKS`` under the class's name, as :class:`ConfigChecks`: the
config imports none of them, and asks the registry when it validates, so that
``load_config`` and ``cfg.validate()`` run every check whether or not the trainer was
imported. A class with no entry gets its field bounds checked (:func:`bound_problems`, which
the registered checks run too). The list of checks is kept in ``docs/config.md``
("Validation").
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from verl.config.load import ConfigProblem, build, load_validated, report
from verl.registry import CONFIG_CHECKS
from verl.utils.yaml_text import show

__all__ = ["ConfigChecks", "Validated", "bound_problems", "is_skipped", "load_checked", "validate"]

C = TypeVar("C")

Problems = tuple[list[ConfigProblem], list[str]]


@dataclass(frozen=True)
class ConfigChecks:
    """The checks of one config class (an entry of ``verl.registry.CONFIG_CHECKS``).

    ``problems(cfg, registries=, skip_paths=)`` gives ``(problems, warnings)`` of a
    well-typed tree, leaving out checks that involve a key in ``skip_paths`` (one that
    failed its type check); ``registries`` are extra ``{key path: allowed names}`` checks.
    ``resolve(cfg)``, when given, writes in place what the config leaves unsaid and the run
    needs (the role keys the trainer-wide precision keys fill, ...): ``validate`` runs it on
    the user's config itself before checking it.
    """

    problems: Callable[..., Problems]
    resolve: Callable[[Any], None] | None = None


def bound_problems(
    obj: Any, inactive: Collection[str] = (), prefix: str = ""
) -> list[ConfigProblem]:
    """Every field of the dataclass tree ``obj`` outside the bounds declared with
    ``entry(..., ge=, gt=, le=, lt=, off=, nonempty=)`` (null passes); ``inactive`` sections
    are skipped."""
    found: list[ConfigProblem] = []
    for f in dataclasses.fields(obj):
        path, value, m = f"{prefix}{f.name}", getattr(obj, f.name), f.metadata
        if path in inactive or value is None:
            continue
        rule = None
        if dataclasses.is_dataclass(value):
            found += bound_problems(value, inactive, path + ".")
        elif m.get("nonempty") and isinstance(value, str) and not value.strip():
            rule = "must not be empty"
        elif isinstance(value, (int, float)) and value != m.get("off", value + 1):
            rule = _out_of_bounds(value, m)
        if rule is not None:
            found.append(ConfigProblem(path, f"{path}={show(value)}: {rule}", (path,)))
    return found


def _out_of_bounds(value: float, m: Mapping[str, Any]) -> str | None:
    """The rule ``value`` breaks of the bounds in field metadata ``m``, or None."""
    lo, hi = m.get("ge", m.get("gt")), m.get("le", m.get("lt"))
    above = lo is None or value > lo or (value == lo and "ge" in m)
    below = hi is None or value < hi or (value == hi and "le" in m)
    if above and below:
        return None
    if "off" in m:
        return f"must be {m['off']} (off) or >= {lo}"
    if lo is not None and hi is not None:
        left, right = "[" if "ge" in m else "(", "]" if "le" in m else ")"
        return f"must be in {left}{lo}, {hi}{right}"
    if lo is not None:
        return f"must be {'>=' if 'ge' in m else '>'} {lo}"
    return f"must be {'<=' if 'le' in m else '<'} {hi}"


def is_skipped(key: str, skip_paths: Collection[str]) -> bool:
    """Whether ``key`` or a section above it is in ``skip_paths`` (keys that failed their
    type check: a check involving one is left out)."""
    parts = key.split(".")
    return any(".".join(parts[: i + 1]) in skip_paths for i in range(len(parts)))


def _bounds_only(
    cfg: Any, *, registries: Mapping[str, Iterable[str]] | None = None, skip_paths: Any = ()
) -> Problems:
    skip = set(skip_paths)
    return [p for p in bound_problems(cfg) if not is_skipped(p.path, skip)], []


def resolved_checks(cfg: Any) -> ConfigChecks:
    """The :class:`ConfigChecks` registered for ``cfg``'s class (its field bounds alone when
    none is), after its ``resolve`` ran on ``cfg`` in place (an ill-typed key leaves its part
    unresolved: the checks name it)."""
    name = type(cfg).__name__
    checks = CONFIG_CHECKS.get(name) if name in CONFIG_CHECKS else ConfigChecks(_bounds_only)
    if checks.resolve is not None:
        with contextlib.suppress(AttributeError, TypeError):
            checks.resolve(cfg)
    return checks


def validate(cfg: Any, registries: Mapping[str, Iterable[str]] | None = None) -> list[str]:
    """Check ``cfg``; raise ``ConfigError`` listing every problem; return (and log) warnings.
    ``registries`` adds ``{key path: allowed names}`` checks (the registry-backed keys are
    always checked against the live ``verl.registry``). The checks see a strictly
    type-checked copy, leaving out the keys that failed their type check."""
    if isinstance(cfg, type) or not dataclasses.is_dataclass(cfg):
        raise TypeError(f"validate() takes a config object, got {type(cfg).__name__}")
    checks = resolved_checks(cfg)
    built, problems, bad_paths = build(type(cfg), cfg, strict=True)
    more, warnings = checks.problems(built, registries=registries, skip_paths=bad_paths)
    return report(problems + more, warnings)


def load_checked(
    root: type[C],
    path: str | os.PathLike[str] | None,
    overrides: Iterable[str],
    registries: Mapping[str, Iterable[str]] | None = None,
) -> C:
    """``root``'s defaults + YAML file ``path`` + dotted ``overrides`` (``load_validated``),
    resolved and checked by the checks registered for ``root`` (``registries``: extra
    ``{key path: allowed names}`` checks); raises one ``ConfigError``."""

    def check(cfg: C, bad_paths: set[str]) -> Problems:
        return resolved_checks(cfg).problems(cfg, registries=registries, skip_paths=bad_paths)

    return load_validated(root, path, overrides, check)


class Validated:
    """Base of the top-level config classes (``TrainerConfig``, ``SFTConfig``, ``DPOConfig``,
    ``RMConfig``): ``cfg.validate()``."""

    def validate(self, registries: Mapping[str, Iterable[str]] | None = None) -> list[str]:
        """Check the whole config; raise ``ConfigError`` listing every problem; return the
        warnings (also logged). ``registries`` adds ``{key path: allowed names}`` checks
        (a ``DPOConfig``'s trainer maps ``"algorithm.loss_type"`` to the registered losses).
        See :func:`verl.config.validate.validate`."""
        return validate(self, registries)
