"""The module users run, ``python -m verl.trainer.main_rm [--config FILE] key=value ...``: reward-model training.

The code is :mod:`verl.cli.rm`; this module keeps the command line (and upstream verl's scripts)
working as written.
"""

from __future__ import annotations

import sys

from verl.cli.rm import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
