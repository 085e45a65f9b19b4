"""``verl config``: the resolved config, or the reference of every key.

    verl config [--config FILE] [key=value ...]      # defaults + FILE + overrides, as YAML
    verl config --reference                           # every PPO/GRPO key with its comment
    verl config --reference --trainer sft             # the same for SFT (or dpo)
    verl config --reference --format table            # a Markdown table: key, type, default

The YAML shows a section that defaults to null (``mixed_precision: null``) as one line; the
table also lists the keys such a section takes once set.

The reference is generated from the typed schema (the text of
``verl/trainer/config/*_trainer.yaml``); docs/config.md has the same keys as a table.
"""

from __future__ import annotations

import argparse
import sys

TRAINERS = ("ppo", "sft", "dpo")


def build_parser(prog: str = "verl config") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Print the resolved config (defaults + --config FILE + key=value "
        "overrides) as YAML, validated; or, with --reference, every key of the schema with "
        "its default and a comment saying what it does. Key table: docs/config.md.",
    )
    parser.add_argument(
        "--reference",
        action="store_true",
        help="print every key with its default and its comment (the generated YAML reference)",
    )
    parser.add_argument(
        "--trainer",
        choices=TRAINERS,
        default="ppo",
        help="which entry point's config: ppo (verl train, default), sft or dpo",
    )
    parser.add_argument(
        "--format",
        choices=("yaml", "table"),
        default="yaml",
        help="--reference as commented YAML (default) or as a Markdown table of every key "
        "(type, default, meaning; also the keys of sections that default to null)",
    )
    parser.add_argument("--config", metavar="FILE", help="YAML file merged over the defaults")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted overrides, e.g. actor_rollout_ref.actor.optim.lr=1e-6",
    )
    return parser


def reference(trainer: str, fmt: str) -> str:
    """The reference of ``trainer``'s config (ppo, sft, dpo) as ``fmt`` (yaml or table)."""
    from verl.cli.config_gen import config_table, default_yaml
    from verl.config.schema import TrainerConfig
    from verl.config.schema_offline import DPOConfig, SFTConfig

    if fmt == "table":
        return config_table({"ppo": TrainerConfig, "sft": SFTConfig, "dpo": DPOConfig}[trainer])
    return default_yaml(trainer)


def main(argv: list[str] | None = None, prog: str = "verl config") -> int:
    """Print the config; exit code 0, or 2 for a bad config or bad arguments."""
    parser = build_parser(prog)
    args = parser.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    if args.reference:
        if args.config or args.overrides:
            parser.error(
                "--reference prints the defaults of every key; it takes no "
                f"--config or key=value (got {[args.config, *args.overrides]})"
            )
        sys.stdout.write(reference(args.trainer, args.format))
        return 0
    rest = [*(["--config", args.config] if args.config else []), "--print-config"]
    if args.trainer == "ppo":
        from verl.cli import ppo as entry
    elif args.trainer == "sft":
        from verl.cli import sft as entry
    else:
        from verl.cli import dpo as entry
    return entry.main([*rest, *args.overrides], prog=prog)


if __name__ == "__main__":
    sys.exit(main(prog="python -m verl.cli.config"))
