"""YAML reading and writing with YAML 1.2 scalars, for config files and override values.

PyYAML implements YAML 1.1, where ``1e-6`` is a *string* (a float needs a dot) and
``yes``/``no``/``on``/``off`` are booleans. Config files and command-line values follow
YAML 1.2 here: ``1e-6`` is a float and only ``true``/``false`` are booleans. The same
resolver is used for dumping, so a dumped value always reads back as itself.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

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


class ConfigLoader(yaml.SafeLoader):
    """Safe loader with YAML 1.2 booleans and exponent floats."""


class ConfigDumper(yaml.SafeDumper):
    """Safe dumper that quotes exactly the strings ``ConfigLoader`` would not read back."""


_use_yaml12_scalars(ConfigLoader)
_use_yaml12_scalars(ConfigDumper)


def load_yaml_text(text: str) -> Any:
    """Parse YAML text (raises ``yaml.YAMLError`` on syntax errors)."""
    return yaml.load(text, Loader=ConfigLoader)  # ConfigLoader is a SafeLoader


def parse_value(text: str) -> Any:
    """Parse one command-line override value the way YAML reads a scalar/flow value.

    ``1e-6`` -> float, ``8`` -> int, ``true`` -> bool, ``null`` -> None, ``[1,2]`` -> list,
    ``"8"`` -> str. An empty value is the empty string (as in Hydra), not null.
    """
    if text == "":
        return ""
    return load_yaml_text(text)


def show(value: Any) -> str:
    """A value as the user would write it on the command line / in YAML flow style."""
    dumped = yaml.dump(
        [value], Dumper=ConfigDumper, default_flow_style=True, width=10**9, sort_keys=False
    ).strip()
    # Dumping inside a one-element list forces flow style; strip that list's brackets.
    return dumped[1:-1]
