"""The reward contract: every kind of reward is one call, ``reward(batch, update_stats=...)``."""

from __future__ import annotations

import numpy as np
import torch

from verl.protocol import DataProto
from verl.rewards import (
    BatchReward,
    ModelScoredReward,
    RewardFunction,
    RewardManager,
    as_reward_function,
)


def _batch(mask: torch.Tensor) -> DataProto:
    return DataProto.from_dict(tensors={"response_mask": mask})


class _Stateful:
    def __init__(self) -> None:
        self.calls, self.loaded, self.closed = 0, None, False

    def __call__(self, batch):
        self.calls += 1
        scores = batch.batch["response_mask"].float() * 2.0
        return scores, {"reward/mean": 2.0}, {"score": np.full(len(batch), 2.0)}

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.loaded = state

    def close(self):
        self.closed = True


def test_a_batch_function_enters_the_contract_with_its_state_and_close():
    fn = _Stateful()
    reward = as_reward_function(fn)
    assert isinstance(reward, BatchReward)
    batch = _batch(torch.ones(2, 3))
    scores, metrics, extras = reward(batch, update_stats=True)
    assert scores.sum().item() == 12.0 and metrics == {"reward/mean": 2.0}
    assert extras["score"].tolist() == [2.0, 2.0]
    # a baseline / validation call: same scores, no metrics for the step's log
    again, metrics, _ = reward(batch, update_stats=False)
    assert torch.equal(again, scores) and metrics == {}
    assert reward.state_dict() == {"calls": 2}
    reward.load_state_dict({"calls": 7})
    assert fn.loaded == {"calls": 7}
    reward.close()
    assert fn.closed


def test_a_plain_function_has_no_state_and_a_contract_object_is_kept():
    reward = as_reward_function(lambda batch: (None, {}, {}))
    assert reward.state_dict() is None
    reward.load_state_dict({"ignored": 1})  # nothing to restore
    manager = RewardManager(tokenizer=None)
    assert as_reward_function(manager) is manager
    assert isinstance(manager, RewardFunction)
    manager.close()


class _Group:
    """A reward model's worker group: its score on each response's last token."""

    def compute_rm_score(self, batch):
        mask = batch.batch["response_mask"]
        scores = torch.zeros_like(mask, dtype=torch.float32)
        last = mask.sum(-1).long() - 1
        scores[torch.arange(len(mask)), last] = torch.tensor([4.0, -2.0])
        return DataProto.from_dict(tensors={"rm_scores": scores})


def test_model_scores_are_shaped_by_the_rules_manager_and_share_its_state():
    shaper = RewardManager(tokenizer=None, normalize=True)
    reward = ModelScoredReward(_Group(), shaper)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    scores, metrics, extras = reward(_batch(mask), update_stats=True)
    # normalised over the batch: (4 - 1) / 3 and (-2 - 1) / 3, on the last valid tokens
    assert abs(scores[0, 2].item() - 1.0) < 1e-6
    assert abs(scores[1, 0].item() + 1.0) < 1e-6
    assert extras["score"].tolist() == [4.0, -2.0]
    assert metrics["reward/model_score_max"] == 4.0
    assert reward.state_dict() == shaper.state_dict() != {}
    reward.close()
