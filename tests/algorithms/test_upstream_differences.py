"""Deliberate differences from upstream verl's ``core_algos.py``, pinned on our side.

Each test states, with hand-computed numbers, what this implementation does where upstream
verl (volcengine/verl, ``verl/trainer/ppo/core_algos.py``) does something else; the
upstream value is given in a comment for comparison. The docs pages under
``docs/algorithms/`` ("Differences from upstream verl") describe each case. Cases that
other test files already pin (singleton and all-equal groups for GRPO/RLOO/OPO/
REINFORCE++-baseline, ``seq-mean-token-sum-norm`` dividing by the batch size, the KL
controller leaving out empty responses, ReMax's default form) are not repeated here.
"""

import pytest
import torch

from verl.algorithms.advantages import get_advantage_estimator
from verl.algorithms.policy_loss import get_policy_loss
from verl.config import load_config


def _t(x):
    return torch.tensor(x, dtype=torch.float32)


def test_gpg_group_of_one_gets_zero():
    # group "a" = (1, 0) is informative, "solo" has one response: B = 3 rows, M = 2
    # informative rows -> alpha = 1.5; A_a = 1.5 * (+-0.5). Upstream gives the singleton
    # alpha * (3 - 0) = 4.5 (its group mean is taken as 0).
    adv, _ = get_advantage_estimator("gpg")(
        _t([[1.0], [0.0], [3.0]]), torch.ones(3, 1), ["a", "a", "solo"]
    )
    torch.testing.assert_close(adv, _t([[0.75], [-0.75], [0.0]]))


def test_gpg_alpha_counts_rows_of_informative_groups_not_nonzero_scores():
    # groups a = (1, 0), b = (1, 1), c = (0, 0): B = 6, rows in informative groups M = 2
    # -> alpha = 3, A_a = 3 * (+-0.5). Upstream: M = count_nonzero(scores) = 3 -> alpha = 2,
    # A_a = (1, -1).
    rewards = _t([[1.0], [0.0], [1.0], [1.0], [0.0], [0.0]])
    adv, _ = get_advantage_estimator("gpg")(
        rewards, torch.ones(6, 1), ["a", "a", "b", "b", "c", "c"]
    )
    torch.testing.assert_close(adv, _t([[1.5], [-1.5], [0.0], [0.0], [0.0], [0.0]]))


def test_opo_group_of_empty_responses_is_zero_not_nan():
    # group "e" has two empty responses: sum of lengths 0. Upstream's baseline is 0 / 0.
    rewards = _t([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    mask = _t([[1, 0], [1, 1], [0, 0], [0, 0]])
    adv, _ = get_advantage_estimator("opo")(rewards, mask, ["g", "g", "e", "e"])
    # group g: lengths (1, 2), scores (1, 0) -> baseline 1/3
    torch.testing.assert_close(adv, _t([[2 / 3, 0.0], [-1 / 3, -1 / 3], [0, 0], [0, 0]]))


def test_reinforce_plus_plus_return_skips_a_masked_span():
    # tokens (valid, masked tool output, valid), gamma 0.5: G = (0.5 * 1, 0, 1); the reward
    # 5 on the masked token is ignored. Upstream resets the return at the masked token:
    # returns (0, 5.5, 1).
    _, ret = get_advantage_estimator("reinforce_plus_plus")(
        _t([[0.0, 5.0, 1.0]]), _t([[1, 0, 1]]), gamma=0.5
    )
    torch.testing.assert_close(ret, _t([[0.5, 0.0, 1.0]]))


def test_cispo_applies_no_lower_bound_to_the_weight():
    # ratio 0.5 with A = +1 and log pi = -1: weight stays 0.5 (upstream clamps it to
    # 1 - clip_ratio_low = 0.8: loss 0.8, gradient -0.8, clipfrac 1).
    old = _t([[-1.0 + 0.6931471805599453]])  # log 2 above log pi -> ratio 0.5
    log_prob = torch.tensor([[-1.0]], requires_grad=True)
    loss, metrics = get_policy_loss("cispo")(
        old, log_prob, torch.ones(1, 1), torch.ones(1, 1), clip_ratio_low=0.2
    )
    assert loss.item() == pytest.approx(0.5)
    assert metrics["clipfrac"] == 0.0
    loss.backward()
    torch.testing.assert_close(log_prob.grad, _t([[-0.5]]))


def test_clip_cov_cut_tokens_keep_their_loss_value():
    # A = (3, 1, -1, -1), log pi = (-1, -3, -3, -1): mean A 0.5, mean log pi -2, so
    # cov = (2.5, -0.5, 1.5, -1.5); tokens 0 and 2 lie in (1, 5) and ratio 0.5 cuts both.
    # Ratio 1: per-token loss -A = (-3, -1, 1, 1). Value here: mean -0.5 (cut tokens are
    # detached, not removed). Upstream multiplies them by 0: (0 - 1 + 0 + 1) / 4 = 0.
    logp = [[-1.0, -3.0, -3.0, -1.0]]
    log_prob = torch.tensor(logp, requires_grad=True)
    loss, metrics = get_policy_loss("clip_cov")(
        _t(logp), log_prob, _t([[3.0, 1.0, -1.0, -1.0]]), torch.ones(1, 4), clip_cov_ratio=0.5
    )
    assert loss.item() == pytest.approx(-0.5)
    assert metrics["clip_cov_frac"] == pytest.approx(0.5)
    assert metrics["clipfrac"] == 0.0  # PPO's clip fraction; upstream reports the cut share
    loss.backward()
    # the gradient is the same on both sides: 0 on cut tokens, -A / 4 elsewhere
    torch.testing.assert_close(log_prob.grad, _t([[0.0, -0.25, 0.0, 0.25]]))


def test_kl_cov_default_coefficient_is_one():
    # Two valid tokens, the top-1 covariance token gets ppo_kl_coef * |log r|. The
    # function default is 1.0 (not in our config); upstream's YAML sets 0.1.
    adv = _t([[1.0, -1.0]])
    logp = [[-1.0, -2.0]]  # mean A 0, mean log pi -1.5: cov = (1 * 0.5, -1 * -0.5), a tie
    log_prob = _t(logp)
    old = log_prob - 0.1  # log r = 0.1 on both tokens
    loss, metrics = get_policy_loss("kl_cov")(
        old, log_prob, adv, torch.ones(1, 2), kl_cov_ratio=0.5
    )
    r = torch.exp(torch.tensor(0.1)).item()
    # surrogate -A r sums to 0; one penalised token adds 1.0 * 0.1; token-mean over 2
    assert loss.item() == pytest.approx((-r + r + 0.1) / 2, abs=1e-6)
    assert metrics["kl_cov_frac"] == pytest.approx(0.5)


def test_gspo_aggregates_with_the_configured_mode():
    # ratio 1; seq 0 has 1 valid token with A = +1, seq 1 has 3 with A = -1: per-token loss
    # -A = (-1 | 1, 1, 1). token-mean = 2 / 4 = 0.5. Upstream always uses
    # seq-mean-token-mean: (-1 + 1) / 2 = 0, which is what we give when asked for it.
    old = torch.zeros(2, 3)
    adv = _t([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = _t([[1, 0, 0], [1, 1, 1]])
    gspo = get_policy_loss("gspo")
    token_mean, _ = gspo(old, old.clone(), adv, mask, loss_agg_mode="token-mean")
    seq_mean, _ = gspo(old, old.clone(), adv, mask, loss_agg_mode="seq-mean-token-mean")
    assert token_mean.item() == pytest.approx(0.5)
    assert seq_mean.item() == pytest.approx(0.0)


@pytest.mark.parametrize(
    ("overrides", "mode"),
    [
        # gspo with loss_agg_mode left null: the paper's (and upstream's) aggregation
        (["actor_rollout_ref.actor.policy_loss=gspo"], "seq-mean-token-mean"),
        # an explicit choice always wins
        (
            [
                "actor_rollout_ref.actor.policy_loss=gspo",
                "actor_rollout_ref.actor.loss_agg_mode=token-mean",
            ],
            "token-mean",
        ),
        # a loss without a preference: token-mean
        ([], "token-mean"),
        (["actor_rollout_ref.actor.policy_loss=cispo"], "token-mean"),
        (["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum"], "seq-mean-token-sum"),
    ],
)
def test_null_loss_agg_mode_takes_the_policy_loss_preference(overrides, mode):
    cfg = load_config(overrides=overrides)
    assert cfg.actor_rollout_ref.actor.resolved_loss_agg_mode == mode
