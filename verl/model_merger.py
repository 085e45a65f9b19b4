"""The module users run, ``python -m verl.model_merger merge --backend fsdp --local_dir CKPT --target_dir OUT``: export a checkpoint as a HuggingFace directory (upstream verl's model merger).

The code is :mod:`verl.cli.export`; this module keeps the command line (and upstream verl's scripts)
working as written.
"""

from __future__ import annotations

import sys

from verl.cli.export import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
