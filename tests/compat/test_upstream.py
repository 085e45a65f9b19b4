"""verl.compat.upstream: an upstream verl run script's keys load here, on the command line
and in a YAML file alike; a value that would change results and has no native meaning is
refused with a message naming what to use; every key of the table is in docs/config.md."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from verl.compat.upstream import OFFLINE_UPSTREAM_KEYS, UPSTREAM_KEYS
from verl.config import ConfigError, load_config, load_sft_config
from verl.models.tiny import save_tiny_model_dir

DOCS = Path(__file__).resolve().parents[2] / "docs" / "config.md"

# The keys an upstream GRPO/PPO run script typically sets beyond the native ones (written
# for this test in the style of upstream's examples/*/run_*.sh).
SCRIPT = [
    "algorithm.adv_estimator=gae",
    "data.filter_overlong_prompts=True",
    "data.return_raw_chat=False",
    "data.reward_fn_key=data_source",
    "actor_rollout_ref.hybrid_engine=True",
    "actor_rollout_ref.model.use_remove_padding=False",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=2048",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1",
    "actor_rollout_ref.actor.fsdp_config.fsdp_size=-1",
    "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params=0",
    "actor_rollout_ref.rollout.name=native",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    "actor_rollout_ref.rollout.enforce_eager=True",
    "actor_rollout_ref.rollout.free_cache_engine=True",
    "actor_rollout_ref.rollout.calculate_log_probs=True",
    "actor_rollout_ref.rollout.mode=sync",
    "actor_rollout_ref.rollout.max_num_batched_tokens=8192",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "critic.model.use_remove_padding=True",
    "critic.ppo_mini_batch_size=4",
    "critic.ppo_micro_batch_size_per_gpu=2",
    "critic.forward_max_token_len_per_gpu=4096",
    "critic.model.fsdp_config.param_offload=True",
    "critic.model.fsdp_config.optimizer_offload=True",
    "trainer.critic_warmup=0",
    "trainer.balance_batch=True",
    "trainer.max_actor_ckpt_to_keep=3",
    "trainer.val_only=False",
    "trainer.rollout_data_dir=null",
    "trainer.validation_data_dir=null",
    "trainer.del_local_ckpt_after_load=False",
    "trainer.esi_redundant_time=0",
    "ray_init.num_cpus=null",
]


def _check_native(cfg) -> None:
    a, r = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    assert cfg.data.truncation == "drop"
    assert a.pack_sequences is False and cfg.critic.pack_sequences is True
    assert a.ppo_micro_batch_size_per_device == 2 and a.ppo_max_token_len_per_device == 2048
    assert r.log_prob_micro_batch_size_per_device == 4
    assert cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_device == 8
    assert cfg.actor_rollout_ref.ref.fsdp_config.param_offload is True
    assert r.vllm.gpu_memory_utilization == 0.4 and r.vllm.enforce_eager is True
    assert cfg.critic.ppo_micro_batch_size_per_device == 2
    assert cfg.critic.fsdp_config.param_offload and cfg.critic.fsdp_config.optimizer_offload
    assert cfg.trainer.max_ckpt_to_keep == 3
    # upstream's own trainer keys, native here (tests/trainer/test_run_options.py)
    assert cfg.trainer.critic_warmup == 0 and cfg.trainer.val_only is False
    assert cfg.trainer.rollout_data_dir is None and cfg.trainer.validation_data_dir is None


def test_an_upstream_run_script_loads_with_a_note_per_key(caplog):
    caplog.set_level(logging.WARNING, logger="verl.compat")
    _check_native(load_config(overrides=SCRIPT))
    noted = caplog.text
    for override in SCRIPT:
        key = override.split("=")[0]
        if key in UPSTREAM_KEYS or key.endswith("_per_gpu"):
            assert key in noted, f"no note for {key}"


def test_the_same_keys_in_a_yaml_file(tmp_path):
    tree: dict = {}
    for override in SCRIPT:
        key, raw = override.split("=", 1)
        node = tree
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(raw)
    path = tmp_path / "upstream.yaml"
    path.write_text(yaml.safe_dump(tree))
    _check_native(load_config(path))


@pytest.mark.parametrize(
    "override, message",
    [
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "sequence parallelism"),
        ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2", "no Megatron engine"),
        ("actor_rollout_ref.actor.strategy=megatron", "no Megatron engine"),
        ("actor_rollout_ref.rollout.multi_turn.tool_config_path=t.yaml", "no such file"),
        ("reward_model.reward_manager=batch", "scores one response"),
        ("trainer.device=npu", "Ascend NPUs"),
        ("actor_rollout_ref.hybrid_engine=False", "shares the actor's worker"),
        ("actor_rollout_ref.actor.fsdp_config.fsdp_size=4", "hybrid sharding"),
        ("ray_init.timeline_json_file=/tmp/t.json", "Ray timelines"),
        ("trainer.del_local_ckpt_after_load=True", "never deleted on load"),
        ("data.reward_fn_key=source", "data_source column"),
        ("data.custom_cls.path=my_dataset.py", "custom dataset classes"),
        ("data.image_key=img", "always `images`"),
        ("actor_rollout_ref.actor.freeze_vision_tower=True", "not implemented"),
    ],
)
def test_a_value_that_would_change_results_is_refused(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    assert override.split("=")[0] in str(err.value)
    assert message in str(err.value)


def test_upstream_image_keys_with_their_defaults_load(caplog):
    """geo3k-style scripts name the images column and keep the vision tower trained."""
    load_config(
        overrides=[
            "data.image_key=images",
            "data.return_multi_modal_inputs=True",
            "actor_rollout_ref.actor.freeze_vision_tower=False",
        ]
    )
    notes = " ".join(r.getMessage() for r in caplog.records)
    assert "`images` column" in notes and "trains with the language model" in notes


def test_two_spellings_of_one_key_must_agree(tmp_path):
    same = load_config(
        overrides=[
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=2",
        ]
    )
    assert same.actor_rollout_ref.actor.ppo_micro_batch_size_per_device == 2
    path = tmp_path / "two.yaml"
    path.write_text(
        yaml.safe_dump({"trainer": {"max_actor_ckpt_to_keep": 3, "max_critic_ckpt_to_keep": 2}})
    )
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "trainer.max_actor_ckpt_to_keep=3 (sets trainer.max_ckpt_to_keep=3) and " in str(
        err.value
    )
    assert "trainer.max_critic_ckpt_to_keep=2 (sets trainer.max_ckpt_to_keep=2)" in str(err.value)
    critic = {"ppo_micro_batch_size_per_gpu": 2, "ppo_micro_batch_size_per_device": 4}
    path.write_text(yaml.safe_dump({"critic": critic}))
    with pytest.raises(ConfigError, match="set the same key; give one of them"):
        load_config(path)


def test_an_upstream_sft_script_loads(tmp_path):
    model = save_tiny_model_dir(tmp_path / "model", arch="qwen2")
    cfg = load_sft_config(
        overrides=[
            f"model.partial_pretrain={model}",
            "data.micro_batch_size_per_gpu=2",
            "trainer.default_hdfs_dir=null",
            "ulysses_sequence_parallel_size=1",
            "use_remove_padding=True",
            "data.prompt_key=extra_info",
            "+data.prompt_dict_keys=['question']",
            "data.response_key=extra_info",
            "+data.response_dict_keys=['answer']",
        ]
    )
    assert cfg.model.path == str(model) and cfg.data.micro_batch_size_per_device == 2
    assert cfg.data.prompt_dict_keys == ["question"] and cfg.data.response_dict_keys == ["answer"]


def test_docs_list_every_upstream_key():
    text = DOCS.read_text()
    missing = [key for key in {**UPSTREAM_KEYS, **OFFLINE_UPSTREAM_KEYS} if f"`{key}`" not in text]
    assert not missing, f"docs/config.md does not list {missing}"


@pytest.mark.slow
def test_an_upstream_run_script_trains(tmp_path, capsys):
    """The script's keys through ``main_ppo`` as a shell would pass them: two GAE steps on a
    tiny model, checkpointed, exported."""
    from verl.trainer import main_ppo

    model = save_tiny_model_dir(tmp_path / "model", arch="qwen2")
    sizes = [
        f"actor_rollout_ref.model.path={model}",
        "data.train_batch_size=4",
        "data.max_response_length=6",
        "data.arithmetic.train_size=16",
        "data.arithmetic.val_size=4",
        "actor_rollout_ref.rollout.n=2",
        "trainer.total_training_steps=2",
        "trainer.save_freq=2",
        "trainer.logger=['console']",
        "trainer.mixed_precision=none",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        f"trainer.log_dir={tmp_path / 'run'}",
    ]
    argv = ["--config-path=config", "--config-name=ppo_trainer", *SCRIPT, *sizes]
    assert main_ppo.main(argv) == 0, capsys.readouterr().err[-3000:]
    assert (tmp_path / "run" / "global_step_2" / "critic").is_dir()
    assert (tmp_path / "run" / "huggingface" / "model.safetensors").is_file()
