"""PF-PPO reweighting: the weight functions on hand-worked scores, and the seeded draw."""

from __future__ import annotations

import pytest
import torch

from verl.algorithms.pf_ppo import (
    max_min_weights,
    max_random_weights,
    pf_ppo_indices,
    pow_weights,
)
from verl.config import ConfigError, load_config
from verl.registry import PF_PPO_WEIGHTS, UnknownNameError

SCORES = torch.tensor([1.0, -2.0, 0.0, 3.0], dtype=torch.float64)


def test_weights_by_hand():
    assert pow_weights(SCORES).tolist() == [1.0, 4.0, 0.0, 9.0]
    assert pow_weights(SCORES, weight_pow=1.0).tolist() == [1.0, 2.0, 0.0, 3.0]
    assert max_min_weights(SCORES).tolist() == [0.0, 1.0, 0.0, 1.0]
    assert max_random_weights(SCORES).tolist() == pytest.approx([0.1, 0.1, 0.1, 0.4])
    # ties: every response sharing the best (or worst) score counts as extreme
    tied = torch.tensor([2.0, 2.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    assert max_min_weights(tied).tolist() == [1.0, 1.0, 0.0, 1.0, 1.0]
    assert set(PF_PPO_WEIGHTS.names()) == {"pow", "max_min", "max_random"}


def test_max_min_draws_only_the_extremes():
    rows, metrics = pf_ppo_indices(SCORES, "max_min", seed=3)
    assert len(rows) == 4
    assert set(rows.tolist()) <= {1, 3}
    assert rows.tolist() == sorted(rows.tolist())
    assert metrics["pf_ppo/unique_fraction"] == len(set(rows.tolist())) / 4
    assert metrics["pf_ppo/score_mean"] == pytest.approx(SCORES[rows].mean().item())


def test_draw_frequencies_follow_the_weights():
    # 1000 responses scored 1 and 1000 scored 3: pow 2 weighs them 1 : 9
    scores = torch.cat([torch.ones(1000), torch.full((1000,), 3.0)])
    rows, _ = pf_ppo_indices(scores, "pow", 2.0, seed=0)
    share_of_threes = (rows >= 1000).float().mean().item()
    assert share_of_threes == pytest.approx(0.9, abs=0.03)


def test_the_draw_is_seeded():
    scores = torch.arange(16, dtype=torch.float64)
    a, _ = pf_ppo_indices(scores, "pow", seed=7)
    b, _ = pf_ppo_indices(scores, "pow", seed=7)
    c, _ = pf_ppo_indices(scores, "pow", seed=8)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_all_zero_weights_draw_uniformly():
    rows, _ = pf_ppo_indices(torch.zeros(64), "pow", seed=0)
    assert len(set(rows.tolist())) > 20  # uniform with replacement: ~41 distinct of 64


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match=r"not finite.*weight_pow=-1"):
        pf_ppo_indices(SCORES, "pow", -1.0)  # 0 ** -1 = inf
    with pytest.raises(ValueError, match="non-empty 1-D"):
        pf_ppo_indices(torch.zeros(2, 2), "pow")
    with pytest.raises(UnknownNameError, match="max_mni"):
        pf_ppo_indices(SCORES, "max_mni")


def test_config_checks_the_method_against_the_registry(tmp_path):
    with pytest.raises(ConfigError, match=r"algorithm.pf_ppo.reweight_method=max_mni.*max_min"):
        load_config(overrides=["algorithm.pf_ppo.reweight_method=max_mni"])
