"""verl.config.roles: one table names the roles; the other role tables are derived from it."""

from __future__ import annotations

import dataclasses

import pytest

import verl.cli.export as model_merger
from verl.config import TrainerConfig, precision
from verl.config.device_map import ROLE_DEVICE_KEYS, DataParallelConfig
from verl.config.roles import GROUPS, ROLES, TRAINABLE_ROLES, group_devices_key, role_of_group
from verl.trainer.lifecycle.checkpoint import ROLE_DIRS


def test_the_table():
    assert list(ROLES) == ["actor", "critic", "reference", "reward"]
    assert TRAINABLE_ROLES == ("actor", "critic")
    assert GROUPS == ("actor_rollout_ref", "critic", "reward_model", "teacher")
    assert ROLES["reference"].group == ROLES["actor"].group  # the hybrid worker holds both


def test_groups_and_device_keys_exist_in_the_schema():
    sections = {f.name for f in dataclasses.fields(TrainerConfig)}
    device_keys = {f.name for f in dataclasses.fields(DataParallelConfig)}
    for spec in ROLES.values():
        assert spec.group in sections, spec
        assert spec.devices_key in device_keys, spec
    assert set(device_keys) == {group_devices_key(g) for g in GROUPS}


def test_derived_tables_agree():
    assert ROLE_DEVICE_KEYS == {
        "actor_rollout_ref": "actor_devices",
        "critic": "critic_devices",
        "reward_model": "reward_model_devices",
        "teacher": "teacher_devices",  # a group of no role table (algorithm.distill)
    }
    assert tuple(ROLES) == precision.ROLES and precision.TRAINABLE_ROLES == TRAINABLE_ROLES
    assert ROLE_DIRS == {"actor_rollout_ref": "actor", "critic": "critic"}
    assert model_merger.ROLES == {"actor": "actor_rollout_ref", "critic": "critic"}
    assert {role_of_group(group) for group in ROLE_DIRS} == set(TRAINABLE_ROLES)


def test_unknown_names_are_errors():
    with pytest.raises(KeyError, match=r"unknown worker group 'rm'; groups: \['actor_rollout_ref'"):
        group_devices_key("rm")
    with pytest.raises(KeyError, match="worker group 'reward_model' trains no role"):
        role_of_group("reward_model")
