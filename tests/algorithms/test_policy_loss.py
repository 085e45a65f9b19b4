"""Policy losses against hand-computed values and expected gradients."""

import math

import pytest
import torch

from verl.algorithms.policy_loss import get_policy_loss

vanilla = get_policy_loss("vanilla")

# Six valid tokens + one masked, chosen to hit every branch of dual-clip PPO
# (clip 0.2, clip_ratio_c 3):
#   t  ratio  A    -A r   -A clip(r)  ppo   dual cap  loss  branch
#   0  1.0    +1   -1.0   -1.0        -1.0  -         -1.0  unclipped
#   1  1.5    +1   -1.5   -1.2        -1.2  -         -1.2  clipped high
#   2  0.5    -1   +0.5   +0.8        +0.8  3         +0.8  clipped low
#   3  5.0    -1   +5.0   +1.2        +5.0  3         +3.0  dual clip
#   4  0.5    +1   -0.5   -0.8        -0.5  -         -0.5  unclipped (pessimistic)
#   5  1.5    -1   +1.5   +1.2        +1.5  3         +1.5  unclipped
#   6  masked (junk ratio)
RATIOS = [1.0, 1.5, 0.5, 5.0, 0.5, 1.5, 100.0]
ADV = [1.0, 1.0, -1.0, -1.0, 1.0, -1.0, 7.0]
MASK = [1, 1, 1, 1, 1, 1, 0]


def _inputs():
    old = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -1.5, -2.5, -1.0]])
    log_prob = (old + torch.log(torch.tensor([RATIOS]))).requires_grad_(True)
    return old, log_prob, torch.tensor([ADV]), torch.tensor([MASK])


def test_vanilla_loss_metrics_and_gradient():
    old, log_prob, adv, mask = _inputs()
    loss, metrics = vanilla(old, log_prob, adv, mask)
    assert loss.item() == pytest.approx((-1.0 - 1.2 + 0.8 + 3.0 - 0.5 + 1.5) / 6)
    assert metrics["clipfrac"] == pytest.approx(2 / 6)  # t1, t2
    assert metrics["clipfrac_lower"] == pytest.approx(1 / 6)  # t3
    log_ratios = [math.log(r) for r in RATIOS[:6]]
    assert metrics["approx_kl"] == pytest.approx(-sum(log_ratios) / 6, abs=1e-6)
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in metrics.values())
    loss.backward()
    # d(-A r)/d log_prob = -A r on unclipped tokens, 0 where a clip or the cap is active
    expected = [-1.0 / 6, 0.0, 0.0, 0.0, -0.5 / 6, 1.5 / 6, 0.0]
    torch.testing.assert_close(log_prob.grad, torch.tensor([expected]))


def test_vanilla_without_dual_clip_and_asymmetric_clip():
    old, log_prob, adv, mask = _inputs()
    loss, metrics = vanilla(old, log_prob, adv, mask, clip_ratio_c=None)
    assert loss.item() == pytest.approx((-1.0 - 1.2 + 0.8 + 5.0 - 0.5 + 1.5) / 6)
    assert metrics["clipfrac_lower"] == 0.0
    # clip-higher: high 0.6 leaves t1 (ratio 1.5) unclipped -> -1.5
    loss, metrics = vanilla(old, log_prob, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.6)
    assert loss.item() == pytest.approx((-1.0 - 1.5 + 0.8 + 3.0 - 0.5 + 1.5) / 6)
    assert metrics["clipfrac"] == pytest.approx(1 / 6)


def test_vanilla_rollout_is_weights_and_agg_mode():
    old, log_prob, adv, mask = _inputs()
    weights = torch.tensor([[2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    loss, _ = vanilla(old, log_prob, adv, mask, rollout_is_weights=weights)
    assert loss.item() == pytest.approx((-2.0 - 1.2 + 0.8 + 3.0 - 0.5 + 1.5) / 6)
    loss, _ = vanilla(old, log_prob, adv, mask, loss_agg_mode="seq-mean-token-sum")
    assert loss.item() == pytest.approx(-1.0 - 1.2 + 0.8 + 3.0 - 0.5 + 1.5)


def test_vanilla_extreme_log_ratio_is_finite():
    old = torch.tensor([[-100.0, 0.0]])
    log_prob = torch.tensor([[0.0, -100.0]], requires_grad=True)
    loss, _ = vanilla(old, log_prob, torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2))
    assert torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(log_prob.grad).all()


def test_vanilla_rejects_bad_dual_clip():
    old, log_prob, adv, mask = _inputs()
    with pytest.raises(ValueError, match=r"clip_ratio_c=1\.0 must be > 1\.0"):
        vanilla(old, log_prob, adv, mask, clip_ratio_c=1.0)


def test_vanilla_equals_plain_loop_on_random_inputs():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=g) * 3
    log_prob = old + torch.randn(3, 5, generator=g) * 0.4
    adv = torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]])
    loss, _ = vanilla(old, log_prob, adv, mask, clip_ratio_low=0.1, clip_ratio_high=0.3)
    total, count = 0.0, 0
    for i in range(3):
        for t in range(5):
            if not mask[i, t]:
                continue
            r = math.exp(log_prob[i, t].item() - old[i, t].item())
            a = adv[i, t].item()
            ppo = max(-a * r, -a * min(max(r, 0.9), 1.3))
            total += min(ppo, -a * 3.0) if a < 0 else ppo
            count += 1
    assert loss.item() == pytest.approx(total / count, abs=1e-6)


def test_gspo_sequence_ratio_clip_and_gradient():
    # seq 0: token log-ratios (0.1, -0.1) -> s = exp(0) = 1, unclipped, per-token loss -1
    # seq 1: (0.5, 0.5, 0.5) -> s = e^0.5 > 1.2 with A = +1 -> clipped to 1.2, no gradient
    old = torch.tensor([[-1.0, -1.0, 0.0], [-2.0, -2.0, -2.0]])
    log_prob = (old + torch.tensor([[0.1, -0.1, 33.0], [0.5, 0.5, 0.5]])).requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.ones(2, 3)
    loss, metrics = get_policy_loss("gspo")(old, log_prob, adv, mask)
    # default seq-mean-token-mean: mean(-1, -1.2)
    assert loss.item() == pytest.approx(-1.1)
    assert metrics["clipfrac"] == pytest.approx(3 / 5)
    loss.backward()
    # seq 0 token grad: -A * sg[s] * d exp(lp - sg(lp)) / d lp / (2 seqs * 2 tokens)
    expected = torch.tensor([[-0.25, -0.25, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(log_prob.grad, expected)


def test_gspo_gradient_scales_with_sequence_ratio():
    old = torch.tensor([[0.0, 0.0]])
    log_prob = torch.tensor([[0.1, 0.0]], requires_grad=True)  # s = exp(0.05)
    loss, _ = get_policy_loss("gspo")(
        old, log_prob, -torch.ones(1, 2), torch.ones(1, 2), loss_agg_mode="token-mean"
    )
    s = math.exp(0.05)
    assert loss.item() == pytest.approx(s)  # -A * s, A = -1, within [0.8, 1.2]
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[s / 2, s / 2]]))


def test_cispo_keeps_gradient_on_clipped_tokens():
    old = torch.tensor([[-1.0, -2.0 - math.log(2.0)]])
    log_prob = torch.tensor([[-1.0, -2.0]], requires_grad=True)  # ratios (1, 2)
    adv = torch.ones(1, 2)
    loss, metrics = get_policy_loss("cispo")(old, log_prob, adv, torch.ones(1, 2))
    # weights min(r, 1.2) = (1, 1.2); loss = mean(-1*1*(-1), -1.2*1*(-2)) = (1 + 2.4)/2
    assert loss.item() == pytest.approx(1.7)
    assert metrics["clipfrac"] == pytest.approx(0.5)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.5, -0.6]]))


@pytest.mark.parametrize(
    "name", ["vanilla", "gspo", "cispo", "clip_cov", "kl_cov", "reinforce", "gpg", "sapo", "gmpo"]
)
def test_losses_accept_uniform_call_and_ignore_masked_tokens(name):
    g = torch.Generator().manual_seed(4)
    old = -torch.rand(2, 4, generator=g)
    log_prob = old + 0.1 * torch.randn(2, 4, generator=g)
    adv = torch.randn(2, 4, generator=g)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    fn = get_policy_loss(name)
    kwargs = dict(
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=3.0,
        loss_agg_mode="token-mean",
        rollout_is_weights=None,
        some_future_option=1,
    )
    loss, metrics = fn(old, log_prob, adv, mask, **kwargs)
    junk_adv, junk_lp = adv.clone(), log_prob.clone()
    junk_adv[mask == 0] = 1e4
    junk_lp[mask == 0] = 50.0
    loss2, _ = fn(old, junk_lp, junk_adv, mask, **kwargs)
    assert loss2.item() == pytest.approx(loss.item(), abs=1e-6)
    assert set(metrics) >= {"clipfrac", "clipfrac_lower", "approx_kl"}


def test_unknown_policy_loss():
    with pytest.raises(ValueError, match=r"unknown policy loss 'vanila'.*Did you mean 'vanilla'"):
        get_policy_loss("vanila")


# --------------------------------------------------------------------------- Clip-Cov / KL-Cov
# A = (2, 1, -2, -1), log_prob = (-1, -3, -3, -1): mean A = 0, mean log_prob = -2, so
# cov = A * (log_prob + 2) = (2, -1, 2, -1); tokens 0 and 2 have cov in (1, 5).
COV_ADV = torch.tensor([[2.0, 1.0, -2.0, -1.0]])
COV_LOGP = [[-1.0, -3.0, -3.0, -1.0]]


def test_clip_cov_cuts_gradient_of_high_covariance_tokens():
    old = torch.tensor(COV_LOGP)
    log_prob = torch.tensor(COV_LOGP, requires_grad=True)  # ratio 1: PPO clips nothing
    loss, metrics = get_policy_loss("clip_cov")(
        old, log_prob, COV_ADV, torch.ones(1, 4), clip_cov_ratio=0.5
    )
    assert loss.item() == pytest.approx(0.0)  # mean(-A), value unchanged by the cut
    assert metrics["clip_cov_frac"] == pytest.approx(0.5)
    loss.backward()
    # unclipped grad -A r / 4 = (-0.5, -0.25, 0.5, 0.25), cut on tokens 0 and 2
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, -0.25, 0.0, 0.25]]))


def test_clip_cov_picks_ratio_share_at_random_among_candidates():
    old = torch.tensor(COV_LOGP)
    log_prob = torch.tensor(COV_LOGP, requires_grad=True)
    loss, metrics = get_policy_loss("clip_cov")(
        old,
        log_prob,
        COV_ADV,
        torch.ones(1, 4),
        clip_cov_ratio=0.25,
        generator=torch.Generator().manual_seed(0),
    )
    assert metrics["clip_cov_frac"] == pytest.approx(0.25)  # max(1, int(0.25 * 4)) = 1
    loss.backward()
    cut = (log_prob.grad == 0).squeeze(0).tolist()
    assert cut[1] is False and cut[3] is False and cut[0] != cut[2]


def test_kl_cov_penalises_top_covariance_tokens():
    log_ratio = torch.tensor([[0.1, 0.2, -0.1, 0.3]])
    log_prob = torch.tensor(COV_LOGP, requires_grad=True)
    old = log_prob.detach() - log_ratio
    loss, metrics = get_policy_loss("kl_cov")(
        old, log_prob, COV_ADV, torch.ones(1, 4), kl_cov_ratio=0.5, ppo_kl_coef=2.0
    )
    r = [math.exp(x) for x in (0.1, 0.2, -0.1, 0.3)]
    a = [2.0, 1.0, -2.0, -1.0]
    penalty = [2.0 * 0.1, 0.0, 2.0 * 0.1, 0.0]  # top-2 covariance: tokens 0 and 2
    assert loss.item() == pytest.approx(
        sum(-ai * ri + p for ai, ri, p in zip(a, r, penalty)) / 4, abs=1e-6
    )
    assert metrics["kl_cov_frac"] == pytest.approx(0.5)
    loss.backward()
    sign = [1.0, 0.0, -1.0, 0.0]  # d|log r|/d log_prob on the penalised tokens
    expected = [(-ai * ri + 2.0 * s) / 4 for ai, ri, s in zip(a, r, sign)]
    torch.testing.assert_close(log_prob.grad, torch.tensor([expected]))


def test_cov_losses_handle_all_masked_batch():
    for name in ("clip_cov", "kl_cov"):
        loss, _ = get_policy_loss(name)(
            torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3), torch.zeros(1, 3)
        )
        assert loss.item() == 0.0


def test_loss_scale_factor_reaches_dr_grpo_aggregation():
    import torch

    from verl.algorithms import get_policy_loss

    old = torch.zeros(2, 4)
    adv = torch.tensor([[1.0] * 4, [-0.5] * 4])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    for name in ("vanilla", "gspo"):
        fn = get_policy_loss(name)
        # ratio 1 everywhere: per-token loss is -A; sum over valid tokens = -3 + 1 = -2
        default, _ = fn(old, old.clone(), adv, mask, loss_agg_mode="seq-mean-token-sum-norm")
        scaled, _ = fn(
            old,
            old.clone(),
            adv,
            mask,
            loss_agg_mode="seq-mean-token-sum-norm",
            loss_scale_factor=100.0,
        )
        # default factor = response positions (4): -2 / (2 * 4); with 100: -2 / (2 * 100)
        assert default.item() == pytest.approx(-2 / 8), name
        assert scaled.item() == pytest.approx(-2 / 200), name


# --------------------------------------------------------------------------- REINFORCE / GPG
@pytest.mark.parametrize("name", ["reinforce", "gpg"])
def test_reinforce_is_minus_advantage_times_log_prob(name):
    # per-token -A log pi = (1, 2 | -1, masked); token-mean = (1 + 2 - 1) / 3
    log_prob = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    old = torch.tensor([[-1.5, -2.0], [-0.5, -3.0]])  # the ratio plays no part
    loss, metrics = get_policy_loss(name)(old, log_prob, adv, mask, loss_agg_mode="token-mean")
    assert loss.item() == pytest.approx(2 / 3)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-1 / 3, -1 / 3], [2 / 3, 0.0]]))
    # approx_kl = mean(old - new) over valid tokens = (-0.5 + 0 + 0) / 3
    assert metrics["approx_kl"].item() == pytest.approx(-0.5 / 3)
    assert metrics["clipfrac"] == 0.0


def test_reinforce_seq_mean_token_mean():
    # sequences (1, 2) and (-1): (1.5 + -1) / 2
    log_prob = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, _ = get_policy_loss("reinforce")(
        log_prob, log_prob, adv, mask, loss_agg_mode="seq-mean-token-mean"
    )
    assert loss.item() == pytest.approx(0.25)


# --------------------------------------------------------------------------- SAPO
def test_sapo_soft_gate_value_and_gradient():
    # token 0: r = 1, A = +1, tau_pos = 1: f = 4 * sigmoid(0) = 2, L = -2, dL/dlogp = -A * 1
    # token 1: r = 2, A = -1, tau_neg = 2: f = 2 * sigmoid(2), L = +2 sigmoid(2),
    #          dL/dlogp = -A * 4 s (1 - s) r with s = sigmoid(2)
    s = 1 / (1 + math.exp(-2.0))
    log_prob = torch.tensor([[0.0, math.log(2.0)]], requires_grad=True)
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, -1.0]])
    mask = torch.ones(1, 2)
    loss, metrics = get_policy_loss("sapo")(
        old, log_prob, adv, mask, loss_agg_mode="seq-mean-token-mean", tau_pos=1.0, tau_neg=2.0
    )
    assert loss.item() == pytest.approx((-2.0 + 2 * s) / 2, rel=1e-6)
    loss.backward()
    w1 = 4 * s * (1 - s) * 2.0
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.5, w1 / 2]]))
    assert metrics["soft_gate_weight"].item() == pytest.approx((1.0 + w1) / 2, rel=1e-6)


def test_sapo_on_policy_gradient_equals_ppo():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=g)
    adv = torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    grads = []
    for name in ("sapo", "vanilla"):
        log_prob = old.clone().requires_grad_(True)
        loss, _ = get_policy_loss(name)(old, log_prob, adv, mask, loss_agg_mode="token-mean")
        loss.backward()
        grads.append(log_prob.grad)
    torch.testing.assert_close(grads[0], grads[1])


def test_sapo_rejects_non_positive_temperature():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="tau_neg=0"):
        get_policy_loss("sapo")(x, x, x, torch.ones(1, 2), tau_neg=0)


# --------------------------------------------------------------------------- GMPO
def test_gmpo_geometric_mean_with_log_space_clip():
    # eps = 0.2 in log space. Row 0, A = +1: l = (0.1, 0.5 -> clipped to 0.2), mean 0.15,
    # L_0 = -e^0.15. Row 1, A = -1 (pessimistic = max): l = (-0.5 -> -0.2, 0.1), mean -0.05,
    # L_1 = +e^-0.05. seq-mean-token-mean: (L_0 + L_1) / 2.
    old = torch.zeros(2, 3)
    log_prob = torch.tensor([[0.1, 0.5, 7.0], [-0.5, 0.1, 0.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    loss, metrics = get_policy_loss("gmpo")(
        old, log_prob, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2
    )
    assert loss.item() == pytest.approx((-math.exp(0.15) + math.exp(-0.05)) / 2, rel=1e-6)
    loss.backward()
    # unclipped tokens: -A_i * ratio_i / |y_i| / G; clipped and masked tokens: 0
    expected = torch.tensor(
        [[-math.exp(0.15) / 4, 0.0, 0.0], [0.0, math.exp(-0.05) / 4, 0.0]], dtype=torch.float32
    )
    torch.testing.assert_close(log_prob.grad, expected)
    assert metrics["clipfrac"].item() == pytest.approx(0.5)


def test_gmpo_rollout_weights_enter_as_geometric_mean():
    # ratio 1, A = +1 on 2 tokens with weights (4, 1): geometric mean 2 -> L = -2
    x = torch.zeros(1, 2)
    loss, _ = get_policy_loss("gmpo")(
        x,
        x.clone(),
        torch.ones(1, 2),
        torch.ones(1, 2),
        rollout_is_weights=torch.tensor([[4.0, 1.0]]),
    )
    assert loss.item() == pytest.approx(-2.0)


def test_new_losses_declare_their_paper_aggregation():
    from verl.registry import POLICY_LOSSES

    assert POLICY_LOSSES.needs("sapo", "default_loss_agg_mode") == "seq-mean-token-mean"
    assert POLICY_LOSSES.needs("gmpo", "default_loss_agg_mode") == "seq-mean-token-mean"
    assert POLICY_LOSSES.needs("gpg", "default_loss_agg_mode") == "token-mean"
    assert POLICY_LOSSES.needs("reinforce", "default_loss_agg_mode") is None
    assert POLICY_LOSSES.canonical_name("geo_mean") == "gmpo"
    assert POLICY_LOSSES.hyperparameters("sapo") == {"tau_pos": 1.0, "tau_neg": 1.05}
