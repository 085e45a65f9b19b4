"""The one reward contract the RL trainer calls: a batch of responses in, scores out.

    token_level_scores, metrics, extras = reward(batch, update_stats=True)

- ``token_level_scores``: float ``(batch, response_len)``, each response's (shaped) score on
  its last valid token, zeros elsewhere;
- ``metrics``: ``reward/...`` scalars for the step's log;
- ``extras``: per-response arrays, ``score`` (the raw score) and ``acc`` where known.

``update_stats=False`` scores without moving any running statistic (the greedy baseline of
ReMax, validation). :meth:`RewardFunction.shape_scores` shapes sequence scores made
elsewhere (a reward model's, a stored rollout's) the way the function shapes its own.

Every kind of reward enters through this contract once, where the run is built, so the
trainer's step never asks which kind it holds:

- per-response scorers (``compute_score(data_source, solution_str, ground_truth,
  extra_info)``, the built-in ones by ``data_source``) are wrapped by
  :class:`~verl.rewards.manager.RewardManager`;
- a user's batch function ``batch -> (token_level_scores, metrics, extras)`` by
  :class:`BatchReward` (:func:`as_reward_function`);
- a reward model's scores by :class:`ModelScoredReward`, shaped by the rules' manager;
- stored rollouts' scores by ``verl.trainer.rl.offline_rollouts.StoredScoreReward``.

State (running normalisation statistics) is checkpointed through ``state_dict()`` (None:
no state); ``close()`` releases worker processes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

RewardOutput = tuple[torch.Tensor, dict[str, Any], dict[str, Any]]

__all__ = [
    "BatchReward",
    "ModelScoredReward",
    "RewardFunction",
    "RewardOutput",
    "as_reward_function",
]


class RewardFunction:
    """Base of every reward the trainer calls (see the module docstring)."""

    #: True when scores come from the built-in scorers by ``data_source`` (checked at start-up)
    builtin = False

    def __call__(self, batch: Any, *, update_stats: bool = True) -> RewardOutput:
        raise NotImplementedError

    def shape_scores(
        self, token_scores: torch.Tensor, response_mask: torch.Tensor, update_stats: bool
    ) -> RewardOutput:
        """Shape sequence scores made elsewhere (one per response, on one token of
        ``token_scores``); this base leaves them as they are, with no metrics or extras."""
        return token_scores, {}, {}

    def state_dict(self) -> dict[str, Any] | None:
        return None

    def load_state_dict(self, state: Any) -> None:
        """Restore :meth:`state_dict`'s output (nothing to restore here)."""

    def close(self) -> None:
        """Release what the reward holds (nothing here)."""


class BatchReward(RewardFunction):
    """A user's batch function ``fn(batch) -> (token_level_scores, metrics, extras)`` in the
    contract: ``update_stats=False`` drops its metrics (the function has no statistics to
    hold back); its ``state_dict`` / ``load_state_dict`` / ``close``, when it has them,
    are used."""

    def __init__(self, fn: Callable[[Any], RewardOutput]) -> None:
        if not callable(fn):
            raise TypeError(
                f"reward_fn={fn!r} is not callable: give batch -> (scores, metrics, extras)"
            )
        self.fn = fn

    def __call__(self, batch: Any, *, update_stats: bool = True) -> RewardOutput:
        scores, metrics, extras = self.fn(batch)
        return scores, (metrics if update_stats else {}), extras

    def state_dict(self) -> dict[str, Any] | None:
        state_dict = getattr(self.fn, "state_dict", None)
        return state_dict() if callable(state_dict) else None

    def load_state_dict(self, state: Any) -> None:
        load = getattr(self.fn, "load_state_dict", None)
        if callable(load):
            load(state)

    def close(self) -> None:
        close = getattr(self.fn, "close", None)
        if callable(close):
            close()


class ModelScoredReward(RewardFunction):
    """A reward model's scores, shaped like rule scores by ``shaper`` (overlong penalty,
    running normalisation, clip: ``reward_model.*``); the shaper's state is this reward's.

    ``group`` is the reward model's worker group: ``compute_rm_score(batch)`` returns a
    batch whose ``rm_scores`` ``(batch, response_len)`` hold each sequence's score on its
    last response token.
    """

    def __init__(self, group: Any, shaper: RewardFunction) -> None:
        self.group = group
        self.shaper = shaper

    def __call__(self, batch: Any, *, update_stats: bool = True) -> RewardOutput:
        rm_scores = self.group.compute_rm_score(batch).batch["rm_scores"]
        return self.shaper.shape_scores(rm_scores, batch.batch["response_mask"], update_stats)

    def state_dict(self) -> dict[str, Any] | None:
        return self.shaper.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.shaper.load_state_dict(state)

    def close(self) -> None:
        self.shaper.close()


def as_reward_function(fn: Any) -> RewardFunction:
    """``fn`` in the contract: a :class:`RewardFunction` as it is, any other callable as a
    batch function (:class:`BatchReward`)."""
    return fn if isinstance(fn, RewardFunction) else BatchReward(fn)
