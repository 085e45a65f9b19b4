"""The module users run to export a checkpoint as a HuggingFace directory:

    python -m verl.model_merger --checkpoint RUN/global_step_N --out HFDIR     # verl export
    python -m verl.model_merger merge --backend fsdp --local_dir CKPT --target_dir OUT

The first form is :mod:`verl.cli.export`; upstream verl's ``merge`` form is read by
:mod:`verl.cli.merge` (``verl merge``), which translates its flags. This module keeps both
command lines working as written.
"""

from __future__ import annotations

import sys

from verl.cli import export, merge


def main(argv: list[str] | None = None, prog: str = "python -m verl.model_merger") -> int:
    """``merge ...`` goes to ``verl merge``, anything else to ``verl export``."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["merge"]:
        return merge.main(args, prog=prog)
    return export.main(args, prog=prog)


__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
