"""Build and type-check the dataclass tree (``build``), and walk the schema.

Conversion rules (mapping -> dataclass, "load" mode, used for YAML and overrides):
ints are accepted for floats; numbers are accepted for strings (``experiment_name=2024``);
a single string is accepted for a list of strings (``data.train_files=a.parquet``); nothing
else is coerced (``"8"`` is not an int, ``1.0`` is not an int, ``yes`` is not a bool).
"Check" mode (``strict=True``, used by ``validate`` on objects built in Python) only
accepts ints for floats, and requires nested sections to be their dataclass instances.
Every problem is collected; a leaf that fails keeps its default so the walk can go on.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, Literal, TypeVar, Union

from verl.config.errors import ConfigProblem
from verl.config.yaml_io import show

T = TypeVar("T")
_INVALID = object()


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
    """A "did you mean ...?" hint for an unknown ``key`` met in section ``cls`` at ``prefix``.

    A key of that exact name elsewhere in the tree wins (the user put it in the wrong
    section), then the closest key of the same section, then the closest key anywhere.
    """
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
        self.root = root
        self.strict = strict
        self.problems: list[ConfigProblem] = []
        self.bad_paths: set[str] = set()

    def fail(self, path: str, message: str) -> object:
        self.problems.append(ConfigProblem(path, message, (path,)))
        self.bad_paths.add(path)
        return _INVALID

    def section(self, cls: type, value: Any, path: str, base: Any = None) -> Any:
        """Build an instance of dataclass ``cls`` from a mapping or an instance.

        Keys a mapping leaves out take their values from ``base`` (the parent field's default,
        e.g. ``critic.optim`` has ``lr=1e-5``), or from ``cls()``.
        """
        prefix = f"{path}." if path else ""
        if isinstance(value, cls):
            items = {f.name: getattr(value, f.name) for f in dataclasses.fields(cls)}
        elif isinstance(value, Mapping) and not self.strict:
            items = dict(value)
            for key in items:
                if key not in field_types(cls):
                    where = path or "the top level"
                    self.problems.append(
                        ConfigProblem(
                            f"{prefix}{key}",
                            f"{prefix}{key}: unknown key in {where}"
                            + suggest(str(key), cls, self.root, prefix),
                            (f"{prefix}{key}",),
                        )
                    )
        else:
            expected = f"a {cls.__name__} instance" if self.strict else "a mapping of keys"
            self.fail(path, f"{path or 'config'}={show(value)}: expected {expected} (a section)")
            return cls()
        defaults = base if isinstance(base, cls) else cls()
        kwargs = {}
        for name, tp in field_types(cls).items():
            if name in items:
                converted = self.convert(items[name], tp, prefix + name, getattr(defaults, name))
                if converted is not _INVALID:
                    kwargs[name] = converted
        return dataclasses.replace(defaults, **kwargs)

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
        if tp is Any:
            return value
        if tp is bool and isinstance(value, bool):
            return value
        if tp is int and is_number and isinstance(value, int):
            return value
        if tp is float and is_number:
            return value if self.strict else float(value)
        if tp is str and isinstance(value, str):
            return value
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


def build(
    cls: type[T], data: Any, *, strict: bool = False
) -> tuple[T, list[ConfigProblem], set[str]]:
    """Convert ``data`` into ``cls``; return the tree, the problems, and the failed paths.

    Missing keys take their defaults (those of the dataclasses: nothing is read from the
    generated YAML files). Leaves that fail keep their defaults.
    """
    builder = _Builder(cls, strict)
    obj = builder.section(cls, data, "")
    return obj, builder.problems, builder.bad_paths
