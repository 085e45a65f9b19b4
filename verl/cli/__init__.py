"""The ``verl`` command, one subcommand per entry point.

``verl train`` is ``python -m verl.trainer.main_ppo``; ``verl distill`` is ``verl train`` with
``algorithm.distill.enable=true`` preset (on-policy distillation, docs/distillation.md); ``verl sft`` / ``verl dpo`` /
``verl rm`` are ``main_sft`` / ``main_dpo`` / ``main_rm``; each takes ``[--config FILE] key=value ...``. ``verl export``
(and its upstream-familiar alias ``verl merge``) writes a checkpoint as a HuggingFace
directory; ``verl config`` prints the resolved config or, with ``--reference``, every key
with its comment. ``verl generate`` / ``verl eval`` sample and score a model on a dataset
offline; ``verl plot`` draws runs; ``verl data`` runs the built-in dataset generators and
converters. A subcommand's module is imported only when it runs, so ``verl --help`` stays
instant; each module has ``main(argv, prog=...) -> exit code``. Documented in docs/cli.md.
"""

from __future__ import annotations

import importlib
import sys

from verl.utils.omp_wait import prefer_passive_wait

# Every entry point passes through this package before anything imports torch: torch's
# OpenMP threads then sleep instead of spinning when they wait (verl/utils/omp_wait.py).
prefer_passive_wait()

# command -> (module with main(argv, prog=...), leading arguments, one-line help)
COMMANDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "train": ("verl.cli.ppo", (), "validate the config and run PPO/GRPO training"),
    "distill": (
        "verl.cli.ppo",
        ("algorithm.distill.enable=true",),
        "on-policy distillation: verl train with algorithm.distill.enable=true",
    ),
    "sft": ("verl.cli.sft", (), "supervised fine-tuning (docs/sft_dpo.md)"),
    "dpo": ("verl.cli.dpo", (), "DPO / IPO / KTO on preference data"),
    "rm": ("verl.cli.rm", (), "reward-model training on preference pairs"),
    "export": (
        "verl.cli.export",
        (),
        "write a checkpoint's actor (or critic) as a HuggingFace directory",
    ),
    "merge": (
        "verl.cli.merge",
        (),
        "export under upstream verl's name and flags (--local_dir, --target_dir)",
    ),
    "config": (
        "verl.cli.config",
        (),
        "print the resolved config as YAML; --reference: every key with its comment",
    ),
    "generate": (
        "verl.cli.generate",
        (),
        "sample n responses per prompt of a dataset, with log-probs and scores, to parquet",
    ),
    "eval": (
        "verl.cli.evaluate",
        (),
        "accuracy per data source, mean@n and pass@k of a model or a generations file",
    ),
    "plot": ("verl.cli.plot", (), "draw runs' metrics.jsonl (reward, val acc, KL, ...) as a PNG"),
    "data": ("verl.cli.data", (), "list or run the built-in dataset generators and converters"),
}

USAGE = (
    "usage: verl COMMAND [options]\n\ncommands:\n"
    + "".join(f"  {name:<9} {text}\n" for name, (_, _, text) in COMMANDS.items())
    + "\n`verl COMMAND --help` lists the options of one command (docs/cli.md).\n"
)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        sys.stderr.write(f"verl: unknown command {command!r}\n{USAGE}")
        return 2
    module, lead, _ = COMMANDS[command]
    entry = importlib.import_module(module).main
    try:
        return entry([*lead, *rest], prog=f"verl {command}")
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
