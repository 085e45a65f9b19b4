"""The ``verl`` command, one subcommand per entry point.

``verl train`` is ``python -m verl.trainer.main_ppo``, ``verl sft`` / ``verl dpo`` are
``main_sft`` / ``main_dpo``, ``verl config`` prints the resolved PPO config. Each takes
``[--config FILE] key=value ...``. ``verl export --checkpoint DIR --out HFDIR`` is
``python -m verl.model_merger``. The entry point is imported only when its command runs,
so ``verl --help`` stays instant.
"""

from __future__ import annotations

import importlib
import sys

# command -> (module with main(argv, prog=...), leading arguments, one-line help)
COMMANDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "train": ("verl.trainer.main_ppo", (), "validate the config and run PPO/GRPO training"),
    "sft": ("verl.trainer.main_sft", (), "supervised fine-tuning (docs/sft_dpo.md)"),
    "dpo": ("verl.trainer.main_dpo", (), "DPO / IPO / KTO on preference data"),
    "export": (
        "verl.model_merger",
        (),
        "write a checkpoint's actor (or critic) as a HuggingFace directory",
    ),
    "config": (
        "verl.trainer.main_ppo",
        ("--print-config",),
        "print the resolved PPO config (defaults + FILE + overrides) as YAML",
    ),
}

USAGE = (
    "usage: verl COMMAND [--config FILE] [key=value ...]\n\ncommands:\n"
    + "".join(f"  {name:<8} {text}\n" for name, (_, _, text) in COMMANDS.items())
    + "\n`verl COMMAND --help` lists the options of one command.\n"
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
    return entry([*lead, *rest], prog=f"verl {command}")


if __name__ == "__main__":
    sys.exit(main())
