"""Validation of a whole config before any worker starts: every problem, reported at once.

``validate(cfg)`` resolves what the config leaves to be resolved on ``cfg`` itself, then
type-checks a rebuilt copy and runs the semantic checks of its class; problems raise one
``ConfigError``, oddities are logged warnings. Nothing is loaded: files are tested for
existence, packages with ``find_spec``.

The semantic checks of a config class live next to the feature that reads the config (the
RL run's in ``verl.trainer.rl.config_checks``, the offline trainers' in
``verl.trainer.offline.config_checks``) and are registered by import string in
``verl.registry.CONFIG_CHECKS`` under the class's name, as :class:`ConfigChecks`: the
config imports none of them, and asks the registry when it validates, so that
``load_config`` and ``cfg.validate()`` run every check whether or not the trainer was
imported. A class with no entry gets its field bounds checked. The list of checks is kept
in ``docs/config.md`` ("Validation").
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from verl.config.checks import Checks
from verl.config.load import ConfigProblem, build, report
from verl.registry import CONFIG_CHECKS

__all__ = ["ConfigChecks", "config_problems", "validate", "validate_tree"]

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


def _bounds_only(
    cfg: Any, *, registries: Mapping[str, Iterable[str]] | None = None, skip_paths: Any = ()
) -> Problems:
    checks = Checks(skip_paths)
    checks.fields(cfg)
    return checks.problems, checks.warnings


def checks_of(cls: type) -> ConfigChecks:
    """The :class:`ConfigChecks` registered for the config class ``cls`` (its field bounds
    alone when none is)."""
    name = cls.__name__
    return CONFIG_CHECKS.get(name) if name in CONFIG_CHECKS else ConfigChecks(_bounds_only)


def validate(cfg: Any, registries: Mapping[str, Iterable[str]] | None = None) -> list[str]:
    """Check ``cfg``; raise ``ConfigError`` listing every problem; return (and log) warnings.
    ``registries`` adds ``{key path: allowed names}`` checks (the registry-backed keys are
    always checked against the live ``verl.registry``)."""
    if isinstance(cfg, type) or not dataclasses.is_dataclass(cfg):
        raise TypeError(f"validate() takes a config object, got {type(cfg).__name__}")
    checks = checks_of(type(cfg))
    if checks.resolve is not None:
        # an ill-typed key leaves its part unresolved: the checks below name it
        with contextlib.suppress(AttributeError, TypeError):
            checks.resolve(cfg)
    return validate_tree(cfg, checks.problems, registries)


def validate_tree(
    cfg: Any, problems_of: Callable[..., Problems], registries: Any = None
) -> list[str]:
    """Type-check ``cfg`` strictly, then ``problems_of(cfg, registries=, skip_paths=)``; raise
    one ``ConfigError`` for every problem, else log and return the warnings."""
    built, problems, bad_paths = build(type(cfg), cfg, strict=True)
    more, warnings = problems_of(built, registries=registries, skip_paths=bad_paths)
    return report(problems + more, warnings)


def config_problems(
    cfg: Any,
    *,
    registries: Mapping[str, Iterable[str]] | None = None,
    skip_paths: Collection[str] = (),
) -> Problems:
    """The registered checks of ``cfg``'s class on a freshly loaded tree (``load_validated``):
    resolved in place, then checked."""
    checks = checks_of(type(cfg))
    if checks.resolve is not None:
        with contextlib.suppress(AttributeError, TypeError):
            checks.resolve(cfg)
    return checks.problems(cfg, registries=registries, skip_paths=skip_paths)
