"""``from verl.trainer.ppo import PPOTrainer``: the spelling of tutorial 000.

The trainer lives in :mod:`verl.trainer.api` (``PPOTrainer``, ``Trainer``,
``make_trainer_config``) over :class:`verl.trainer.rl.trainer.RLTrainer`; this module
re-exports them under the path older verl releases used.
"""

from verl.trainer.api import PPOTrainer, Trainer, make_trainer_config
from verl.trainer.rl.trainer import RLTrainer

__all__ = ["PPOTrainer", "RLTrainer", "Trainer", "make_trainer_config"]
