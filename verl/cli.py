"""The ``verl`` command: ``verl train ...`` (= ``python -m verl.trainer.main_ppo``) and
``verl config ...`` (print the resolved config). Both take ``[--config FILE] key=value ...``.
"""

from __future__ import annotations

import sys

USAGE = """\
usage: verl COMMAND [--config FILE] [key=value ...]

commands:
  train    validate the config and run PPO/GRPO training
  config   print the resolved config (defaults + FILE + overrides) as YAML
"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if args else 2
    from verl.trainer.main_ppo import main as main_ppo

    command, rest = args[0], args[1:]
    if command == "train":
        return main_ppo(rest, prog="verl train")
    if command == "config":
        return main_ppo(["--print-config", *rest], prog="verl config")
    sys.stderr.write(f"verl: unknown command {command!r}\n{USAGE}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
