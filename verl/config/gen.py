"""Regenerate the files derived from the schema, so they never drift from it.

    python -m verl.config.gen yaml > verl/trainer/config/ppo_trainer.yaml
    python -m verl.config.gen docs docs/config.md   # rewrites the key table in place

``tests/config`` fails when either committed file differs from what this produces.
"""

from __future__ import annotations

import sys
from pathlib import Path

from verl.config.render import to_yaml, with_config_table
from verl.config.schema import TrainerConfig

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
