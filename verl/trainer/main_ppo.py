"""The module users run, ``python -m verl.trainer.main_ppo [--config FILE] key=value ...``: RL training (PPO, GRPO and their relatives).

The code is :mod:`verl.cli.ppo`; this module keeps the command line (and upstream verl's scripts)
working as written.
"""

from __future__ import annotations

import sys

from verl.cli.ppo import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
