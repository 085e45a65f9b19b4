"""Regenerate the files derived from the schema, so they never drift from it: the commented
YAML defaults of each trainer and the key tables of the docs.

    python -m verl.cli.config_gen yaml [ppo|sft|dpo|rm] > verl/trainer/config/ppo_trainer.yaml
    python -m verl.cli.config_gen docs docs/config.md     # rewrites the marked key tables in place
    python -m verl.cli.config_gen docs docs/sft_dpo.md
    python -m verl.cli.config_gen docs docs/reward_model.md

``tests/config`` (and the SFT/DPO tests) fail when a committed file differs from this output.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from verl.config.load import describe_type, field_types, section_class, show, to_yaml
from verl.config.schema import TrainerConfig
from verl.config.schema_offline import DPOConfig, RMConfig, SFTConfig
from verl.trainer.rl.registry_checks import REGISTRY_KEYS

# kind -> (root class, title, example command line)
KINDS: dict[str, tuple[type, str, str]] = {
    "ppo": (
        TrainerConfig,
        "PPO/GRPO",
        "python -m verl.trainer.main_ppo actor_rollout_ref.actor.optim.lr=1e-6 data.train_batch_size=16",
    ),
    "sft": (SFTConfig, "SFT", "python -m verl.trainer.main_sft optim.lr=2e-5"),
    "dpo": (DPOConfig, "DPO / IPO / KTO", "python -m verl.trainer.main_dpo algorithm.beta=0.2"),
    "rm": (RMConfig, "reward-model", "python -m verl.trainer.main_rm optim.lr=1e-5"),
}
_HEADER = """\
# Defaults of every {title} setting, one comment per key.
# GENERATED from verl/config/schema*.py by `python -m verl.cli.config_gen yaml {kind}`: edit the
# schema, not this file. Override keys with a YAML file (--config) or on the command line:
#   {example}
# Directory templates fill in {{project_name}} and {{experiment_name}} from the trainer section.
"""


def default_yaml(kind: str = "ppo") -> str:
    """The text of ``verl/trainer/config/<kind>_trainer.yaml`` (``kind``: ppo, sft, dpo or rm)."""
    if kind not in KINDS:
        raise ValueError(f"unknown config kind {kind!r}; use one of {', '.join(KINDS)}")
    cls, title, example = KINDS[kind]
    header = _HEADER.format(title=title, kind=kind, example=example)
    return header + "\n" + to_yaml(cls(), comments=True)


def iter_rows(cls: type, obj: Any = None, prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    """``(key path, type, default, help)`` for every settable key of the schema, in order.

    Non-null sections are descended into; a section that defaults to null (e.g.
    ``mixed_precision``) gets its own row, and its keys show the defaults they take once the
    section is set. A registry-backed key's type is "<registry kind> name".
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


def config_table(cls: type) -> str:
    """A markdown table of every key of the schema ``cls``: path, type, default, meaning."""
    lines = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for path, tp, default, help_text in iter_rows(cls):
        cells = (f"`{path}`", tp, f"`{default}`", help_text)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def table_markers(kind: str) -> tuple[str, str]:
    """The markers around the generated key table of ``kind`` in a markdown file."""
    name = "" if kind == "ppo" else f"{kind.upper()} "
    return (
        f"<!-- BEGIN GENERATED {name}CONFIG TABLE (python -m verl.cli.config_gen docs FILE) -->",
        f"<!-- END GENERATED {name}CONFIG TABLE -->",
    )


def upstream_table() -> str:
    """A markdown table of upstream verl's run-script and default-config keys and how each
    is read here (``verl.compat.upstream``): renamed, dropped (with the reason) or refused.
    ``prefix.*`` rows read every key under the prefix; the moved subtrees are read as their
    older spelling."""
    from verl.compat.upstream import (
        OFFLINE_UPSTREAM_KEYS,
        OFFLINE_UPSTREAM_MOVES,
        UPSTREAM_KEYS,
        UPSTREAM_MOVES,
    )

    lines = ["| upstream key | trainer | read as |", "|---|---|---|"]
    rows: list[tuple[str, str, Any]] = [(k, "RL", v) for k, v in UPSTREAM_KEYS.items()]
    rows += [(k, "SFT, DPO", v) for k, v in OFFLINE_UPSTREAM_KEYS.items()]
    moved = "read as upstream's older spelling `{}` (the keys under it too)"
    rows += [(k, "RL", moved.format(v)) for k, v in UPSTREAM_MOVES.items()]
    rows += [(k, "SFT, DPO", moved.format(v)) for k, v in OFFLINE_UPSTREAM_MOVES.items()]
    rows.append(("`*_per_gpu` (any section)", "all", "renamed `*_per_device`"))
    rows.append(
        (
            "any key set to `${...}` or `???`",
            "all",
            "dropped: upstream copies another key there (OmegaConf interpolation) or leaves it "
            "unset; the native default follows that key here",
        )
    )
    for key, trainer, entry in rows:
        name = key if key.startswith(("`", "any ")) else f"`{key}`"
        lines.append(_upstream_row(name, trainer, entry))
    return "\n".join(lines) + "\n"


def _upstream_row(name: str, trainer: str, entry: Any) -> str:
    if isinstance(entry, str):
        read = entry
    elif entry.reads:  # more than a rename or a drop (data.filter_overlong_prompts)
        read = entry.reads
    elif entry.keeps == ():
        read = f"refused: {entry.refusal}"
    elif entry.native is not None:
        read = f"renamed `{entry.native}`"
    else:
        read = f"dropped: {entry.reason}"
    if not isinstance(entry, str) and entry.keeps and entry.refusal and not entry.reads:
        kept = ", ".join(show(v) for v in entry.keeps)
        read = f"{kept}: {read}; other values refused: {entry.refusal}"
    cells = (name, trainer, read)
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


UPSTREAM_MARKERS = (
    "<!-- BEGIN GENERATED UPSTREAM KEYS TABLE (python -m verl.cli.config_gen docs FILE) -->",
    "<!-- END GENERATED UPSTREAM KEYS TABLE -->",
)


def with_tables(doc: str) -> str:
    """``doc`` with every marked table (the PPO, SFT, DPO, RM keys; upstream verl's keys)
    regenerated from the schema and the alias table."""
    tables = [
        (table_markers(kind), lambda c=cls: config_table(c)) for kind, (cls, _, _) in KINDS.items()
    ]
    tables.append((UPSTREAM_MARKERS, upstream_table))
    for (begin, end), make in tables:
        head, found_begin, rest = doc.partition(begin)
        _, found_end, tail = rest.partition(end)
        if found_begin and found_end:
            doc = f"{head}{begin}\n{make()}{end}{tail}"
        elif found_begin or found_end:
            raise ValueError(f"unbalanced markers {begin!r} ... {end!r}")
    return doc


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["yaml"] and len(args) <= 2 and (args[1:] or ["ppo"])[0] in KINDS:
        sys.stdout.write(default_yaml(*args[1:]))
        return 0
    if len(args) == 2 and args[0] == "docs":
        path = Path(args[1])
        path.write_text(with_tables(path.read_text()))
        return 0
    sys.stderr.write("usage: python -m verl.cli.config_gen yaml [ppo|sft|dpo|rm] | docs FILE.md\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
