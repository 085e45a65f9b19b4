"""``load_config``: schema defaults + a user YAML file + dotted overrides -> validated config.

Order of precedence (later wins): the defaults of the dataclasses, the user's YAML file (a
partial tree), then the overrides in the order given. The packaged
``verl/trainer/config/*.yaml`` files are generated from the dataclasses for reading; they
are not read back here.
Override syntax is Hydra's: ``a.b.c=value``, with ``value`` read as YAML 1.2 (see
``verl.config.yaml_io.parse_value``). Keys must exist in the schema: ``+a.b=value`` is
accepted only for an existing key (where it is a plain override), and ``~a.b`` is rejected.
Every problem (unknown keys, bad types, failed checks) is raised together as one
``ConfigError``.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import logging
import os
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from verl.compat.aliases import AliasError, translate_tree
from verl.config.convert import build, field_types, section_class, suggest, unwrap_optional
from verl.config.errors import ConfigError, ConfigProblem
from verl.config.schema import TrainerConfig
from verl.config.validate import report, semantic_problems
from verl.config.yaml_io import load_yaml_text, parse_value

logger = logging.getLogger(__name__)

DEFAULT_CONFIG = "ppo_trainer.yaml"

C = TypeVar("C")


def default_config_text(name: str = DEFAULT_CONFIG) -> str:
    """The packaged (generated) defaults YAML, for reading and for the in-sync tests."""
    return importlib.resources.files("verl").joinpath("trainer", "config", name).read_text()


def from_dict(data: Mapping[str, Any], cls: type[C] = TrainerConfig) -> C:
    """Build a config (``TrainerConfig`` by default) from nested dicts; checks types only.

    Missing keys take their defaults, so a partial tree is fine.

    Raises ``ConfigError`` listing every unknown key and wrongly typed value. Use
    ``load_config`` or ``cfg.validate()`` for the full validation.
    """
    obj, problems, _ = build(cls, data)
    if problems:
        raise ConfigError(problems)
    return obj


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as nested plain dicts/lists (deep copy); ``from_dict`` inverts it."""
    return dataclasses.asdict(cfg)


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Iterable[str] = (),
    *,
    registries: Mapping[str, Iterable[str]] | None = None,
) -> TrainerConfig:
    """Load, override and validate a config.

    Args:
        path: optional user YAML file, a partial tree merged over the defaults.
        overrides: dotted ``key=value`` strings, e.g. ``["actor_rollout_ref.actor.optim.lr=1e-6"]``.
        registries: optional ``{key path: allowed names}`` checked too (see ``validate``).

    Raises:
        ConfigError: listing every problem found.
    """
    return load_validated(
        TrainerConfig,
        path,
        overrides,
        lambda cfg, bad_paths: semantic_problems(cfg, registries=registries, skip_paths=bad_paths),
    )


def load_validated(
    root: type[C],
    path: str | os.PathLike[str] | None,
    overrides: Iterable[str],
    check: Callable[[C, set[str]], tuple[list[ConfigProblem], list[str]]],
) -> C:
    """``root``'s defaults + YAML file ``path`` + ``overrides`` -> ``root``.

    ``check(cfg, bad_paths)`` returns the semantic problems and warnings of the built config
    (``bad_paths``: keys that failed to convert, to skip). Every problem is raised together
    as one ``ConfigError``; warnings are logged.
    """
    tree: dict[str, Any] = {}
    problems: list[ConfigProblem] = []
    if path is not None:
        user = read_user_yaml(Path(path), problems)
        if user is not None:
            try:  # verl.compat: the tutorials' keys and torch dtypes, mapped onto the schema
                tree = merge(tree, translate_tree(user, root.__name__))
            except AliasError as exc:
                problems.append(ConfigProblem("", str(exc)))
    for text in overrides:
        apply_override(tree, text, problems, root=root)
    cfg, build_problems, bad_paths = build(root, tree)
    problems += build_problems
    checked, warnings = check(cfg, bad_paths)
    report(problems + checked, warnings)
    return cfg


def read_user_yaml(path: Path, problems: list[ConfigProblem]) -> dict[str, Any] | None:
    """The mapping in the YAML file ``path``, or ``None`` with a problem recorded."""
    if not path.is_file():
        problems.append(ConfigProblem("", f"config file {str(path)!r} does not exist"))
        return None
    try:
        data = load_yaml_text(path.read_text())
    except yaml.YAMLError as exc:
        problems.append(ConfigProblem("", f"config file {str(path)!r} is not valid YAML: {exc}"))
        return None
    if data is None:
        return {}
    if not isinstance(data, dict):
        problems.append(
            ConfigProblem("", f"config file {str(path)!r} must hold a mapping of sections")
        )
        return None
    return data


def merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``update`` into a copy of ``base``; mappings merge, anything else replaces."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_override(
    tree: dict[str, Any], text: str, problems: list[ConfigProblem], root: type = TrainerConfig
) -> None:
    """Apply one ``key=value`` override to the dict ``tree`` (of schema ``root``) in place, or
    record a problem.

    The key path is checked against the schema as it is walked, so a typo is reported with
    the override that contained it and a did-you-mean. A section that is null (e.g.
    ``fsdp_config.mixed_precision``) is created with its defaults when a key inside it is set.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if key.startswith("~"):
        problems.append(
            ConfigProblem(
                key[1:],
                f"override {text!r}: deleting keys is not supported; set the key to its "
                "default or to null instead",
            )
        )
        return
    if not sep or not key:
        problems.append(ConfigProblem("", f"override {text!r}: expected key=value"))
        return
    plus = key.startswith("+")
    key = key.lstrip("+")
    try:
        value = parse_value(raw)
    except yaml.YAMLError as exc:
        first_line = str(exc).splitlines()[0]
        problems.append(
            ConfigProblem(key, f"override {text!r}: value is not valid YAML ({first_line})")
        )
        return

    parts = key.split(".")
    node: dict[str, Any] = tree
    tp: Any = root
    for i, part in enumerate(parts):
        cls = section_class(tp)
        if cls is not None:
            if part not in field_types(cls):
                problems.append(
                    _unknown(text, ".".join(parts[: i + 1]), part, cls, root, plus, parts[:i])
                )
                return
            tp = field_types(cls)[part]
        elif tp is not Any:  # a free-form mapping such as model.override_config
            tp = typing.get_args(unwrap_optional(tp)[0])[1]
        if i == len(parts) - 1:
            node[part] = value
            return
        if not _is_mapping_type(tp):
            here = ".".join(parts[: i + 1])
            problems.append(
                ConfigProblem(
                    here,
                    f"override {text!r}: {here} is a value, not a section; set it with {here}=...",
                    (here,),
                )
            )
            return
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]


def _is_mapping_type(tp: Any) -> bool:
    inner = unwrap_optional(tp)[0]
    return section_class(inner) is not None or typing.get_origin(inner) is dict or inner is Any


def _unknown(
    text: str, path: str, key: str, cls: type, root: type, plus: bool, parents: list[str]
) -> ConfigProblem:
    prefix = "".join(f"{p}." for p in parents)
    message = f"{path}: unknown key (override {text!r})" + suggest(key, cls, root, prefix)
    if plus:
        message += (
            "; '+' cannot add keys: the schema is fixed, and '+key=value' on an existing key "
            "is just a plain override"
        )
    return ConfigProblem(path, message, (path,))
