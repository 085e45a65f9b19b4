"""Reward-model scores go through the reward manager's shaping: normalise, then clip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.rewards import BatchReward, RewardManager


def _model_scores(values: list[float], lengths: list[int], width: int = 4):
    mask = torch.zeros(len(values), width)
    scores = torch.zeros(len(values), width)
    for row, (value, length) in enumerate(zip(values, lengths)):
        mask[row, :length] = 1
        scores[row, max(length - 1, 0)] = value
    return scores, mask


def test_normalise_then_clip_hand_computed():
    manager = RewardManager(tokenizer=None, normalize=True, clip_range=(-1.0, 1.0))
    scores, mask = _model_scores([10.0, 0.0, -2.0, 4.0], [4, 2, 1, 3])
    shaped, metrics, extras = manager.shape_scores(scores, mask, update_stats=True)
    raw = np.array([10.0, 0.0, -2.0, 4.0])
    mean, std = raw.mean(), raw.std()  # 3.0, population std sqrt(21.0)
    want = np.clip((raw - mean) / (std + 1e-8), -1.0, 1.0)
    assert mean == 3.0 and std == pytest.approx(21.0**0.5)
    # (10-3)/4.583 = 1.527 -> clipped to 1.0; (-2-3)/4.583 = -1.091 -> -1.0
    assert want.tolist() == pytest.approx([1.0, -0.6547, -1.0, 0.2182], abs=1e-4)
    assert shaped.sum(-1).tolist() == pytest.approx(want.tolist(), abs=1e-6)
    # each shaped score sits on its response's last valid token
    assert shaped[0, 3] != 0 and shaped[1, 1] != 0 and shaped[2, 0] != 0 and shaped[3, 2] != 0
    assert (shaped != 0).sum().item() == 4
    assert metrics["reward/clip_ratio"] == 0.5
    assert metrics["reward/running_mean"] == pytest.approx(3.0)
    assert metrics["reward/model_score_max"] == 10.0
    assert extras["score"].tolist() == [10.0, 0.0, -2.0, 4.0]
    manager.close()


def test_no_shaping_leaves_scores_and_user_callables_pass_through():
    scores, mask = _model_scores([3.0, -7.0], [2, 4])
    plain = RewardManager(tokenizer=None)
    shaped, _, _ = plain.shape_scores(scores, mask, update_stats=True)
    assert torch.equal(shaped, scores)
    plain.close()
    same, metrics, extras = BatchReward(lambda batch: None).shape_scores(scores, mask, True)
    assert same is scores and metrics == {} and extras == {}


def test_validation_batches_do_not_move_the_running_statistics():
    manager = RewardManager(tokenizer=None, normalize=True)
    scores, mask = _model_scores([1.0, 3.0], [1, 1])
    manager.shape_scores(scores, mask, update_stats=True)
    before = (manager.normalizer.count, manager.normalizer.mean)
    _, metrics, _ = manager.shape_scores(scores * 100, mask, update_stats=False)
    assert (manager.normalizer.count, manager.normalizer.mean) == before
    assert metrics == {}
    manager.close()
