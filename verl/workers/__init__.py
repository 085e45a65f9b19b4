"""Role workers: thin translators between ``DataProto`` batches and engine calls."""

from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.critic import CriticWorker

__all__ = ["ActorRolloutRefWorker", "CriticWorker"]
