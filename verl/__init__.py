"""verl: reinforcement-learning post-training for language models.

PPO, GRPO and their relatives, driven by one single-controller loop, trained with
PyTorch (FSDP2 when distributed) and runnable end to end on a laptop CPU with a tiny
model. Public names are imported lazily so that ``import verl`` stays cheap and never
imports Ray or any GPU-only package.
"""

from __future__ import annotations

from verl.utils.lazy import lazy_exports

__version__ = "0.2.1"

# public name -> module that defines it
_LAZY = {
    "DataProto": "verl.protocol",
    "TrainerConfig": "verl.config",
    "DataParallelConfig": "verl.config",
    "load_config": "verl.config",
    "RLTrainer": "verl.trainer.rl.trainer",
    "PPOTrainer": "verl.trainer.api",
    "Trainer": "verl.trainer.api",
    "make_trainer_config": "verl.trainer.api",
    "DataCollector": "verl.compat.collector",
    "set_device_map": "verl.compat.device_map",
    "SFTConfig": "verl.config",
    "DPOConfig": "verl.config",
    "SFTTrainer": "verl.trainer.offline.sft",
    "DPOTrainer": "verl.trainer.offline.dpo",
    "RMConfig": "verl.config",
    "RMTrainer": "verl.trainer.offline.rm",
}

__all__ = ["__version__", *_LAZY]


__getattr__ = lazy_exports(__name__, _LAZY)
