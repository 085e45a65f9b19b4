"""Render a config as YAML (each key's help as a comment) or as a docs table, and regenerate
the files derived from the schema, so they never drift from it.

    python -m verl.config.gen yaml > verl/trainer/config/ppo_trainer.yaml
    python -m verl.config.gen docs docs/config.md   # rewrites the key table in place

``tests/config`` fails when either committed file differs from what this produces.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from verl.config.convert import describe_type, field_types, section_class
from verl.config.registry_keys import REGISTRY_KEYS
from verl.config.schema import TrainerConfig
from verl.config.yaml_io import show


def to_yaml(cfg: Any, *, comments: bool = False) -> str:
    """The config as block YAML that ``load_config``/``from_dict`` read back to an equal config.

    With ``comments=True`` every key is preceded by its help text.
    """
    lines: list[str] = []
    _emit(cfg, 0, lines, comments)
    return "\n".join(lines) + "\n"


def _emit(obj: Any, depth: int, lines: list[str], comments: bool) -> None:
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
            _emit(value, depth + 1, lines, comments)
        else:
            lines.append(f"{pad}{f.name}: {show(value)}")


def iter_rows(cls: type, obj: Any = None, prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """``(key path, type, default, help)`` for every settable key of the schema, in order.

    Non-null sections are descended into; a section that defaults to null (e.g.
    ``mixed_precision``) gets its own row, and its keys show the defaults they take
    once the section is set. A registry-backed key's type is "<registry kind> name" (the
    names are those of ``verl.registry``).
    """
    obj = cls() if obj is None else obj
    hints = field_types(cls)
    for f in dataclasses.fields(cls):
        path, tp, value = f"{prefix}{f.name}", hints[f.name], getattr(obj, f.name)
        sub = section_class(tp)
        if sub is None or value is None:
            registry = REGISTRY_KEYS.get(path)
            kind = describe_type(tp) if registry is None else f"{registry.kind} name"
            yield path, kind, show(value), f.metadata["help"]
        if sub is not None:
            yield from iter_rows(sub, value if value is not None else sub(), path + ".")


def with_config_table(doc: str, cls: type, begin: str, end: str) -> str:
    """``doc`` with the text between the markers ``begin`` and ``end`` replaced by the
    current :func:`config_table` of ``cls``."""
    head, found_begin, rest = doc.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not found_begin or not found_end:
        raise ValueError(f"markers {begin!r} ... {end!r} not found")
    return f"{head}{begin}\n{config_table(cls)}{end}{tail}"


def config_table(cls: type) -> str:
    """A markdown table of every key of the schema ``cls``: path, type, default, meaning."""
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for path, tp, default, help_text in iter_rows(cls):
        cells = (f"`{path}`", tp, f"`{default}`", help_text)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


YAML_HEADER = """\
# Defaults of every PPO/GRPO setting, one comment per key.
# GENERATED from verl/config/schema*.py by `python -m verl.config.gen yaml`: edit the
# schema, not this file. Override keys with a YAML file (--config) or on the command line:
#   python -m verl.trainer.main_ppo actor_rollout_ref.actor.optim.lr=1e-6 data.train_batch_size=16
# Directory templates fill in {project_name} and {experiment_name} from the trainer section.
"""

TABLE_BEGIN = (
    "<!-- BEGIN GENERATED CONFIG TABLE (python -m verl.config.gen docs docs/config.md) -->"
)
TABLE_END = "<!-- END GENERATED CONFIG TABLE -->"


def default_yaml() -> str:
    """The text of ``verl/trainer/config/ppo_trainer.yaml``."""
    return YAML_HEADER + "\n" + to_yaml(TrainerConfig(), comments=True)


def with_table(doc: str) -> str:
    """``doc`` with the text between the table markers replaced by the current table."""
    return with_config_table(doc, TrainerConfig, TABLE_BEGIN, TABLE_END)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["yaml"]:
        sys.stdout.write(default_yaml())
        return 0
    if len(args) == 2 and args[0] == "docs":
        path = Path(args[1])
        path.write_text(with_table(path.read_text()))
        return 0
    sys.stderr.write("usage: python -m verl.config.gen yaml | docs PATH/TO/config.md\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
