"""verl's extension points: names and needs without torch, every built-in entry resolves."""

from __future__ import annotations

import subprocess
import sys

import pytest

import verl.registry as registries
from verl.registry import ADVANTAGE_ESTIMATORS, LOSS_AGG_MODES, POLICY_LOSSES

ALL = [getattr(registries, name) for name in registries.builtin.__all__]


def test_names_and_needs_are_read_without_importing_torch():
    code = (
        "import sys; from verl.registry import ADVANTAGE_ESTIMATORS as A, ROLLOUT_BACKENDS as R; "
        "print(A.info('gae')['needs_critic'], A.info('remax')['needs_baseline'], "
        "R.info('sglang')['needs_cuda'], R.info('vllm')['needs_cuda'], 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.split() == ["True", "True", "True", "False", "False"]


@pytest.mark.parametrize("registry", ALL, ids=lambda r: r.kind)
def test_every_builtin_entry_resolves(registry):
    for name in registry.names():
        entry = registry.get(name)
        if registry is registries.CONFIG_CHECKS:  # a ConfigChecks: its problems are callable
            entry = entry.problems
        assert callable(entry), (registry.kind, name)


def test_needs_of_the_builtin_estimators():
    def having(what):
        return {n for n in ADVANTAGE_ESTIMATORS if ADVANTAGE_ESTIMATORS.info(n)[what]}

    assert having("needs_critic") == {"gae"}
    assert having("needs_index") == {
        "grpo",
        "rloo",
        "reinforce_plus_plus_baseline",
        "opo",
        "gpg",
        "grpo_passk",
        "optimal_token_baseline",
    }
    assert having("needs_baseline") == {"remax"}
    assert having("needs_reference") == set()
    assert having("needs_sum_pi_squared") == {"optimal_token_baseline"}


def test_preferred_aggregation_of_the_builtin_losses():
    preferred = {n: POLICY_LOSSES.info(n)["default_loss_agg_mode"] for n in POLICY_LOSSES}
    assert {n: m for n, m in preferred.items() if m is not None} == {
        "gspo": "seq-mean-token-mean",
        "sapo": "seq-mean-token-mean",
        "gmpo": "seq-mean-token-mean",
        "gpg": "token-mean",
    }


def test_hyperparameters_of_the_builtin_entries():
    hp = ADVANTAGE_ESTIMATORS.hyperparameters
    assert hp("remax") == {"reward_to_go": False}
    assert hp("grpo") == {"epsilon": 1e-6}
    assert hp("gae") == {}  # gamma and lam come from algorithm.gamma / algorithm.lam
    assert POLICY_LOSSES.hyperparameters("ppo") == {}
    assert POLICY_LOSSES.hyperparameters("clip_cov") == {
        "clip_cov_ratio": 0.0002,
        "clip_cov_lb": 1.0,
        "clip_cov_ub": 5.0,
    }
    assert POLICY_LOSSES.hyperparameters("kl_cov") == {"kl_cov_ratio": 0.0002, "ppo_kl_coef": 1.0}


def test_micro_batch_weight_of_each_aggregation_mode():
    weights = {m: LOSS_AGG_MODES.info(m)["micro_batch_weight"] for m in LOSS_AGG_MODES}
    assert weights == {
        "token-mean": "tokens",
        "seq-mean-token-sum": "sequences",
        "seq-mean-token-mean": "sequences",
        "seq-mean-token-sum-norm": "rows",
    }


def test_public_registries_are_the_same_objects_everywhere():
    import verl.algorithms as algorithms
    from verl.rewards import manager
    from verl.rewards.scorers import registry as scorers

    assert algorithms.ADVANTAGE_ESTIMATORS is ADVANTAGE_ESTIMATORS
    assert algorithms.POLICY_LOSSES is POLICY_LOSSES
    assert algorithms.LOSS_AGG_MODES is LOSS_AGG_MODES
    assert algorithms.KL_ESTIMATORS is registries.KL_ESTIMATORS
    assert manager.REWARD_MANAGERS is registries.REWARD_MANAGERS
    assert scorers._SCORERS is registries.REWARD_SCORERS
    assert algorithms.Registry is registries.Registry
