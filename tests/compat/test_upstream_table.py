"""verl.compat.upstream covers upstream verl's keys: every key its example and recipe
scripts pass (at v0.5, v0.6, v0.7 and its head) and every key of its default configs is
native here or has a treatment in the table (renamed, dropped with a note, refused with the
reason); the issue's keys load as their native meaning."""

from __future__ import annotations

import logging
import typing
from pathlib import Path

import pytest

from verl.compat.upstream import (
    OFFLINE_UPSTREAM_KEYS,
    OFFLINE_UPSTREAM_MOVES,
    UPSTREAM_KEYS,
    UPSTREAM_MOVES,
)
from verl.config import ConfigError, load_config, load_sft_config
from verl.config.load import iter_schema, schema_paths, unwrap_optional
from verl.config.schema import TrainerConfig
from verl.config.schema_offline import SFTConfig

HERE = Path(__file__).parent


def _inventory(name: str) -> list[str]:
    lines = (HERE / name).read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def _mappings(root: type) -> set[str]:
    """The schema's free-form mapping keys (``model.override_config``)."""
    return {
        path
        for path, _, tp in iter_schema(root)
        if typing.get_origin(unwrap_optional(tp)[0]) is dict
    }


def _treatment(
    key: str, table: dict, moves: dict[str, str], native: frozenset[str], mappings: set[str]
) -> str:
    """How ``key`` is read: ``native``, ``table``, ``subtree``, ``per_gpu`` or ``none``."""
    for old, new in moves.items():
        if key == old or key.startswith(f"{old}."):
            key = new + key[len(old) :]
    if key in native:
        return "native"
    parts = key.split(".")
    if any(".".join(parts[:i]) in mappings for i in range(1, len(parts))):
        return "native"  # a key inside a free-form mapping (model.override_config)
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in table or ".".join(parts[:i]) + ".*" in table:
            return "table"
    if key.endswith("_per_gpu") and key[: -len("_per_gpu")] + "_per_device" in native:
        return "per_gpu"
    return "none"


@pytest.mark.parametrize(
    "inventory, table, moves, root",
    [
        ("upstream_rl_keys.txt", UPSTREAM_KEYS, UPSTREAM_MOVES, TrainerConfig),
        ("upstream_sft_keys.txt", OFFLINE_UPSTREAM_KEYS, OFFLINE_UPSTREAM_MOVES, SFTConfig),
    ],
)
def test_every_upstream_key_has_a_treatment(inventory, table, moves, root):
    keys = _inventory(inventory)
    assert len(keys) > 80
    native = schema_paths(root)
    mappings = _mappings(root)
    missing = [k for k in keys if _treatment(k, table, moves, native, mappings) == "none"]
    assert not missing, f"upstream keys with no treatment: {missing}"


def test_no_upstream_key_is_an_unknown_key_when_loaded():
    """Each key of the inventory, loaded with a value of the right kind, is never reported
    as an unknown key (refusals name the key and the reason)."""
    unknown = []
    for key in _inventory("upstream_rl_keys.txt"):
        try:
            load_config(overrides=[f"{key}=null"])
        except ConfigError as exc:
            if "unknown key" in str(exc):
                unknown.append(key)
    assert not unknown, unknown


# the issue's keys: each loads and sets the native key it means
READ_AS = [
    (
        "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
        "actor_rollout_ref.rollout.vllm.tensor_parallel_size",
        4,
    ),
    ("actor_rollout_ref.rollout.mode=async", None, None),
    (
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
        "actor_rollout_ref.actor.policy_loss",
        "gspo",
    ),
    (
        "actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean",
        "actor_rollout_ref.actor.policy_loss",
        "geo_mean",
    ),
    ("reward_model.reward_manager=dapo", "reward_model.reward_manager", "naive"),
    (
        "reward_model.reward_kwargs.overlong_buffer_cfg.enable=False",
        "reward_model.overlong_buffer.enable",
        False,
    ),
    (
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=16",
        "reward_model.overlong_buffer.len",
        16,
    ),
    (
        "reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
        "reward_model.overlong_buffer.penalty_factor",
        0.5,
    ),
    ("reward.reward_manager.name=dapo", "reward_model.reward_manager", "naive"),
    ("reward.reward_kwargs.overlong_buffer_cfg.len=8", "reward_model.overlong_buffer.len", 8),
    ("reward_manager.name=prime", "reward_model.reward_manager", "naive"),
    ("trainer.logger=console", "trainer.logger", ["console"]),
    (
        "actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat16",
        "actor_rollout_ref.model.dtype",
        "bf16",
    ),
    ("critic.fsdp.param_offload=True", "critic.fsdp_config.param_offload", True),
    (
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        "actor_rollout_ref.rollout.multi_turn.max_turns",
        3,
    ),
    ("ray_kwargs.ray_init.num_cpus=4", None, None),
    ("ray_kwargs.ray_init.runtime_env.env_vars.X=1", None, None),
    ("reward_model.model.use_remove_padding=True", None, None),
    ("reward_model.model.fsdp_config.param_offload=True", None, None),
    ("actor_rollout_ref.model.use_shm=True", None, None),
    ("actor_rollout_ref.rollout.load_format=safetensors", None, None),
    ("actor_rollout_ref.rollout.layered_summon=True", None, None),
    ("actor_rollout_ref.actor.entropy_checkpointing=True", None, None),
    ("actor_rollout_ref.actor.use_torch_compile=False", None, None),
    ("actor_rollout_ref.model.use_fused_kernels=True", None, None),
    ("actor_rollout_ref.rollout.multi_stage_wake_up=True", None, None),
    ("actor_rollout_ref.rollout.trace.backend=mlflow", None, None),
    ("global_profiler.tool=nsys", None, None),
    ("global_profiler.steps=[1,2]", None, None),
    ("trainer.use_legacy_worker_impl=disable", None, None),
    ("actor_rollout_ref.ref.strategy=fsdp2", None, None),
    ("actor_rollout_ref.rollout.over_sample_rate=0.1", None, None),
]


@pytest.mark.parametrize("override, native, value", READ_AS)
def test_the_issues_keys_load_with_a_note(override, native, value, caplog):
    caplog.set_level(logging.WARNING, logger="verl.compat")
    cfg = load_config(overrides=[override])
    written = override.split("=")[0].lstrip("+")
    assert written.split(".")[0] in caplog.text  # a note names the key as written
    if native is not None:
        node = cfg
        for part in native.split("."):
            node = getattr(node, part)
        assert node == value


def test_a_config_name_file_with_hydra_and_defaults_loads(tmp_path, caplog):
    """Upstream's --config-name files: hydra: and defaults: are dropped with a note."""
    path = tmp_path / "gsm8k_multiturn_grpo.yaml"
    path.write_text(
        "hydra:\n  searchpath:\n    - file://verl/trainer/config\n"
        "defaults:\n  - ppo_trainer\n  - _self_\n"
        "data:\n  max_prompt_length: 256\n  return_raw_chat: True\n"
        "actor_rollout_ref:\n  hybrid_engine: True\n  rollout:\n    mode: async\n"
        "    multi_turn:\n      enable: True\n      max_assistant_turns: 3\n"
        "      format: hermes\n"
    )
    caplog.set_level(logging.WARNING, logger="verl.compat")
    cfg = load_config(path)
    assert cfg.data.max_prompt_length == 256
    assert cfg.actor_rollout_ref.rollout.multi_turn.max_turns == 3
    assert "defaults=" in caplog.text and "hydra=" in caplog.text


def test_a_megatron_defaults_list_is_refused(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("defaults:\n  - ppo_megatron_trainer\n  - _self_\n")
    with pytest.raises(ConfigError, match="no Megatron engine"):
        load_config(path)


def test_two_spellings_through_a_moved_subtree_must_agree():
    with pytest.raises(ConfigError, match="set the same key"):
        load_config(
            overrides=["critic.fsdp.param_offload=True", "critic.fsdp_config.param_offload=False"]
        )


def test_an_interpolated_value_is_dropped(tmp_path):
    path = tmp_path / "i.yaml"
    path.write_text(
        "critic:\n  ppo_micro_batch_size_per_gpu: ${oc.select:.ppo_micro_batch_size,null}\n"
        "  rollout_n: ${oc.select:actor_rollout_ref.rollout.n,1}\n"
        "reward_model:\n  micro_batch_size_per_gpu: null\n"
    )
    cfg = load_config(path)
    assert cfg.critic.ppo_micro_batch_size_per_device is None


@pytest.mark.parametrize(
    "override, message",
    [
        ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "Megatron-Core"),
        ("actor_rollout_ref.rollout.multi_turn.interaction_config_path=i.yaml", "interaction.path"),
        ("data.apply_chat_template_kwargs.enable_thinking=False", "chat-template arguments"),
    ],
)
def test_refusals_say_why_and_the_native_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    assert message in str(err.value)


def test_sft_keys_of_upstream_scripts_load():
    cfg = load_sft_config(
        overrides=[
            "data.micro_batch_size=4",
            "data.micro_batch_size_per_gpu=2",
            "model.fsdp_config.model_dtype=bf16",
            "model.fsdp_config.cpu_offload=True",
            "model.use_liger=True",
            "optim.lr_scheduler=cosine",
            "optim.warmup_steps_ratio=0.1",
            "trainer.logger=console",
            "data.multiturn.enable=true",
            "data.multiturn.messages_key=messages",
        ]
    )
    assert cfg.data.micro_batch_size_per_device == 2 and cfg.model.dtype == "bf16"
    assert cfg.optim.warmup_style == "cosine" and cfg.optim.lr_warmup_steps_ratio == 0.1
    assert cfg.trainer.logger == ["console"] and cfg.data.messages_key == "messages"


def test_no_upstream_entry_shadows_a_native_key():
    """A key the schema has is read natively, never renamed or dropped by the upstream
    table (the actor's fsdp_config.optimizer_offload must not be dropped as 'speed only')."""
    from verl.compat.upstream import UPSTREAM_KEYS
    from verl.config import TrainerConfig

    def native(key: str) -> bool:
        node = TrainerConfig()
        for part in key.split("."):
            if not hasattr(node, part):
                return False
            node = getattr(node, part)
        return True

    # an entry naming the key itself only reads upstream's values (logger=console -> [console])
    shadowed = sorted(
        k for k, e in UPSTREAM_KEYS.items() if "*" not in k and native(k) and e.native != k
    )
    assert shadowed == [], shadowed
