"""Role workers: thin translators between ``DataProto`` batches and engine calls.

Each worker is built from its role's spec (:mod:`verl.workers.specs`), never from the
config tree.
"""

from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.critic import CriticWorker
from verl.workers.reward_model import RewardModelWorker

__all__ = ["ActorRolloutRefWorker", "CriticWorker", "RewardModelWorker"]
