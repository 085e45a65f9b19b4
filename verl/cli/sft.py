"""Entry point of supervised fine-tuning: ``python -m verl.trainer.main_sft [--config FILE] key=value ...``

The config (defaults ``verl/trainer/config/sft_trainer.yaml`` + FILE + dotted overrides) is
loaded and validated before anything heavy is imported: a config error is printed to
stderr with exit code 2 without importing torch. Then ``SFTTrainer`` runs and the final
model is written as a HuggingFace directory.

    python -m verl.trainer.main_sft                                   # built-in arithmetic data
    python -m verl.trainer.main_sft data.train_files=chats.jsonl optim.lr=2e-5 data.packing=true
    python -m verl.trainer.main_sft --config my.yaml --print-config
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from verl.cli.config_gen import default_yaml
from verl.cli.ppo import add_config_file_args, config_file, execute
from verl.config import ConfigError, SFTConfig, load_sft_config

EXIT_CONFIG_ERROR = 2


def build_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The argument parser shared by the offline entry points (SFT, DPO)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_config_file_args(parser)
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config as YAML and exit"
    )
    parser.add_argument(
        "--print-defaults",
        action="store_true",
        help="print the commented defaults (the packaged YAML) and exit",
    )
    parser.add_argument("--validate-only", action="store_true", help="validate the config and exit")
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. optim.lr=1e-5"
    )
    return parser


def format_results(results: dict[str, Any], seconds: float) -> str:
    """First/last training loss, validation before/after, wall time and the saved model."""
    lines = []
    history = results.get("history") or []
    if history:
        first, last = history[0], history[-1]
        lines.append(
            f"train/loss: {first.get('train/loss', float('nan')):.4f} (step 1) -> "
            f"{last.get('train/loss', float('nan')):.4f} (step {len(history)})"
        )
    before, after = results.get("val_before", {}), results.get("val_after", {})
    for key in sorted(after):
        b = f"{before[key]:.4f}" if key in before else "-"
        lines.append(f"{key}: {b} -> {after[key]:.4f}")
    lines.append(f"wall time: {seconds / 60:.1f} min; model saved to {results.get('hf_dir')}")
    return "\n".join(lines)


def run_offline(
    argv: list[str] | None,
    *,
    kind: str,
    prog: str,
    description: str,
    load: Any,
    run: Any,
) -> int:
    """Parse, load the config, then print it / validate / train; returns the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser(prog, description)
    args = parser.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    if args.print_defaults:
        sys.stdout.write(default_yaml(kind))
        return 0
    try:
        cfg = load(config_file(args, f"{kind}_trainer"), args.overrides)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONFIG_ERROR
    return execute(cfg, args, run, format_results)


def run_sft(cfg: SFTConfig) -> dict[str, Any]:
    """Train on a validated config (imports torch and transformers); returns the results."""
    import transformers

    from verl.trainer.offline.launch import train_offline

    transformers.utils.logging.disable_progress_bar()
    return train_offline("sft", cfg)


def main(argv: list[str] | None = None, prog: str = "python -m verl.trainer.main_sft") -> int:
    """Command-line entry; returns the exit code (0 ok, 2 bad config)."""
    return run_offline(
        argv,
        kind="sft",
        prog=prog,
        description="Supervised fine-tuning on chat or prompt/response data. See docs/sft_dpo.md.",
        load=load_sft_config,
        run=run_sft,
    )


if __name__ == "__main__":
    sys.exit(main())
