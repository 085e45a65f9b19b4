"""YAML as verl's configs read and write it: YAML 1.2 scalars, a bound on alias expansion,
and values shown as the user would write them (in messages of the config and its checks).

:class:`ConfigLoader` is a safe loader where only ``true``/``false`` are booleans and
``1e-6`` is a float, and a document whose aliases would expand it past
:data:`MAX_ALIAS_EXPANSION` values is refused; :class:`ConfigDumper` quotes exactly the
strings that loader would not read back. :func:`show` is a value in a message (cut to
:data:`SHOW_LIMIT` characters), :func:`plain` a value as YAML can write it.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Mapping
from typing import Any

import yaml

from verl.utils.import_path import NotImportableError, import_path

_BOOL_TAG = "tag:yaml.org,2002:bool"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_BOOL_RE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
# Floats with an exponent and no dot (``1e-6``, ``5E3``); dotted forms are resolved by PyYAML.
_EXP_FLOAT_RE = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")


def _use_yaml12_scalars(cls: type) -> None:
    resolvers = {
        first: [(tag, regexp) for tag, regexp in entries if tag != _BOOL_TAG]
        for first, entries in cls.yaml_implicit_resolvers.items()
    }
    cls.yaml_implicit_resolvers = resolvers
    cls.add_implicit_resolver(_BOOL_TAG, _BOOL_RE, list("tTfF"))
    cls.add_implicit_resolver(_FLOAT_TAG, _EXP_FLOAT_RE, list("-+0123456789"))


MAX_ALIAS_EXPANSION = 100_000  # values a document may expand to through its aliases


class AliasExpansionError(yaml.YAMLError):
    """A YAML document whose aliases (``*name`` of an ``&name`` anchor) expand it past
    :data:`MAX_ALIAS_EXPANSION` values, or refer to themselves."""


class ConfigLoader(yaml.SafeLoader):
    """Safe loader with YAML 1.2 booleans and exponent floats, and a bound on what aliases
    may expand a document to: a few hundred bytes of nested anchors ("billion laughs")
    would otherwise expand to billions of values once anything walks the tree."""

    def construct_document(self, node: yaml.Node) -> Any:
        _check_alias_expansion(node)
        return super().construct_document(node)


def _check_alias_expansion(root: yaml.Node) -> None:
    """Raise :class:`AliasExpansionError` when the node graph (aliases are shared nodes)
    expands to more than :data:`MAX_ALIAS_EXPANSION` values and more than it holds, or
    has a cycle. Linear in the distinct nodes: each node's expanded size is counted once."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_nodes:
            raise AliasExpansionError(
                "an alias refers to the node that contains it (a recursive structure); "
                "a config is a tree: write the values out"
            )
        open_nodes.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        open_nodes.discard(key)
        sizes[key] = total
        return total

    expanded = size(root)
    if expanded > MAX_ALIAS_EXPANSION and expanded > len(sizes):
        raise AliasExpansionError(
            f"its aliases (*name of an &name anchor) expand it to {expanded} values from "
            f"{len(sizes)} written ones, over the limit of {MAX_ALIAS_EXPANSION} (nested "
            "anchors, a 'billion laughs' document); write the values out or use fewer aliases"
        )


class ConfigDumper(yaml.SafeDumper):
    """Safe dumper that quotes exactly the strings ``ConfigLoader`` would not read back."""


_use_yaml12_scalars(ConfigLoader)
_use_yaml12_scalars(ConfigDumper)


def load_yaml_text(text: str) -> Any:
    """Parse YAML text (raises ``yaml.YAMLError`` on syntax errors)."""
    return yaml.load(text, Loader=ConfigLoader)  # ConfigLoader is a SafeLoader


def parse_value(text: str) -> Any:
    """One override value read as YAML reads a flow value; empty is ``""`` (as in Hydra)."""
    return "" if text == "" else load_yaml_text(text)


def plain(value: Any, *, exact: bool = False) -> Any:
    """``value`` as YAML can write it: config sections (dataclasses) as mappings in field
    order, tuples as lists, and a callable as its import path ``module:qualname``
    (``verl.utils.import_path``). A callable without one raises ``NotImportableError`` when
    ``exact`` (what is written must read back), else is shown as its ``repr``."""
    if callable(value):
        try:
            return import_path(value)
        except NotImportableError:
            if exact:
                raise
            return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: plain(getattr(value, f.name), exact=exact) for f in dataclasses.fields(value)
        }
    if isinstance(value, Mapping):
        return {k: plain(v, exact=exact) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, exact=exact) for v in value]
    return value


def show(value: Any, *, exact: bool = False) -> str:
    """A value as the user would write it on the command line / in YAML flow style
    (:func:`plain`: sections as mappings, callables as ``module:qualname``). Unless
    ``exact``, a long value is cut (:func:`_cut`) so that a message quoting it stays short."""
    if exact:
        return _dump(value, exact=True)
    text = _dump(_cut(value))
    return text if len(text) <= SHOW_LIMIT else f"{text[:SHOW_LIMIT]}... (cut)"


SHOW_LIMIT = 200  # characters of a value quoted in a message (show without exact)


def _cut(value: Any, items: int = 20) -> Any:
    """``value`` with every list, tuple and mapping cut to its first ``items`` items (one
    more item counts the rest) and every string to :data:`SHOW_LIMIT` characters, so that
    showing a huge value costs what showing a short one does."""
    if isinstance(value, str):
        return value[: SHOW_LIMIT + 1]
    if isinstance(value, Mapping):
        out = {k: _cut(v) for k, v in itertools.islice(value.items(), items)}
        if len(value) > items:
            out["..."] = f"{len(value) - items} more"
        return out
    if isinstance(value, (list, tuple)):
        head = [_cut(v) for v in value[:items]]
        return [*head, f"... {len(value) - items} more"] if len(value) > items else head
    return value


def _dump(value: Any, *, exact: bool = False) -> str:
    dumped = yaml.dump(
        [plain(value, exact=exact)],
        Dumper=ConfigDumper,
        default_flow_style=True,
        width=10**9,
        sort_keys=False,
    ).strip()
    # Dumping inside a one-element list forces flow style; strip that list's brackets.
    return dumped[1:-1]
