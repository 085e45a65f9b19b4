"""Upstream verl's name of the SFT entry point, so that its scripts run as written:

    torchrun --nproc_per_node=2 -m verl.trainer.fsdp_sft_trainer model.partial_pretrain=... ...
    python -m verl.trainer.fsdp_sft_trainer ...          # one process

It is :mod:`verl.cli.sft` (under torchrun each process is one rank:
``verl.trainer.offline.launch.train_in_process_group``).
"""

from __future__ import annotations

import sys

from verl.cli.sft import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m verl.trainer.fsdp_sft_trainer"))
