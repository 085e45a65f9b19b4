"""The module users run, ``python -m verl.trainer.main_eval data.path=... custom_reward_function.path=...``: upstream verl's evaluation of a generations file.

The code is :mod:`verl.cli.upstream_eval`; this module keeps the command line (and upstream verl's scripts)
working as written.
"""

from __future__ import annotations

import sys

from verl.cli.upstream_eval import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
