"""The optimal token baseline (``verl/algorithms/token_baseline.py``) on hand-worked values."""

from __future__ import annotations

import math

import pytest
import torch

from verl.algorithms.advantages import get_advantage_estimator
from verl.registry import ADVANTAGE_ESTIMATORS

OTB = "optimal_token_baseline"


def _otb(rewards, mask, index, pi, sps, **kwargs):
    return get_advantage_estimator(OTB)(
        token_level_rewards=rewards,
        response_mask=mask,
        index=index,
        old_log_probs=torch.log(pi),
        sum_pi_squared=sps,
        **kwargs,
    )


def test_weighted_per_timestep_baseline_and_zero_tail():
    # Row 0: score 1 on its 2nd (last) token; row 1: score 3 on its 3rd. Returns G:
    # (1, 1 | 3, 3, 3). w = 1 - 2 pi + sum pi^2: row 0 (0.5, 0.75), row 1 (0.5, 0.5, 0.5);
    # cumulative W: (0.5, 1.25 | 0.5, 1.0, 1.5).
    # B_0 = (0.5 * 1 + 0.5 * 3) / 1.0 = 2; B_1 = (1.25 * 1 + 1.0 * 3) / 2.25 = 17 / 9;
    # t = 2 is reached by row 1 alone: baseline 0 there, A = G = 3.
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    pi = torch.tensor([[0.5, 0.25, 1.0], [0.5, 0.5, 0.5]])
    sps = torch.tensor([[0.5, 0.25, 0.0], [0.5, 0.5, 0.5]])
    adv, ret = _otb(rewards, mask, ["a", "a"], pi, sps)
    b1 = 17 / 9
    torch.testing.assert_close(adv, torch.tensor([[-1.0, 1 - b1, 0.0], [1.0, 3 - b1, 3.0]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0.0], [3.0, 3.0, 3.0]]))
    adv_no_tail, _ = _otb(rewards, mask, ["a", "a"], pi, sps, handle_zero_tail=False)
    assert adv_no_tail[1, 2].item() == 0.0
    torch.testing.assert_close(adv_no_tail[:, :2], adv[:, :2])


def test_groups_are_separate_and_a_group_of_one_gets_zero():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 2.0], [5.0, 0.0]])
    mask = torch.tensor([[1, 0], [1, 1], [1, 0]])
    pi = torch.full((3, 2), 0.5)
    sps = torch.full((3, 2), 0.5)  # w = 0.5 everywhere
    adv, _ = _otb(rewards, mask, ["a", "a", "solo"], pi, sps)
    # group a, t = 0: G = (1, 2), W = (0.5, 0.5): B = 1.5; t = 1: row 1 alone -> A = G = 2
    torch.testing.assert_close(adv, torch.tensor([[-0.5, 0.0], [0.5, 2.0], [0.0, 0.0]]))


@pytest.mark.parametrize("score", [5.7, 37.3, 1e3 / 3])
@pytest.mark.parametrize("group_size", [3, 7, 8, 16])
def test_all_equal_group_gets_exactly_zero(score, group_size):
    # different lengths, the same score on each last token; random policy statistics
    g = torch.Generator().manual_seed(group_size)
    length = 4
    rewards = torch.zeros(group_size, length)
    mask = torch.zeros(group_size, length)
    for i in range(group_size):
        n = 1 + i % length
        mask[i, :n] = 1
        rewards[i, n - 1] = score
    pi = torch.rand(group_size, length, generator=g) * 0.9 + 0.05
    sps = pi**2 + torch.rand(group_size, length, generator=g) * (1 - pi) ** 2
    adv, _ = _otb(rewards, mask, ["p"] * group_size, pi, sps)
    assert torch.count_nonzero(adv) == 0


def test_missing_policy_statistics_is_an_error():
    x = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="sum_pi_squared"):
        get_advantage_estimator(OTB)(x, torch.ones(2, 2), ["a", "a"], old_log_probs=x)


def test_registry_entry_asks_the_actor_for_sum_pi_squared():
    info = ADVANTAGE_ESTIMATORS.info(OTB)
    assert info["needs_index"] and info["needs_sum_pi_squared"]
    assert ADVANTAGE_ESTIMATORS.hyperparameters(OTB) == {
        "handle_zero_tail": True,
        "epsilon": 1e-8,
    }


def test_sum_pi_squared_from_the_log_prob_pass():
    from verl.kernels.torch_functional import compute_response_log_probs

    torch.manual_seed(0)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(5, 5)

        def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None):
            return type("Out", (), {"logits": self.emb(input_ids)})()

    model = Tiny()
    ids = torch.tensor([[1, 2, 3, 4]])
    lp, _, sps = compute_response_log_probs(
        model, ids, torch.ones_like(ids), torch.arange(4)[None], 2, calculate_sum_pi_squared=True
    )
    probs = torch.softmax(model.emb(ids[:, 1:3]), dim=-1)
    torch.testing.assert_close(sps, probs.square().sum(-1))
    assert math.isclose(lp[0, 0].item(), probs[0, 0, 3].log().item(), rel_tol=1e-5)
