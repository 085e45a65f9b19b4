"""verl.compat: the alias tables' error paths, the device map kept for later trainers, and
DataCollector (the tutorials' happy paths are in tests/tutorials/)."""

from __future__ import annotations

import pytest
import torch

from verl.compat import (
    AliasError,
    DataCollector,
    translate_flat_kwargs,
    translate_override,
    translate_tree,
)
from verl.compat.aliases import precision_name, replace_dtypes
from verl.config import ConfigError, MixedPrecisionConfig, RunConfig, TrainerConfig, load_config


def test_torch_dtypes_become_precision_names_everywhere():
    assert precision_name(torch.float16) == "fp16"
    assert precision_name(torch.float8_e4m3fn) == "fp8"
    assert precision_name("bf16") == "bf16"
    with pytest.raises(AliasError, match=r"model_precision_map\.actor=torch\.int8: no precision"):
        replace_dtypes({"model_precision_map": {"actor": torch.int8}})
    # nested section objects passed to TrainerConfig
    cfg = TrainerConfig(trainer=RunConfig(mixed_precision=torch.bfloat16))
    assert cfg.trainer.mixed_precision == "bf16"
    mp = MixedPrecisionConfig(param_dtype=torch.float16)
    out = translate_flat_kwargs({"fsdp_config": {"mixed_precision": mp}})
    assert out["fsdp_config"]["mixed_precision"].param_dtype == "fp16"


def _actor(block):
    return {"actor_rollout_ref": {"actor": {"parallel_config": block}}}


@pytest.mark.parametrize(
    "block, message",
    [
        ({"type": "ddp"}, "DDP is not available, and there is no Megatron-LM engine here"),
        ({"sharding_strategy": "HYBRID_SHARD"}, "use FULL_SHARD"),
        ({"cpu_offload": "yes"}, "cpu_offload='yes': must be true or false"),
        ({"mixed_precision": 3}, "use true (bf16 compute), false, bf16, fp16"),
        ({"tensor_parallel": 2}, "unknown keys ['tensor_parallel']"),
        ("fsdp", "parallel_config must be a mapping"),
    ],
)
def test_parallel_config_errors_name_the_native_spelling(block, message):
    with pytest.raises(AliasError) as err:
        translate_tree(_actor(block))
    assert message in str(err.value)


def test_alias_and_native_key_disagreeing_is_an_error_agreeing_is_fine():
    tree = _actor({"type": "fsdp"})
    tree["actor_rollout_ref"]["actor"]["strategy"] = "single"
    with pytest.raises(AliasError) as err:
        translate_tree(tree)
    assert str(err.value) == (
        "actor_rollout_ref.actor.strategy='single' and actor_rollout_ref.actor.parallel_config"
        ".type='fsdp' (sets actor_rollout_ref.actor.strategy='fsdp2') set the same key; give "
        "one of them"
    )
    tree["actor_rollout_ref"]["actor"]["strategy"] = "fsdp2"
    assert translate_tree(tree)["actor_rollout_ref"]["actor"]["strategy"] == "fsdp2"


def test_critic_parallel_config_and_other_roots():
    out = translate_tree({"critic": {"parallel_config": {"activation_checkpointing": True}}})
    assert out == {"critic": {"model": {"enable_gradient_checkpointing": True}}}
    # the SFT/DPO configs have no aliases: their trees pass through (dtypes named)
    same = {"trainer": {"fsdp_init": True}}
    assert translate_tree(same, root="SFTConfig") == same


def test_load_config_reports_an_alias_error_as_a_config_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("trainer:\n  fsdp_init: maybe\n")
    with pytest.raises(ConfigError, match=r"trainer\.fsdp_init='maybe': must be true or false"):
        load_config(path)


def test_data_collector_checks_its_arguments():
    with pytest.raises(TypeError, match="needs a trainer with collect_data"):
        DataCollector(object())

    class Echo:
        def collect_data(self, prompts):
            return list(prompts)

    with pytest.raises(ValueError, match="batch_size=0 must be a positive int"):
        DataCollector(Echo(), ["a"], batch_size=0)
    collector = DataCollector(Echo(), ["a", "b", "c"], batch_size=2)
    assert list(collector) == [["a", "b"], ["c"]] and len(collector) == 2
    assert collector(["x"]) == ["x"]


def test_overrides_go_through_the_alias_table():
    # a native key comes back as given, a mapping value still replaces the whole mapping
    native = ("trainer.model_precision_map", {"reward": "fp8"})
    assert translate_override(*native) == [native]
    assert translate_override("trainer.fsdp_init", False) == [
        ("actor_rollout_ref.actor.strategy", "single")
    ]
    assert translate_override("critic.parallel_config.mixed_precision", "fp16") == [
        ("critic.fsdp_config.mixed_precision.param_dtype", "fp16"),
        ("critic.fsdp_config.mixed_precision.reduce_dtype", "fp32"),
        ("critic.fsdp_config.mixed_precision.buffer_dtype", "fp32"),
    ]
    with pytest.raises(
        AliasError, match="DDP is not available, and there is no Megatron-LM engine here"
    ):
        translate_override("actor_rollout_ref.actor.parallel_config.type", "megatron")
    # the SFT/DPO configs have no aliases
    assert translate_override("trainer.fsdp_init", True, root="SFTConfig") == [
        ("trainer.fsdp_init", True)
    ]
    assert translate_override("data.train_dataloader.num_workers", 2) == [
        ("data.dataloader_num_workers", 2)
    ]
    # through load_config: an alias and its native key must agree there as in a YAML file
    # (tests/config/test_key_spellings.py); the same key twice is an override
    with pytest.raises(ConfigError, match=r"trainer\.fsdp_init=True .* set the same key"):
        load_config(overrides=["trainer.fsdp_init=true", "actor_rollout_ref.actor.strategy=single"])
    cfg = load_config(overrides=["trainer.fsdp_init=true", "trainer.fsdp_init=false"])
    assert cfg.actor_rollout_ref.actor.strategy == "single"
