"""Entry point of reward-model training: ``python -m verl.trainer.main_rm [--config FILE] key=value ...``

A Bradley-Terry loss on a one-label sequence-classification head over preference pairs
(the DPO pair format; docs/reward_model.md). The config (defaults
``verl/trainer/config/rm_trainer.yaml`` + FILE + dotted overrides) is validated before torch
is imported; a config error exits with code 2. Then ``RMTrainer`` runs and the reward model
is written as a HuggingFace directory that loads as ``reward_model.model.path``.

    python -m verl.trainer.main_rm                                   # built-in arithmetic pairs
    python -m verl.trainer.main_rm data.train_files=pairs.jsonl data.val_files=held_out.jsonl
    python -m verl.trainer.main_rm model.path=sft_out/huggingface model.lora_rank=16
"""

from __future__ import annotations

import sys
from typing import Any

from verl.cli.sft import run_offline
from verl.config import RMConfig, load_rm_config


def run_rm(cfg: RMConfig) -> dict[str, Any]:
    """Train on a validated config (imports torch and transformers); returns the results."""
    import transformers

    from verl.trainer.offline.launch import train_offline

    transformers.utils.logging.disable_progress_bar()
    return train_offline("rm", cfg)


def main(argv: list[str] | None = None, prog: str = "python -m verl.trainer.main_rm") -> int:
    """Command-line entry; returns the exit code (0 ok, 2 bad config)."""
    return run_offline(
        argv,
        kind="rm",
        prog=prog,
        description="Reward-model training on preference pairs. See docs/reward_model.md.",
        load=load_rm_config,
        run=run_rm,
    )


if __name__ == "__main__":
    sys.exit(main())
