"""The module users run, ``python -m verl.trainer.main_generation model.path=... data.path=... data.output_path=...``: upstream verl's offline generation.

The code is :mod:`verl.cli.upstream_generation`; this module keeps the command line (and upstream verl's scripts)
working as written.
"""

from __future__ import annotations

import sys

from verl.cli.upstream_generation import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
