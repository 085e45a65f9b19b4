"""Validation of DAPO dynamic sampling and the truncated importance-sampling correction."""

from __future__ import annotations

import pytest

from verl.config import ConfigError, load_config
from verl.registry import ADVANTAGE_ESTIMATORS

# every registered estimator that compares a response with its group
GROUP_ESTIMATORS = ", ".join(
    name for name in ADVANTAGE_ESTIMATORS.names() if ADVANTAGE_ESTIMATORS.info(name)["needs_index"]
)


def messages(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    return [p.message for p in info.value.problems]


def test_filter_groups_defaults_are_off():
    fg = load_config().algorithm.filter_groups
    assert (fg.enable, fg.metric, fg.max_num_gen_batches) == (False, "acc", 10)


def test_filter_groups_needs_a_group_estimator_and_n_at_least_2():
    msgs = messages(
        [
            "algorithm.filter_groups.enable=true",
            "algorithm.adv_estimator=reinforce_plus_plus",
            "actor_rollout_ref.rollout.n=1",
        ]
    )
    assert msgs == [
        "algorithm.filter_groups.enable=true: algorithm.adv_estimator=reinforce_plus_plus is "
        "not a group estimator; dynamic sampling drops groups with equal rewards, which only "
        f"group baselines make useless; use one of {GROUP_ESTIMATORS}",
        "algorithm.filter_groups.enable=true: actor_rollout_ref.rollout.n=1; a group of one "
        "response is always dropped, so no step could be filled; set rollout.n >= 2",
    ]


def test_filter_groups_checks_only_when_enabled_except_ranges():
    # a non-group estimator is fine while dynamic sampling is off
    load_config(overrides=["algorithm.adv_estimator=reinforce_plus_plus"])
    load_config(overrides=["algorithm.filter_groups.enable=true", "algorithm.adv_estimator=rloo"])
    (msg,) = messages(["algorithm.filter_groups.max_num_gen_batches=-1"])
    assert msg == "algorithm.filter_groups.max_num_gen_batches=-1: must be >= 0"


def test_filter_groups_metric_is_an_enumeration():
    (msg,) = messages(["algorithm.filter_groups.metric=reward"])
    assert "algorithm.filter_groups.metric" in msg and "seq_reward" in msg


def test_filter_groups_with_reward_model_needs_seq_reward(tmp_path):
    (msg,) = messages(
        [
            "algorithm.filter_groups.enable=true",
            "reward_model.enable=true",
            f"reward_model.model.path={tmp_path}",
        ]
    )
    assert msg == (
        "algorithm.filter_groups.metric=acc: reward-model scores carry no acc; use "
        "algorithm.filter_groups.metric=seq_reward with reward_model.enable=true"
    )


def test_rollout_is_threshold_must_be_positive():
    assert load_config().actor_rollout_ref.actor.rollout_is_threshold is None
    cfg = load_config(overrides=["actor_rollout_ref.actor.rollout_is_threshold=2.0"])
    assert cfg.actor_rollout_ref.actor.rollout_is_threshold == 2.0
    (msg,) = messages(["actor_rollout_ref.actor.rollout_is_threshold=0"])
    assert msg == "actor_rollout_ref.actor.rollout_is_threshold=0.0: must be > 0"
