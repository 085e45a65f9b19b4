"""Advantage estimators against hand arithmetic and plain-Python reference loops."""

import math
import statistics

import numpy as np
import pytest
import torch

from verl.algorithms.advantages import (
    estimator_info,
    estimator_requires_critic,
    get_advantage_estimator,
    group_ids_from_index,
    informative_group_mask,
)

gae = get_advantage_estimator("gae")
grpo = get_advantage_estimator("grpo")


# --------------------------------------------------------------------------- references


def _whiten_ref(rows, masks):
    """Whiten the valid entries of nested lists with the unbiased std (plain Python)."""
    flat = [v for row, m in zip(rows, masks) for v, k in zip(row, m) if k]
    mean = statistics.fmean(flat)
    var = statistics.variance(flat) if len(flat) > 1 else 0.0
    return [
        [(v - mean) / math.sqrt(var + 1e-8) if k else 0.0 for v, k in zip(row, m)]
        for row, m in zip(rows, masks)
    ]


def _gae_ref(rewards, values, masks, gamma, lam):
    advs, rets = [], []
    for r, v, m in zip(rewards, values, masks):
        adv = [0.0] * len(r)
        next_v, next_a = 0.0, 0.0
        for t in reversed([t for t in range(len(r)) if m[t]]):
            delta = r[t] + gamma * next_v - v[t]
            next_a = delta + gamma * lam * next_a
            next_v = v[t]
            adv[t] = next_a
        advs.append(adv)
        rets.append([a + vv if k else 0.0 for a, vv, k in zip(adv, v, m)])
    return _whiten_ref(advs, masks), rets


def _scores(rewards, masks):
    return [sum(x for x, k in zip(r, m) if k) for r, m in zip(rewards, masks)]


def _groups(index):
    groups = {}
    for i, key in enumerate(index):
        groups.setdefault(key, []).append(i)
    return groups


def _broadcast(values, masks):
    return [[v if k else 0.0 for k in m] for v, m in zip(values, masks)]


def _t(x):
    return torch.tensor(x, dtype=torch.float32)


# --------------------------------------------------------------------------- GAE


def test_gae_hand_computed_single_row():
    # gamma = lam = 0.5, rewards (0, 0, 1), values (1, 2, 3):
    # t2: delta = 1 + 0 - 3 = -2,             A = -2
    # t1: delta = 0 + 0.5*3 - 2 = -0.5,       A = -0.5 + 0.25*(-2) = -1
    # t0: delta = 0 + 0.5*2 - 1 = 0,          A = 0 + 0.25*(-1) = -0.25
    # returns = A + V = (0.75, 1, 1); whitened A: mean -13/12, unbiased var = 0.8958...
    rewards, values, mask = _t([[0, 0, 1]]), _t([[1, 2, 3]]), _t([[1, 1, 1]])
    adv, ret = gae(rewards, values, mask, gamma=0.5, lam=0.5)
    torch.testing.assert_close(ret, _t([[0.75, 1.0, 1.0]]))
    raw = [-0.25, -1.0, -2.0]
    mean = sum(raw) / 3
    std = math.sqrt(sum((a - mean) ** 2 for a in raw) / 2)
    torch.testing.assert_close(adv, _t([[(a - mean) / std for a in raw]]))


def test_gae_gamma_lam_one_returns_are_reward_to_go():
    rewards, values, mask = _t([[0, 0, 1]]), _t([[0.5, 0.5, 0.5]]), _t([[1, 1, 1]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    torch.testing.assert_close(ret, _t([[1.0, 1.0, 1.0]]))  # A = 0.5 everywhere, + V
    assert torch.all(adv == 0)  # constant advantages whiten to 0


def test_gae_padding_does_not_leak():
    # Row 0 is right-padded after 2 tokens; its padding holds junk rewards and values.
    rewards = [[0.0, 1.0, 5.0, 7.0], [0.5, 0.0, 0.0, 2.0]]
    values = [[0.2, 0.4, 1e6, -1e6], [0.1, 0.3, 0.6, 0.9]]
    masks = [[1, 1, 0, 0], [1, 1, 1, 1]]
    adv, ret = gae(_t(rewards), _t(values), _t(masks), gamma=0.9, lam=0.8)
    ref_adv, ref_ret = _gae_ref(rewards, values, masks, 0.9, 0.8)
    torch.testing.assert_close(adv, _t(ref_adv))
    torch.testing.assert_close(ret, _t(ref_ret))
    # the last valid token of row 0 sees V_next = 0: A = r - V = 1 - 0.4 -> return 1.0
    assert ret[0, 1].item() == pytest.approx(1.0)
    assert torch.all(adv[0, 2:] == 0) and torch.all(ret[0, 2:] == 0)


def test_gae_masked_span_inside_response_is_skipped():
    # tokens 1-2 are masked (e.g. tool output): token 0 bootstraps from token 3
    rewards = [[0.0, 9.0, 9.0, 1.0]]
    values = [[0.5, 100.0, 100.0, 0.25]]
    masks = [[1, 0, 0, 1]]
    adv, ret = gae(_t(rewards), _t(values), _t(masks), gamma=1.0, lam=1.0)
    # t3: A = 1 - 0.25 = 0.75; t0: delta = 0 + 0.25 - 0.5 = -0.25, A = -0.25 + 0.75 = 0.5
    torch.testing.assert_close(ret, _t([[1.0, 0.0, 0.0, 1.0]]))
    ref_adv, _ = _gae_ref(rewards, values, masks, 1.0, 1.0)
    torch.testing.assert_close(adv, _t(ref_adv))


def test_gae_random_against_reference_and_zero_length_row():
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(4, 6, generator=g)
    values = torch.randn(4, 6, generator=g)
    lengths = [6, 3, 1, 0]
    masks = [[1 if t < n else 0 for t in range(6)] for n in lengths]
    adv, ret = gae(rewards, values, torch.tensor(masks), gamma=0.99, lam=0.95)
    ref_adv, ref_ret = _gae_ref(rewards.tolist(), values.tolist(), masks, 0.99, 0.95)
    torch.testing.assert_close(adv, _t(ref_adv), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret, _t(ref_ret), atol=1e-5, rtol=1e-5)
    assert torch.all(adv[3] == 0) and torch.isfinite(adv).all()


def test_gae_requires_values():
    with pytest.raises(ValueError, match="needs `values`"):
        gae(_t([[1.0]]), None, _t([[1.0]]), gamma=1.0, lam=1.0)


# --------------------------------------------------------------------------- GRPO


def test_grpo_hand_computed():
    # group "a": scores (1, 0, 1, 1): mean 0.75, unbiased var (3*0.0625 + 0.5625)/3 = 0.25
    # -> std 0.5 -> A = (0.5, -1.5, 0.5, 0.5). "b" is a group of one -> 0.
    # group "c": all-equal scores -> 0.
    rewards = _t([[0, 1], [0, 0], [1, 0], [0, 1], [0, 3], [0, 2], [2, 0]])
    masks = _t([[1, 1], [1, 1], [1, 0], [1, 1], [1, 1], [1, 1], [1, 1]])
    index = np.array(["a", "a", "a", "a", "b", "c", "c"], dtype=object)
    adv, ret = grpo(rewards, masks, index)
    eps = 1e-6
    a = [0.25 / (0.5 + eps), -0.75 / (0.5 + eps)]
    expected = [[a[0], a[0]], [a[1], a[1]], [a[0], 0.0], [a[0], a[0]], [0, 0], [0, 0], [0, 0]]
    torch.testing.assert_close(adv, _t(expected))
    torch.testing.assert_close(ret, adv)


def test_grpo_matches_torch_std_reference_with_int_index():
    g = torch.Generator().manual_seed(1)
    rewards = torch.rand(6, 3, generator=g)
    masks = [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [0, 0, 0]]
    index = [7, 3, 7, 3, 7, 3]
    adv, _ = grpo(rewards, torch.tensor(masks), index, epsilon=1e-6)
    scores = _scores(rewards.tolist(), masks)
    seq = [0.0] * 6
    for members in _groups(index).values():
        group = torch.tensor([scores[i] for i in members])
        mean, std = group.mean().item(), torch.std(group).item()
        for i in members:
            seq[i] = (scores[i] - mean) / (std + 1e-6)
    torch.testing.assert_close(adv, _t(_broadcast(seq, masks)), atol=1e-5, rtol=1e-5)
    # the zero-length row (score 0) takes part in the group stats but gets no advantage
    assert torch.all(adv[5] == 0)


def test_grpo_without_std_is_dr_grpo():
    rewards = _t([[1.0], [0.0], [0.0], [5.0]])
    masks = torch.ones(4, 1)
    adv, _ = grpo(rewards, masks, ["p", "p", "p", "q"], norm_adv_by_std=False)
    torch.testing.assert_close(adv, _t([[2 / 3], [-1 / 3], [-1 / 3], [0.0]]))


def test_grpo_index_forms_give_the_same_result():
    rewards = _t([[1.0], [0.0], [0.5], [0.25]])
    masks = torch.ones(4, 1)
    ref, _ = grpo(rewards, masks, ["x", "y", "x", "y"])
    forms = [
        np.array(["x", "y", "x", "y"], dtype=object),
        np.array([0, 1, 0, 1]),
        torch.tensor([5, 6, 5, 6]),  # tensor elements would hash by identity: converted
        [("t", 1), ("t", 2), ("t", 1), ("t", 2)],
    ]
    for index in forms:
        torch.testing.assert_close(grpo(rewards, masks, index)[0], ref)


def test_grpo_errors():
    with pytest.raises(ValueError, match=r"len\(index\)=1 does not match batch size 2"):
        grpo(torch.zeros(2, 1), torch.ones(2, 1), ["a"])
    with pytest.raises(ValueError, match="needs `index`"):
        grpo(torch.zeros(2, 1), torch.ones(2, 1), None)


def test_group_ids_from_index_first_appearance_order():
    ids, n = group_ids_from_index(["b", "a", "b", "c"], 4)
    assert ids.tolist() == [0, 1, 0, 2] and n == 3


# --------------------------------------------------------------------------- registry


def test_estimator_metadata():
    assert estimator_requires_critic("gae")
    for name in ("grpo", "rloo", "reinforce_plus_plus", "remax", "opo", "gpg"):
        assert not estimator_requires_critic(name)
    assert estimator_info("grpo")["needs_index"]
    assert estimator_info("remax")["needs_baseline"]
    assert not estimator_info("gae")["needs_index"]
    with pytest.raises(ValueError, match="Did you mean 'grpo'"):
        get_advantage_estimator("gpro")


ALL_ESTIMATORS = [
    "gae",
    "grpo",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "gpg",
]


@pytest.mark.parametrize("name", ALL_ESTIMATORS)
def test_uniform_call_shapes_and_masking(name):
    g = torch.Generator().manual_seed(2)
    rewards = torch.rand(4, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    rewards[mask == 0] = float("nan")  # junk in the padding must not leak
    adv, ret = get_advantage_estimator(name)(
        token_level_rewards=rewards,
        values=torch.rand(4, 5, generator=g),
        response_mask=mask,
        index=np.array(["u", "u", "v", "v"], dtype=object),
        reward_baselines=torch.rand(4, generator=g),
        gamma=0.9,
        lam=0.95,
        unused_option=123,
    )
    assert adv.shape == ret.shape == (4, 5)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)
    assert not adv.requires_grad


# --------------------------------------------------------------------------- issue-5 extras


def test_rloo_hand_computed():
    # group (1, 0, 0): A_0 = 1 - mean(0, 0) = 1, A_1 = 0 - mean(1, 0) = -0.5; group of one -> 0
    rewards = _t([[0, 1], [0, 0], [0, 0], [4, 0]])
    masks = torch.ones(4, 2)
    adv, ret = get_advantage_estimator("rloo")(rewards, masks, [1, 1, 1, 2])
    torch.testing.assert_close(adv, _t([[1, 1], [-0.5, -0.5], [-0.5, -0.5], [0, 0]]))
    torch.testing.assert_close(ret, adv)


def test_rloo_equals_leave_one_out_reference():
    g = torch.Generator().manual_seed(3)
    rewards = torch.rand(6, 2, generator=g)
    masks = [[1, 1]] * 6
    index = ["a", "b", "a", "a", "b", "b"]
    adv, _ = get_advantage_estimator("rloo")(rewards, torch.tensor(masks), index)
    scores = _scores(rewards.tolist(), masks)
    seq = []
    for i, key in enumerate(index):
        others = [scores[j] for j in range(6) if index[j] == key and j != i]
        seq.append(scores[i] - sum(others) / len(others))
    torch.testing.assert_close(adv, _t(_broadcast(seq, masks)))


def test_reinforce_plus_plus_discounted_return_to_go():
    rewards = [[0.0, 0.0, 1.0], [2.0, 7.0, 7.0]]
    masks = [[1, 1, 1], [1, 0, 0]]
    adv, ret = get_advantage_estimator("reinforce_plus_plus")(_t(rewards), _t(masks), gamma=0.5)
    # row 0: G = (0.25, 0.5, 1); row 1: only token 0 -> G = 2
    torch.testing.assert_close(ret, _t([[0.25, 0.5, 1.0], [2.0, 0.0, 0.0]]))
    torch.testing.assert_close(adv, _t(_whiten_ref(ret.tolist(), masks)))


def test_reinforce_plus_plus_baseline():
    rewards = [[0.0, 1.0], [0.0, 0.0], [3.0, 0.0]]
    masks = [[1, 1], [1, 1], [1, 0]]
    adv, ret = get_advantage_estimator("reinforce_plus_plus_baseline")(
        _t(rewards), _t(masks), ["g", "g", "solo"]
    )
    # centred scores: +0.5, -0.5, 0 (group of one) -> tokens (.5, .5, -.5, -.5, 0)
    centred = [[0.5, 0.5], [-0.5, -0.5], [0.0, 0.0]]
    torch.testing.assert_close(adv, _t(_whiten_ref(centred, masks)))
    torch.testing.assert_close(ret, adv)


def test_remax():
    rewards = _t([[0, 1], [0.5, 0], [9, 9]])
    masks = _t([[1, 1], [1, 1], [0, 0]])
    adv, ret = get_advantage_estimator("remax")(
        rewards, masks, reward_baselines=_t([0.25, 1.0, 0.0])
    )
    torch.testing.assert_close(adv, _t([[0.75, 0.75], [-0.5, -0.5], [0, 0]]))
    torch.testing.assert_close(ret, adv)
    with pytest.raises(ValueError, match="reward_baselines has 2 entries for a batch of 3"):
        get_advantage_estimator("remax")(rewards, masks, reward_baselines=_t([0.0, 1.0]))


def test_remax_reward_to_go():
    # dense rewards (a KL penalty per token, the score at the end): row 0 = (-0.1, -0.2, 1)
    rewards = _t([[-0.1, -0.2, 1.0], [0.5, 0.0, 7.0]])
    masks = _t([[1, 1, 1], [1, 1, 0]])
    baselines = _t([0.5, 0.25])
    adv, ret = get_advantage_estimator("remax")(
        rewards, masks, reward_baselines=baselines, reward_to_go=True
    )
    # row 0: to-go (0.7, 0.8, 1.0) - 0.5; row 1: to-go (0.5, 0.0) - 0.25, padding 0
    torch.testing.assert_close(adv, _t([[0.2, 0.3, 0.5], [0.25, -0.25, 0.0]]))
    torch.testing.assert_close(ret, adv)
    # the paper's form: the whole score (0.7, 0.5) minus the baseline on every token
    whole, _ = get_advantage_estimator("remax")(rewards, masks, reward_baselines=baselines)
    torch.testing.assert_close(whole, _t([[0.2, 0.2, 0.2], [0.25, 0.25, 0.0]]))
    # with an outcome reward only (on the last valid token) both forms agree
    outcome = _t([[0, 0, 1.0], [0, 2.0, 9.0]])
    a, _ = get_advantage_estimator("remax")(outcome, masks, reward_baselines=baselines)
    b, _ = get_advantage_estimator("remax")(
        outcome, masks, reward_baselines=baselines, reward_to_go=True
    )
    torch.testing.assert_close(a, b)


def test_opo_length_weighted_baseline():
    # group lengths (1, 3), scores (1, 0): baseline = (1*1 + 3*0) / 4 = 0.25
    rewards = _t([[1, 0, 0], [0, 0, 0], [2, 0, 0]])
    masks = _t([[1, 0, 0], [1, 1, 1], [1, 1, 0]])
    adv, _ = get_advantage_estimator("opo")(rewards, masks, ["g", "g", "solo"])
    torch.testing.assert_close(adv, _t([[0.75, 0, 0], [-0.25, -0.25, -0.25], [0, 0, 0]]))


def test_gpg_rescales_by_informative_fraction():
    # group a (1, 0) is informative, group b (1, 1) is not: alpha = 4 / 2 = 2
    rewards = _t([[1.0], [0.0], [1.0], [1.0]])
    adv, _ = get_advantage_estimator("gpg")(rewards, torch.ones(4, 1), ["a", "a", "b", "b"])
    torch.testing.assert_close(adv, _t([[1.0], [-1.0], [0.0], [0.0]]))


def test_informative_group_mask():
    keep = informative_group_mask(_t([1, 0, 1, 1, 3]), ["a", "a", "b", "b", "c"])
    assert keep.tolist() == [True, True, False, False, False]


# --------------------------------------------------------------------------- all-equal groups

# Estimators that compare a response with its group: an all-equal group carries no signal.
GROUP_ESTIMATORS = [
    ("grpo", {}),
    ("grpo", {"norm_adv_by_std": False}),
    ("rloo", {}),
    ("opo", {}),
    ("gpg", {}),
    ("reinforce_plus_plus_baseline", {}),
    ("grpo_passk", {}),
    ("grpo_passk", {"norm_adv_by_std": False}),
]


@pytest.mark.parametrize("name,kwargs", GROUP_ESTIMATORS)
@pytest.mark.parametrize("score", [5.7, 37.3, 1e3 / 3, 0.1])
@pytest.mark.parametrize("group_size", [3, 7, 8, 16])
def test_all_equal_group_gets_exactly_zero(name, kwargs, score, group_size):
    # Float32 cannot hold 5.7: its float32 group mean was 5.6999993 with a std of 5.8e-7,
    # which gave every response of the group the same advantage (+0.301 for 3 x 5.7).
    # The score sits on a different token per row and the lengths differ (OPO weighs by
    # length), so the sequence sums are computed the way training computes them.
    length = 4
    rewards = torch.zeros(group_size, length)
    mask = torch.zeros(group_size, length)
    for i in range(group_size):
        n = 1 + i % length
        mask[i, :n] = 1
        rewards[i, n - 1] = score
    adv, ret = get_advantage_estimator(name)(
        token_level_rewards=rewards, response_mask=mask, index=["p"] * group_size, **kwargs
    )
    assert torch.count_nonzero(adv) == 0 and torch.count_nonzero(ret) == 0


@pytest.mark.parametrize("name,kwargs", GROUP_ESTIMATORS)
def test_all_equal_group_beside_an_informative_one(name, kwargs):
    # Group "a" is all 37.3 (zero advantage); group "b" (1, 0) is informative. The
    # informative group's advantages do not depend on the dead group being there, except
    # through GPG's batch rescaling (alpha = B / M) and REINFORCE++'s batch whitening.
    rewards = _t([[37.3]] * 7 + [[1.0], [0.0]])
    index = ["a"] * 7 + ["b", "b"]
    adv, _ = get_advantage_estimator(name)(rewards, torch.ones(9, 1), index, **kwargs)
    assert torch.count_nonzero(adv[:7]) == 0
    if name == "reinforce_plus_plus_baseline":
        # centred (0 x7, 0.5, -0.5) whitened over 9 values: mean 0, var 0.5 / 8
        b = 0.5 / math.sqrt(0.5 / 8 + 1e-8)
        expected = [b, -b]
    elif name == "grpo_passk":
        # only the best of (1, 0) is credited: 1 - 0, over std(1, 0) = 0.7071 when normed
        expected = [1 / math.sqrt(0.5) if kwargs.get("norm_adv_by_std", True) else 1.0, 0.0]
    elif name == "grpo" and kwargs.get("norm_adv_by_std", True):
        expected = [0.5 / math.sqrt(0.5), -0.5 / math.sqrt(0.5)]  # std of (1, 0) = 0.7071
    else:
        expected = {
            "grpo": [0.5, -0.5],  # Dr.GRPO: no std
            "rloo": [1.0, -1.0],
            "opo": [0.5, -0.5],
            "gpg": [9 / 2 * 0.5, -9 / 2 * 0.5],  # alpha = 9 rows / 2 informative
        }[name]
    torch.testing.assert_close(adv[7:, 0], _t(expected), rtol=1e-5, atol=1e-5)


def test_whitening_a_constant_batch_gives_zero():
    # REINFORCE++ without a baseline whitens returns over the batch; a batch where every
    # response scored 5.7 must not turn float32 rounding noise into +-1 advantages.
    rewards = torch.full((8, 1), 5.7)
    adv, _ = get_advantage_estimator("reinforce_plus_plus")(rewards, torch.ones(8, 1))
    assert adv.abs().max() < 1e-6


def test_informative_group_mask_float32_equal_scores():
    scores = torch.full((7,), 37.3)
    assert not informative_group_mask(scores, ["g"] * 7).any()


# --------------------------------------------------------------------------- GRPO pass@k


def test_grpo_passk_credits_only_the_best_response():
    # group a = (1, 3, 2): best 3, second 2 -> A = 1 / (std + eps), std(1, 3, 2) = 1.
    # group b = (5, 5): two share the max -> s_second = s_max -> 0 for both.
    # group c = (4,): a group of one -> 0. group d = (0, 2, 2.5, 0.5): 0.5 over std.
    rewards = _t([[1.0], [3.0], [2.0], [5.0], [5.0], [4.0], [0.0], [2.0], [2.5], [0.5]])
    index = ["a", "a", "a", "b", "b", "c", "d", "d", "d", "d"]
    mask = torch.ones(10, 1)
    fn = get_advantage_estimator("grpo_passk")
    adv, ret = fn(rewards, mask, index)
    std_d = float(torch.tensor([0.0, 2.0, 2.5, 0.5], dtype=torch.float64).std())
    expected = [0, 1 / (1 + 1e-6), 0, 0, 0, 0, 0, 0, 0.5 / (std_d + 1e-6), 0]
    torch.testing.assert_close(adv[:, 0], _t(expected))
    torch.testing.assert_close(ret, adv)
    plain, _ = fn(rewards, mask, index, norm_adv_by_std=False)
    torch.testing.assert_close(plain[:, 0], _t([0, 1, 0, 0, 0, 0, 0, 0, 0.5, 0]))


def test_grpo_passk_broadcasts_over_valid_tokens_and_ignores_masked_rewards():
    # scores (sum over valid tokens): row 0 = 1 + 2 = 3 (the 9 is masked), row 1 = 1
    rewards = _t([[1.0, 2.0, 9.0], [0.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv, _ = get_advantage_estimator("grpo_passk")(rewards, mask, ["p", "p"], norm_adv_by_std=False)
    torch.testing.assert_close(adv, _t([[2.0, 2.0, 0.0], [0.0, 0.0, 0.0]]))
