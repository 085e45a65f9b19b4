"""The module users run, ``python -m verl.trainer.main_dpo [--config FILE] key=value ...``: preference optimisation (DPO / IPO / KTO).

The code is :mod:`verl.cli.dpo`; this module keeps the command line (and upstream verl's scripts)
working as written.
"""

from __future__ import annotations

import sys

from verl.cli.dpo import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
