"""The module users run, ``python -m verl.trainer.main_sft [--config FILE] key=value ...``: supervised fine-tuning.

The code is :mod:`verl.cli.sft`; this module keeps the command line (and upstream verl's scripts)
working as written.
"""

from __future__ import annotations

import sys

from verl.cli.sft import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
