"""Loading a config: YAML + dotted overrides + a strict typed build with "did you mean".

:func:`load_validated` is the whole path: the dataclasses' defaults, the user's YAML file (a
partial tree), the overrides in order (Hydra syntax ``a.b.c=value``; keys must exist, ``+key``
only on an existing key, ``~key`` rejected), built by :func:`build` and checked. YAML follows
1.2 for scalars: ``1e-6`` is a float, only ``true``/``false`` are booleans. The build accepts
ints for floats and, when loading, numbers for strings and a string for a list of strings;
nothing else is coerced. "Check" mode (``strict=True``, ``validate`` on objects built in
Python) wants section instances. Every problem is raised together as one ``ConfigError``.

This loader reads the native spellings. Other spellings (upstream verl's keys, the
tutorials' aliases, torch dtypes, ``TrainerConfig``'s flat keywords) are read by the input
adapters registered in ``verl.registry.CONFIG_ADAPTERS`` (:func:`input_adapter`), whose
built-in entries live in ``verl.compat``, the layer above: the user's tree and each
override pass through them before the typed build, and an enumerated value through the
``value`` adapter when the build does not recognise it.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import os
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

from verl.registry import CONFIG_ADAPTERS
from verl.utils.import_path import NotImportableError
from verl.utils.yaml_text import AliasExpansionError, load_yaml_text, parse_value, show

logger = logging.getLogger(__name__)

C = TypeVar("C")
_INVALID = object()

# --------------------------------------------------------------------------- problems


@dataclass(frozen=True)
class ConfigProblem:
    """One problem: its key path, a message naming the value and the fix, and every key path
    it involves (a check involving a key that already failed its type check is dropped)."""

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


# --------------------------------------------------------------------------- YAML


def to_yaml(cfg: Any, *, comments: bool = False) -> str:
    """The config as block YAML that reads back to an equal config; ``comments``: every key
    preceded by its help text."""
    lines: list[str] = []
    _emit(cfg, 0, lines, comments)
    return "\n".join(lines) + "\n"


def _emit(obj: Any, depth: int, lines: list[str], comments: bool, prefix: str = "") -> None:
    pad = "  " * depth
    hints = field_types(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if comments and depth == 0 and lines:
            lines.append("")
        if comments:
            lines.append(f"{pad}# {f.metadata['help']}")
        if section_class(hints[f.name]) is not None and dataclasses.is_dataclass(value):
            lines.append(f"{pad}{f.name}:")
            _emit(value, depth + 1, lines, comments, f"{prefix}{f.name}.")
        else:
            try:
                text = show(value, exact=True)
            except NotImportableError as exc:
                key = f"{prefix}{f.name}"
                message = (
                    f"{key} cannot be written as YAML (the run's config and checkpoints): {exc}"
                )
                raise ConfigError([ConfigProblem(key, message, (key,))]) from exc
            lines.append(f"{pad}{f.name}: {text}")


# --------------------------------------------------------------------------- typed build


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Resolved annotations of a dataclass's fields."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """``X | None`` -> ``(X, True)``; any other type -> ``(tp, False)``."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) < len(typing.get_args(tp)):
            inner = args[0] if len(args) == 1 else Union[tuple(args)]  # noqa: UP007
            return inner, True
    return tp, False


def section_class(tp: Any) -> type | None:
    """The dataclass a field holds (through ``| None``), or None for a leaf."""
    inner, _ = unwrap_optional(tp)
    return inner if isinstance(inner, type) and dataclasses.is_dataclass(inner) else None


def iter_schema(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """Every field of the tree, depth first: ``(dotted path, field, type)``; sections too."""
    hints = field_types(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        yield path, f, hints[f.name]
        sub = section_class(hints[f.name])
        if sub is not None:
            yield from iter_schema(sub, path + ".")


@functools.cache
def schema_paths(cls: type) -> frozenset[str]:
    """Every dotted key path of the schema ``cls`` (sections too)."""
    return frozenset(path for path, _, _ in iter_schema(cls))


def get_path(obj: Any, path: str) -> Any:
    """The value at dotted ``path`` of a config object."""
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def describe_type(tp: Any) -> str:
    """A short human name of a schema type: ``int``, ``list[str]``, ``"a" | "b"``, ..."""
    inner, nullable = unwrap_optional(tp)
    origin = typing.get_origin(inner)
    if origin is Literal:
        text = " | ".join(f'"{a}"' for a in typing.get_args(inner))
    elif origin is list:
        text = f"list[{describe_type(typing.get_args(inner)[0])}]"
    elif origin is dict:
        text = "mapping"
    elif section_class(inner) is not None:
        text = "section"
    elif inner is Any:
        text = "any"
    else:
        text = getattr(inner, "__name__", str(inner))
    return f"{text} | null" if nullable else text


def suggest(key: str, cls: type, root: type, prefix: str = "") -> str:
    """A "did you mean ...?" hint for an unknown ``key`` in section ``cls`` at ``prefix``: the
    same name elsewhere in the tree, else the closest key of the section, else anywhere."""
    everywhere = [(p, p.rsplit(".", 1)[-1]) for p, _, _ in iter_schema(root)]
    same = [p for p, name in everywhere if name == key]
    if not same:
        local = difflib.get_close_matches(key, list(field_types(cls)), n=1, cutoff=0.6)
        same = [f"{prefix}{name}" for name in local]
    if not same:
        close = set(difflib.get_close_matches(key, [n for _, n in everywhere], n=2, cutoff=0.8))
        same = [p for p, name in everywhere if name in close]
    if same:
        return "; did you mean " + " or ".join(same[:3]) + "?"
    return "; valid keys here: " + ", ".join(field_types(cls))


class _Builder:
    """Collects problems while converting one tree."""

    def __init__(self, root: type, strict: bool) -> None:
        self.root, self.strict = root, strict
        self.problems: list[ConfigProblem] = []
        self.bad_paths: set[str] = set()

    def fail(self, path: str, message: str) -> object:
        self.problems.append(ConfigProblem(path, message, (path,)))
        self.bad_paths.add(path)
        return _INVALID

    def section(self, cls: type, value: Any, path: str, base: Any = None) -> Any:
        """An instance of dataclass ``cls`` from a mapping or an instance; keys a mapping
        leaves out come from ``base`` (the parent field's default), else ``cls()``."""
        prefix = f"{path}." if path else ""
        if isinstance(value, cls):
            items = {f.name: getattr(value, f.name) for f in dataclasses.fields(cls)}
        elif isinstance(value, Mapping) and not self.strict:
            items = dict(value)
            for key in (k for k in items if k not in field_types(cls)):
                hint = suggest(str(key), cls, self.root, prefix)
                message = f"{prefix}{key}: unknown key in {path or 'the top level'}{hint}"
                self.problems.append(ConfigProblem(f"{prefix}{key}", message, (f"{prefix}{key}",)))
        else:
            expected = f"a {cls.__name__} instance" if self.strict else "a mapping of keys"
            hint = getattr(cls, "not_a_section_hint", lambda _: "")(value)  # e.g. ToolConfig
            self.fail(
                path, f"{path or 'config'}={show(value)}: expected {expected} (a section){hint}"
            )
            return cls()
        defaults = base if isinstance(base, cls) else cls()
        kwargs = {
            name: self.convert(items[name], tp, prefix + name, getattr(defaults, name))
            for name, tp in field_types(cls).items()
            if name in items
        }
        return dataclasses.replace(
            defaults, **{k: v for k, v in kwargs.items() if v is not _INVALID}
        )

    def convert(self, value: Any, tp: Any, path: str, default: Any = None) -> Any:
        inner, nullable = unwrap_optional(tp)
        if value is None:
            if nullable or inner is Any:
                return None
            return self.fail(path, f"{path}=null: not allowed; expected {describe_type(tp)}")
        if isinstance(value, str) and value.startswith("${") and value.endswith("}"):
            return self.fail(
                path,
                f"{path}={show(value)}: ${{...}} interpolation is not supported (verl reads "
                "YAML without OmegaConf, see docs/config.md); write the value itself",
            )
        if section_class(inner) is not None:
            return self.section(inner, value, path, default)
        origin = typing.get_origin(inner)
        if origin is Literal:
            return self._literal(value, inner, path)
        if origin is list:
            return self._list(value, inner, path)
        if origin is dict:
            if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
                return self.fail(path, f"{path}={show(value)}: expected a mapping with string keys")
            value_tp = typing.get_args(inner)[1]
            out = {k: self.convert(v, value_tp, f"{path}.{k}") for k, v in value.items()}
            return _INVALID if _INVALID in out.values() else out
        return self._scalar(value, inner, path)

    def _scalar(self, value: Any, tp: Any, path: str) -> Any:
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if tp is Any or (tp is bool and isinstance(value, bool)):
            return value
        if (tp is int and is_number and isinstance(value, int)) or (
            tp is str and isinstance(value, str)
        ):
            return value
        if tp is float and is_number:
            return value if self.strict else float(value)
        if tp is str and is_number and not self.strict:
            return str(value)
        hint = ""
        if isinstance(value, str) and tp in (int, float) and _is_number(value):
            hint = " (write the number without quotes)"
        elif tp is bool:
            hint = " (use true or false)"
        elif tp is int and isinstance(value, float):
            hint = " (use a whole number, e.g. 8 not 8.0)"
        return self.fail(
            path, f"{path}={show(value)}: expected {describe_type(tp)}, got {_kind(value)}{hint}"
        )

    def _literal(self, value: Any, tp: Any, path: str) -> Any:
        choices = typing.get_args(tp)
        if isinstance(value, str) and value in choices:
            return value
        spelled = input_adapter("value")  # e.g. "bfloat16" where bf16 is meant (verl.compat)
        named = None if spelled is None or self.strict else spelled(path, value, choices)
        if named in choices:
            return named
        names = ", ".join(choices)
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        return self.fail(path, f"{path}={show(value)}: must be one of {names}{hint}")

    def _list(self, value: Any, tp: Any, path: str) -> Any:
        elem_tp = typing.get_args(tp)[0]
        if isinstance(value, str) and elem_tp is str and not self.strict:
            value = [value]
        ok_types = list if self.strict else (list, tuple)
        if not isinstance(value, ok_types):
            return self.fail(
                path, f"{path}={show(value)}: expected {describe_type(tp)}, got {_kind(value)}"
            )
        out = [self.convert(v, elem_tp, f"{path}[{i}]") for i, v in enumerate(value)]
        if _INVALID in out:
            self.bad_paths.add(path)
            return _INVALID
        return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _kind(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string"}
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return names.get(type(value), type(value).__name__)


def init_fields(obj: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """What a dataclass's generated ``__init__`` does, for a config class that defines its
    own: each field of ``obj`` from ``args`` (in field order) or ``kwargs``, else its
    default; an extra, unknown or repeated argument raises ``TypeError`` naming it."""
    name, fields = type(obj).__name__, dataclasses.fields(obj)
    if len(args) > len(fields):
        raise TypeError(f"{name}() takes {len(fields)} positional arguments, {len(args)} given")
    values = {f.name: value for f, value in zip(fields, args)}
    for key, value in kwargs.items():
        if key in values:
            raise TypeError(f"{name}() got multiple values for argument {key!r}")
        if key not in field_types(type(obj)):
            hint = suggest(key, type(obj), type(obj))
            raise TypeError(f"{name}() got an unexpected keyword argument {key!r}{hint}")
        values[key] = value
    for f in fields:
        if f.name in values:
            value = values[f.name]
        else:
            value = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        setattr(obj, f.name, value)


def build(
    cls: type[C], data: Any, *, strict: bool = False
) -> tuple[C, list[ConfigProblem], set[str]]:
    """The one place a raw user tree enters the typed build: ``data`` converted into ``cls``,
    the problems and the failed key paths. Missing keys and failed leaves keep the
    dataclasses' defaults (the generated YAML files are never read)."""
    builder = _Builder(cls, strict)
    obj = builder.section(cls, data, "")
    return obj, builder.problems, builder.bad_paths


# --------------------------------------------------------------------------- load


def input_adapter(hook: str) -> Callable[..., Any] | None:
    """The input adapter registered for ``hook`` in ``verl.registry.CONFIG_ADAPTERS``
    (``loading``, ``value``, ``keywords``; built-in: ``verl.compat``), or None."""
    return CONFIG_ADAPTERS.get(hook) if hook in CONFIG_ADAPTERS else None


class NativeSpellings:
    """The loading adapter when none is registered: every key and value as written."""

    def tree(self, tree: dict[str, Any], refused: list[str]) -> dict[str, Any]:
        return tree

    def override(self, key: str, value: Any, refused: list[tuple[str, str]]) -> list[Any]:
        return [(key, value)]


def loading_adapter(root: type) -> Any:
    """One load's adapter of other spellings for the schema ``root``: ``.tree(tree,
    refused)`` gives the user tree in native keys (appending each refused key's message to
    ``refused``), ``.override(key, value, refused)`` the native ``(key, value)`` assignments
    of one override (raising ``ValueError`` for a refused key; ``(native key, message)``
    appended for a spelling that disagrees with an earlier one of the same load)."""
    make = input_adapter("loading")
    return NativeSpellings() if make is None else make(root)


def load_validated(
    root: type[C],
    path: str | os.PathLike[str] | None,
    overrides: Iterable[str],
    check: Callable[[C, set[str]], tuple[list[ConfigProblem], list[str]]],
) -> C:
    """``root``'s defaults + YAML file ``path`` + ``overrides``, raising one ``ConfigError``;
    ``check(cfg, bad_paths)`` gives the semantic problems and warnings (logged)."""
    problems: list[ConfigProblem] = []
    tree = (read_user_yaml(Path(path), problems) if path is not None else None) or {}
    # the input adapters (verl.compat): other spellings mapped onto the schema; a refused
    # key is one problem, and the file's other keys are still read
    adapter = loading_adapter(root)
    refused: list[str] = []
    tree = adapter.tree(tree, refused)
    problems += [ConfigProblem("", message) for message in refused]
    for text in overrides:
        apply_override(tree, text, problems, root=root, adapter=adapter)
    cfg, build_problems, bad_paths = build(root, tree)
    checked, warnings = check(cfg, bad_paths)
    report(problems + build_problems + checked, warnings)
    return cfg


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as nested plain dicts/lists (deep copy); ``from_dict`` inverts it."""
    return dataclasses.asdict(cfg)


def report(problems: list[ConfigProblem], warnings: list[str]) -> list[str]:
    """Raise ``ConfigError`` listing ``problems`` if there are any; else log ``warnings``."""
    if problems:
        raise ConfigError(problems)
    for warning in warnings:
        logger.warning(warning)
    return warnings


def read_user_yaml(path: Path, problems: list[ConfigProblem]) -> dict[str, Any] | None:
    """The mapping in the YAML file ``path``, or ``None`` with a problem recorded."""
    data, error = None, "does not exist" if not path.is_file() else None
    if error is None:
        try:
            data = load_yaml_text(path.read_text())
        except AliasExpansionError as exc:
            error = f"is refused: {exc}"
        except yaml.YAMLError as exc:
            error = f"is not valid YAML: {exc}"
    if error is None and data is not None and not isinstance(data, dict):
        error = "must hold a mapping of sections"
    if error is not None:
        problems.append(ConfigProblem("", f"config file {str(path)!r} {error}"))
        return None
    return data or {}


def apply_override(
    tree: dict[str, Any],
    text: str,
    problems: list[ConfigProblem],
    root: type,
    adapter: Any = None,
) -> None:
    """Apply one ``key=value`` override to the dict ``tree`` (of schema ``root``) in place, or
    record a problem. The path is checked as it is walked (a typo gets a did-you-mean); a
    null section is created with its defaults when a key inside it is set. ``adapter`` (one
    load's :func:`loading_adapter`, default a new one) maps another spelling of the key onto
    the native keys it sets, refusing one that disagrees with another spelling of the same
    key, as a YAML file's keys are read."""
    key, sep, raw = text.partition("=")
    key = key.strip()

    def fail(path: str, why: str) -> None:
        problems.append(ConfigProblem(path, f"override {text!r}: {why}"))

    if key.startswith("~"):
        return fail(
            key[1:], "deleting keys is not supported; set the key to its default or to null instead"
        )
    if not sep or not key:
        return fail("", "expected key=value")
    plus, key = key.startswith("+"), key.lstrip("+")
    try:
        value = parse_value(raw)
    except yaml.YAMLError as exc:
        return fail(key, f"value is not valid YAML ({str(exc).splitlines()[0]})")
    adapter = loading_adapter(root) if adapter is None else adapter
    refused: list[tuple[str, str]] = []  # (native key, why), each one problem
    try:  # the same adapters as a YAML file's keys
        assignments = adapter.override(key, value, refused)
    except ValueError as exc:
        return fail(key, str(exc))
    problems += [ConfigProblem(native, message, (native,)) for native, message in refused]
    for native_key, native_value in assignments:
        _set_path(tree, native_key, native_value, text, problems, root, plus)


def _set_path(
    tree: dict[str, Any],
    key: str,
    value: Any,
    text: str,
    problems: list[ConfigProblem],
    root: type,
    plus: bool,
) -> None:
    """Set the dotted ``key`` of ``tree`` to ``value``, checking the path against ``root``."""
    parts, node, tp = key.split("."), tree, root
    for i, part in enumerate(parts):
        here, cls = ".".join(parts[: i + 1]), section_class(tp)
        if cls is not None and part not in field_types(cls):
            prefix = "".join(f"{p}." for p in parts[:i])
            message = f"{here}: unknown key (override {text!r})" + suggest(part, cls, root, prefix)
            if plus:
                message += (
                    "; '+' cannot add keys: the schema is fixed, and '+key=value' on an "
                    "existing key is just a plain override"
                )
            problems.append(ConfigProblem(here, message, (here,)))
            return
        if cls is not None:
            tp = field_types(cls)[part]
        elif tp is not Any:  # a free-form mapping such as model.override_config
            tp = typing.get_args(unwrap_optional(tp)[0])[1]
        if i == len(parts) - 1:
            node[part] = value
            return
        inner = unwrap_optional(tp)[0]
        if not (section_class(inner) or typing.get_origin(inner) is dict or inner is Any):
            message = f"override {text!r}: {here} is a value, not a section; set it with {here}=..."
            problems.append(ConfigProblem(here, message, (here,)))
            return
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
