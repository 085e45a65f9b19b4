"""Trainers (RL, SFT, DPO), their entry points and the short Python API.

``from verl.trainer import PPOTrainer`` (the spelling of tutorial 003) and the other public
trainer names are imported lazily, so ``import verl.cli.ppo`` stays torch-free
until the trainer is built.
"""

from __future__ import annotations

from verl.utils.lazy import lazy_exports

_LAZY = {
    "PPOTrainer": "verl.trainer.api",
    "Trainer": "verl.trainer.api",
    "make_trainer_config": "verl.trainer.api",
    "RLTrainer": "verl.trainer.rl.trainer",
    "SFTTrainer": "verl.trainer.offline.sft",
    "DPOTrainer": "verl.trainer.offline.dpo",
}

__all__ = list(_LAZY)

__getattr__ = lazy_exports(__name__, _LAZY)
