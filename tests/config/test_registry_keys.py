"""Registry-backed config keys are checked against the live registries, user entries too."""

from __future__ import annotations

import subprocess
import sys

import pytest

from verl.config import ConfigError, load_config
from verl.registry import ADVANTAGE_ESTIMATORS, ROLLOUT_BACKENDS
from verl.trainer.rl.registry_checks import NULLABLE_KEYS, REGISTRY_KEYS


def messages(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    return [p.message for p in info.value.problems]


@pytest.fixture
def registered():
    """``registered(registry, name, target, **needs)``, removed again after the test."""
    added = []

    def add(registry, name, target, **needs):
        registry.add(name, target, **needs)
        added.append((registry, name))

    yield add
    for registry, name in added:
        registry.remove(name)


def test_unknown_names_get_the_registered_names_and_a_suggestion():
    msgs = messages(
        [
            "actor_rollout_ref.actor.loss_agg_mode=token-means",
            "actor_rollout_ref.rollout.name=nativ",
            "algorithm.kl_penalty=k4",
            "algorithm.adv_estimator=grpoo",
        ]
    )
    by_key = {m.split("=")[0]: m for m in msgs}
    assert by_key["actor_rollout_ref.actor.loss_agg_mode"] == (
        "actor_rollout_ref.actor.loss_agg_mode=token-means: must be one of seq-mean-token-mean, "
        "seq-mean-token-sum, seq-mean-token-sum-norm, token-mean; did you mean token-mean?"
    )
    rollout = by_key["actor_rollout_ref.rollout.name"]
    assert rollout.startswith("actor_rollout_ref.rollout.name=nativ: must be one of ")
    assert rollout.endswith("; did you mean native?")
    assert by_key["algorithm.kl_penalty"].startswith(
        "algorithm.kl_penalty=k4: must be one of abs, k1, k2, k3, kl, "
    )
    assert by_key["algorithm.adv_estimator"].endswith("; did you mean grpo?")
    assert len(msgs) == 4


def test_kl_names_take_aliases_and_the_straight_through_suffix():
    cfg = load_config(
        overrides=["actor_rollout_ref.actor.kl_loss_type=k3+", "algorithm.kl_penalty=mse"]
    )
    assert cfg.actor_rollout_ref.actor.kl_loss_type == "k3+"


def test_a_registered_rollout_backend_is_accepted_and_its_needs_are_checked(registered):
    assert messages(["actor_rollout_ref.rollout.name=my_engine"])[0].startswith(
        "actor_rollout_ref.rollout.name=my_engine: must be one of"
    )
    registered(ROLLOUT_BACKENDS, "my_engine", "verl.rollout.native:NativeRollout")
    assert load_config(overrides=["actor_rollout_ref.rollout.name=my_engine"])
    registered(ROLLOUT_BACKENDS, "my_gpu_engine", "x:y", needs_cuda=True, package="no_such_pkg")
    msgs = messages(["actor_rollout_ref.rollout.name=my_gpu_engine", "trainer.device=cpu"])
    assert msgs[0] == (
        "actor_rollout_ref.rollout.name=my_gpu_engine: needs CUDA but trainer.device=cpu; "
        "use native or hf on CPU"
    )
    assert "needs the 'no_such_pkg' package" in msgs[1]


def test_a_registered_estimator_decides_critic_reference_and_groups(registered):
    registered(ADVANTAGE_ESTIMATORS, "my_td", "x:y", needs_critic=True, needs_reference=True)
    cfg = load_config(overrides=["algorithm.adv_estimator=my_td"])
    assert cfg.critic_enabled and cfg.ref_enabled
    assert cfg.placed_roles == ["actor_rollout_ref", "critic"]
    # a non-group estimator rejects dynamic sampling, naming the group estimators
    (msg,) = messages(["algorithm.adv_estimator=my_td", "algorithm.filter_groups.enable=true"])
    groups = [
        n for n in ADVANTAGE_ESTIMATORS.names() if ADVANTAGE_ESTIMATORS.info(n)["needs_index"]
    ]
    assert {"gpg", "grpo", "grpo_passk", "opo", "reinforce_plus_plus_baseline", "rloo"} <= set(
        groups
    )
    assert msg.endswith("use one of " + ", ".join(groups))
    (msg,) = messages(["algorithm.adv_estimator=my_td", "critic.enable=false"])
    assert msg.startswith("critic.enable=false: algorithm.adv_estimator=my_td needs a value")


def test_adv_estimator_kwargs_are_checked_against_the_entry():
    cfg = load_config(
        overrides=[
            "algorithm.adv_estimator=remax",
            "algorithm.adv_estimator_kwargs.reward_to_go=true",
        ]
    )
    assert cfg.algorithm.adv_estimator_kwargs == {"reward_to_go": True}
    msgs = messages(
        [
            "algorithm.adv_estimator=remax",
            "algorithm.adv_estimator_kwargs.reward_to_goo=true",
            "algorithm.adv_estimator_kwargs.gamma=0.9",
        ]
    )
    assert msgs == [
        "algorithm.adv_estimator_kwargs.reward_to_goo: unknown hyperparameter of advantage "
        "estimator 'remax'; its hyperparameters are: reward_to_go; did you mean reward_to_go?",
        "algorithm.adv_estimator_kwargs.gamma: advantage estimator 'remax' gets 'gamma' from "
        "algorithm.gamma, not from algorithm.adv_estimator_kwargs",
    ]


def test_policy_loss_kwargs_are_checked_against_the_entry():
    key = "actor_rollout_ref.actor.policy_loss_kwargs"
    cfg = load_config(
        overrides=["actor_rollout_ref.actor.policy_loss=kl_cov", f"{key}.ppo_kl_coef=0.1"]
    )
    assert cfg.actor_rollout_ref.actor.policy_loss_kwargs == {"ppo_kl_coef": 0.1}
    (msg,) = messages([f"{key}.clip_cov_ratio=0.1"])  # the default loss is vanilla
    assert msg == (
        f"{key}.clip_cov_ratio: unknown hyperparameter of policy loss 'vanilla'; its "
        "hyperparameters are: none"
    )
    (msg,) = messages(
        ["actor_rollout_ref.actor.policy_loss=clip_cov", f"{key}.clip_ratio_high=0.3"]
    )
    assert msg == (
        f"{key}.clip_ratio_high: policy loss 'clip_cov' gets 'clip_ratio_high' from "
        "actor_rollout_ref.actor.clip_ratio_high (or clip_ratio), not from "
        f"{key}"
    )


def test_name_checks_import_no_torch_and_every_key_exists():
    cfg = load_config()
    for path in REGISTRY_KEYS:
        obj = cfg
        for part in path.split("."):
            obj = getattr(obj, part)
        assert isinstance(obj, str) or (obj is None and path in NULLABLE_KEYS), path
    code = (
        "import sys; from verl.config import load_config; "
        "load_config(overrides=['algorithm.adv_estimator=gae', 'actor_rollout_ref.rollout.name=hf']); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "False"
