"""Upstream verl's SFT entry point (its engine-based trainer, since v0.6), so that its scripts
run as written::

    torchrun --nproc_per_node=2 -m verl.trainer.sft_trainer model.path=... data.messages_key=messages
    python -m verl.trainer.sft_trainer ...          # one process

It is :mod:`verl.cli.sft`; the trainer is :class:`verl.trainer.offline.sft.SFTTrainer`.
"""

from __future__ import annotations

import sys

from verl.cli.sft import main
from verl.trainer.offline.sft import SFTTrainer

__all__ = ["SFTTrainer", "main"]

if __name__ == "__main__":
    sys.exit(main(prog="python -m verl.trainer.sft_trainer"))
