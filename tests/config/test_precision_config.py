"""Precision keys: per-role resolution, auto selection, validation messages, flat keys."""

from __future__ import annotations

import pytest

from verl.compat.flat_keys import FLAT_KEYS
from verl.config import (
    ActorConfig,
    ActorRolloutRefConfig,
    ConfigError,
    MixedPrecisionConfig,
    RunConfig,
    TrainerConfig,
)
from verl.config import precision as P
from verl.utils.device_probe import cpu_flags


def _errors(cfg: TrainerConfig) -> str:
    with pytest.raises(ConfigError) as info:
        cfg.validate()
    return str(info.value)


def _gae(**kwargs) -> TrainerConfig:
    cfg = TrainerConfig(**kwargs)
    cfg.algorithm.adv_estimator = "gae"  # critic on
    cfg.actor_rollout_ref.actor.use_kl_loss = True  # reference on
    return cfg


@pytest.mark.parametrize("native_bf16", [True, False])
def test_default_is_auto_everywhere_and_valid(monkeypatch, native_bf16):
    monkeypatch.setattr(P, "cpu_bf16_is_fast_and_correct", lambda: native_bf16)
    cfg = _gae()
    cfg.trainer.device = "cpu"
    assert [P.stated_precision(cfg, r) for r in P.ROLES] == ["auto"] * 4
    want = "bf16" if native_bf16 else "none"
    assert [P.role_precision(cfg, r) for r in P.ROLES] == [want] * 4
    cfg.validate()


def test_default_auto_keeps_a_reduced_model_dtype_and_avoids_what_fsdp2_cannot_run(monkeypatch):
    # a model loaded in bf16 has no fp32 master weights: auto computes in its dtype
    monkeypatch.setattr(P, "cpu_bf16_is_fast_and_correct", lambda: True)
    cfg = _gae()
    cfg.trainer.device = "cpu"
    cfg.critic.model.dtype = "bf16"
    assert P.role_precision(cfg, "critic") == "none"
    assert P.role_precision(cfg, "actor") == "bf16"
    cfg.validate()
    # an fp8-capable GPU: auto's fp8 reference is weight-only, kept off an fsdp2 reference;
    # an old GPU: no fp16 training on fsdp2 (no sharded loss scaling)
    monkeypatch.setattr(P, "run_device", lambda cfg: "cuda")
    cfg = _gae()
    cfg.actor_rollout_ref.actor.strategy = cfg.critic.strategy = "fsdp2"
    monkeypatch.setattr(P, "cuda_capability", lambda device: (9, 0))
    assert P.role_precision(cfg, "reference") == "bf16"
    assert P.role_precision(cfg, "reward") == "fp8"  # no train engine: weight-only is fine
    monkeypatch.setattr(P, "cuda_capability", lambda device: (7, 0))
    assert P.role_precision(cfg, "actor") == P.role_precision(cfg, "critic") == "none"
    assert P.role_precision(cfg, "reference") == "fp16"


def test_map_overrides_global_and_global_fp8_trains_in_bf16():
    cfg = _gae(mixed_precision="fp8", model_precision_map={"reference": "bf16"})
    assert P.role_precision(cfg, "actor") == "bf16"
    assert P.role_precision(cfg, "critic") == "bf16"
    assert P.role_precision(cfg, "reference") == "bf16"
    assert P.role_precision(cfg, "reward") == "fp8"


def test_auto_on_cpu_follows_the_bf16_check(monkeypatch):
    monkeypatch.setattr(P, "cpu_bf16_is_fast_and_correct", lambda: True)
    assert P.auto_select_precision("cpu") == dict.fromkeys(P.ROLES, "bf16")
    monkeypatch.setattr(P, "cpu_bf16_is_fast_and_correct", lambda: False)
    assert P.auto_select_precision("cpu") == dict.fromkeys(P.ROLES, "none")
    cfg = TrainerConfig(mixed_precision="auto")
    cfg.trainer.device = "cpu"
    assert P.role_precision(cfg, "actor") == "none"


@pytest.mark.parametrize(
    ("capability", "expected"),
    [
        ((9, 0), {"actor": "bf16", "critic": "bf16", "reference": "fp8", "reward": "fp8"}),
        ((8, 0), dict.fromkeys(P.ROLES, "bf16")),
        ((7, 0), dict.fromkeys(P.ROLES, "fp16")),
    ],
)
def test_auto_on_cuda_by_compute_capability(monkeypatch, capability, expected):
    monkeypatch.setattr(P, "cuda_capability", lambda device: capability)
    assert P.auto_select_precision("cuda") == expected


def test_cpu_bf16_check_matches_cpu_flags():
    has_bf16 = bool({"avx512_bf16", "amx_bf16"} & cpu_flags())
    assert P.cpu_bf16_is_fast_and_correct() == has_bf16


def test_mixing_bf16_and_fp16_among_trainable_roles_is_resolved_or_rejected():
    # from the precision map: the tutorial's tip (one half precision) is applied, logged
    cfg = _gae(model_precision_map={"actor": "bf16", "critic": "fp16"})
    warnings = cfg.validate()
    assert any("model_precision_map.critic=fp16 beside actor=bf16" in w for w in warnings)
    assert P.role_precision(cfg, "critic") == "bf16"
    # on the roles' own keys: refused
    cfg = _gae()
    cfg.actor_rollout_ref.actor.precision, cfg.critic.precision = "bf16", "fp16"
    msg = _errors(cfg)
    assert "trainable roles mix bf16 and fp16 (actor=bf16, critic=fp16)" in msg
    assert "exchange tensors" in msg and "不要混用bf16和fp16" in msg


def test_mixing_is_fine_for_inference_roles():
    _gae(model_precision_map={"actor": "bf16", "critic": "bf16", "reference": "fp16"}).validate()


def test_fp8_for_a_trainable_role_is_rejected():
    msg = _errors(TrainerConfig(model_precision_map={"actor": "fp8"}))
    assert "trainer.model_precision_map.actor=fp8: fp8 is weight-only storage" in msg
    assert "Use bf16" in msg


def test_int4_is_for_inference_roles_only():
    cfg = _gae(mixed_precision="int4", model_precision_map={"reward": "fp8"})
    assert [P.role_precision(cfg, r) for r in P.ROLES] == ["bf16", "bf16", "int4", "fp8"]
    msg = _errors(TrainerConfig(model_precision_map={"critic": "int4"}))
    assert "trainer.model_precision_map.critic=int4: int4 is weight-only storage" in msg
    _gae(model_precision_map={"reference": "int4", "reward": "int4"}).validate()


def test_unknown_role_and_precision_in_the_map():
    msg = _errors(TrainerConfig(model_precision_map={"policy": "bf16"}))
    assert "unknown role 'policy'; use actor, critic, reference, reward" in msg
    with pytest.raises(ConfigError, match="model_precision_map"):
        TrainerConfig(model_precision_map={"actor": "int4"}).validate()


def test_precision_the_gpu_cannot_run_names_the_device(monkeypatch):
    monkeypatch.setattr(P, "cuda_capability", lambda device: (7, 5))
    monkeypatch.setattr(P, "cuda_name", lambda device: "Tesla T4")
    cfg = _gae(model_precision_map={"reference": "bf16"})
    cfg.trainer.device = "cuda"
    assert (
        "reference precision bf16 needs a GPU of compute capability >= 8.0, "
        "but Tesla T4 has 7.5; use fp16"
    ) in _errors(cfg)


@pytest.mark.parametrize("capability", [(8, 0), (7, 5)])
@pytest.mark.parametrize("precision", ["fp8", "int4"])
def test_weight_only_inference_roles_need_no_capability(
    monkeypatch, tmp_path, precision, capability
):
    """fp8/int4 here is weight-only storage (dequantized into the activations' dtype), so an
    A100 (8.0) or a T4 (7.5) runs it: no fp8 matmul is needed."""
    asked = []
    monkeypatch.setattr(P, "cuda_capability", lambda device: asked.append(device) or capability)
    cfg = _gae(model_precision_map={"reference": precision, "reward": precision})
    cfg.reward_model.enable = True
    cfg.reward_model.model.path = str(tmp_path)
    cfg.actor_rollout_ref.actor.strategy = "single"
    cfg.trainer.device = "cuda"
    cfg.validate()
    assert P.role_precision(cfg, "reference") == precision
    assert P.role_precision(cfg, "reward") == precision
    # with a bf16 actor next to it on an A100 the device is asked and still accepted
    cfg.trainer.mixed_precision = "bf16"
    if capability >= (8, 0):
        cfg.validate()
        assert asked == ["cuda"]
    else:
        assert "actor precision bf16 needs a GPU" in _errors(cfg)


def test_fp16_with_fsdp2_is_rejected():
    cfg = TrainerConfig(mixed_precision="fp16")
    cfg.actor_rollout_ref.actor.strategy = "fsdp2"
    assert "actor precision fp16 with strategy=fsdp2" in _errors(cfg)


def test_mixed_precision_needs_fp32_master_weights():
    cfg = TrainerConfig(mixed_precision="bf16")
    cfg.actor_rollout_ref.model.dtype = "bf16"
    assert "set actor_rollout_ref.model.dtype=fp32" in _errors(cfg)


def test_fsdp_mixed_precision_must_agree_with_the_role_precision():
    cfg = TrainerConfig(mixed_precision="bf16")
    cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision = MixedPrecisionConfig("fp16")
    msg = _errors(cfg)
    assert "fsdp_config.mixed_precision.param_dtype=fp16 contradicts actor precision bf16" in msg
    cfg = TrainerConfig()
    cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision = MixedPrecisionConfig(
        "bf16", reduce_dtype="fp16"
    )
    assert "contradicts trainer.gradient_precision=fp32" in _errors(cfg)
    # bf16 is gradient compression: reduce-scattered in bf16, kept in fp32 (a warning)
    cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype = "bf16"
    cfg.actor_rollout_ref.actor.strategy = "fsdp2"
    assert any("reduce_dtype=bf16" in w for w in cfg.validate())


def test_gradient_scaling_without_fp16_is_a_logged_no_op_and_guard_bound_checked():
    cfg = TrainerConfig(mixed_precision="bf16", use_gradient_scaling=True)
    assert any("use_gradient_scaling=true is a no-op" in w for w in cfg.validate())
    assert P.gradient_scaling(cfg, "actor") is None
    fp16 = TrainerConfig(mixed_precision="fp16", use_gradient_scaling=True)
    assert P.gradient_scaling(fp16, "actor") is True
    cfg = TrainerConfig()
    cfg.trainer.max_consecutive_nonfinite_steps = -1
    assert "max_consecutive_nonfinite_steps=-1: must be >= 0" in _errors(cfg)


def test_default_validation_does_not_import_torch_for_precision(monkeypatch):
    def boom(cfg):
        raise AssertionError("looked at the device")

    monkeypatch.setattr(P, "run_device", boom)
    TrainerConfig().validate()


# ---- flat keys -------------------------------------------------------------------------


def test_flat_keys_map_onto_their_nested_twins():
    cfg = TrainerConfig(
        mixed_precision="bf16",
        model_precision_map={"reference": "fp8"},
        gradient_precision="fp32",
        use_gradient_scaling=None,
        use_flash_attention=True,
        max_grad_norm=0.5,
        activation_checkpointing={"actor": True},
        fsdp_config={
            "sharding_strategy": "SHARD_GRAD_OP",
            "cpu_offload": True,
            "mixed_precision": {"param_dtype": "bf16"},
        },
        gradient_accumulation_steps=2,
        enable_3d_hybrid_engine=True,
        hybrid_engine_config={"enable_activation_recomputation": True},
    )
    t, arr = cfg.trainer, cfg.actor_rollout_ref
    assert (t.mixed_precision, t.model_precision_map) == ("bf16", {"reference": "fp8"})
    assert t.use_flash_attention is True
    assert arr.actor.grad_clip == cfg.critic.grad_clip == 0.5
    assert arr.model.enable_gradient_checkpointing is True
    assert cfg.critic.model.enable_gradient_checkpointing is None  # not named: auto
    for fc in (arr.actor.fsdp_config, cfg.critic.fsdp_config):
        assert fc.reshard_after_forward is False
        assert fc.param_offload and fc.optimizer_offload
        assert fc.mixed_precision == MixedPrecisionConfig("bf16", "fp32", "fp32")
    # 4 prompts x 4 responses per mini-batch on one rank in 2 micro-batches of 8
    assert arr.actor.ppo_micro_batch_size_per_device == 8
    assert set(FLAT_KEYS) >= {
        "mixed_precision",
        "model_precision_map",
        "activation_checkpointing",
        "gradient_precision",
        "use_flash_attention",
        "fsdp_config",
        "max_grad_norm",
        "use_gradient_scaling",
        "gradient_accumulation_steps",
        "enable_3d_hybrid_engine",
        "hybrid_engine_config",
    }


def test_flat_key_and_nested_twin_with_different_values_is_an_error():
    with pytest.raises(ConfigError) as info:
        TrainerConfig(mixed_precision="bf16", trainer=RunConfig(mixed_precision="fp16"))
    assert (
        "flat key mixed_precision='bf16' sets trainer.mixed_precision='bf16', but "
        "trainer.mixed_precision was also given as 'fp16'; set one of them"
    ) in str(info.value)
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.grad_clip was also given"):
        TrainerConfig(
            max_grad_norm=0.5,
            actor_rollout_ref=ActorRolloutRefConfig(actor=ActorConfig(grad_clip=2.0)),
        )
    # the same value twice is fine
    cfg = TrainerConfig(mixed_precision="bf16", trainer=RunConfig(mixed_precision="bf16"))
    assert cfg.trainer.mixed_precision == "bf16"


def test_two_flat_keys_setting_one_twin_differently_is_an_error():
    with pytest.raises(ConfigError, match=r"both set actor_rollout_ref\.model\.enable_gradient"):
        TrainerConfig(
            activation_checkpointing=False,
            hybrid_engine_config={"enable_activation_recomputation": True},
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"enable_3d_hybrid_engine": False}, "not supported"),
        ({"fsdp_config": {"sharding_strategy": "HYBRID"}}, "use FULL_SHARD or SHARD_GRAD_OP"),
        ({"fsdp_config": {"offload": True}}, "unknown keys ['offload']"),
        ({"gradient_accumulation_steps": 3}, "do not split into 3 equal micro-batches"),
        ({"hybrid_engine_config": {"layout": "tp"}}, "use enable_activation_recomputation"),
    ],
)
def test_flat_keys_that_cannot_be_mapped(kwargs, message):
    with pytest.raises(ConfigError) as info:
        TrainerConfig(**kwargs)
    assert message in str(info.value)


def test_flat_keys_do_not_change_the_yaml_round_trip():
    from verl.config import load_config

    cfg = load_config(
        overrides=["trainer.mixed_precision=bf16", "trainer.model_precision_map={reference: fp8}"]
    )
    assert P.role_precision(cfg, "reference") == "fp8"
    assert P.role_precision(cfg, "actor") == "bf16"


def test_role_keys_are_the_one_statement_filled_from_the_trainer_keys():
    cfg = _gae(mixed_precision="fp8", model_precision_map={"critic": "fp32"})
    arr = cfg.actor_rollout_ref
    # the trainer keys are written into the role keys when the config is built
    assert (arr.actor.precision, cfg.critic.precision) == ("bf16", "fp32")
    assert (arr.ref.precision, cfg.reward_model.precision) == ("fp8", "fp8")
    assert P.role_key("reference") == "actor_rollout_ref.ref.precision"
    cfg.validate()


def test_role_key_beats_the_global_default_and_is_read_alone():
    from verl.config import load_config

    cfg = load_config(overrides=["trainer.mixed_precision=bf16", "critic.precision=fp32"])
    assert cfg.actor_rollout_ref.actor.precision == "bf16"
    assert cfg.critic.precision == "fp32"
    cfg = load_config(overrides=["actor_rollout_ref.ref.precision=int4"])
    assert [P.stated_precision(cfg, r) for r in P.ROLES] == ["auto", "auto", "int4", "auto"]


def test_trainer_key_set_after_build_reaches_unset_roles_when_validated():
    """The trainer-wide keys are adapters, applied when a config is built and when it is
    validated (the trainer validates its config when it is built); between the two,
    nothing reads them: the role key is the one answer."""
    cfg = TrainerConfig()
    assert cfg.actor_rollout_ref.actor.precision is None  # nothing given: null, resolves to auto
    cfg.trainer.mixed_precision = "bf16"
    assert cfg.actor_rollout_ref.actor.precision is None  # not read live
    cfg.validate()
    assert cfg.actor_rollout_ref.actor.precision == cfg.reward_model.precision == "bf16"
    assert P.role_precision(cfg, "actor") == P.role_precision(cfg, "reward") == "bf16"
    # a role key that holds a value is kept: the trainer key fills null ones only
    cfg.trainer.mixed_precision = "fp32"
    cfg.validate()
    assert P.role_precision(cfg, "critic") == "bf16"


def test_map_contradicting_a_role_key_names_both():
    cfg = _gae(model_precision_map={"critic": "bf16"})
    cfg.critic.precision = "fp32"
    msg = _errors(cfg)
    assert (
        "trainer.model_precision_map.critic=bf16 contradicts critic.precision=fp32; "
        "set one of them" in msg
    )


@pytest.mark.parametrize("value", ["fp8", "int4"])
def test_weight_only_role_key_for_a_trainable_role_is_refused_by_name(value):
    cfg = _gae()
    cfg.actor_rollout_ref.actor.precision = value
    msg = _errors(cfg)
    assert f"actor_rollout_ref.actor.precision={value}: {value} is weight-only storage" in msg
    cfg.actor_rollout_ref.actor.precision = "float16"
    assert "actor_rollout_ref.actor.precision=float16: must be one of none, fp32" in _errors(cfg)


def test_fsdp_block_param_dtype_is_an_adapter_of_the_role_key():
    from verl.config import load_config

    key = "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype"
    cfg = load_config(overrides=["actor_rollout_ref.actor.strategy=fsdp2", f"{key}=bf16"])
    assert cfg.actor_rollout_ref.actor.precision == "bf16"
    assert cfg.critic.precision is None  # only the actor's block was given
    # fp16 stated through the block meets the same fsdp2 check as any other fp16
    with pytest.raises(ConfigError, match="actor precision fp16 with strategy=fsdp2"):
        load_config(overrides=["actor_rollout_ref.actor.strategy=fsdp2", f"{key}=fp16"])


def test_fsdp_block_contradicting_an_explicit_none_is_refused():
    cfg = _gae(mixed_precision="none")
    cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision = MixedPrecisionConfig("bf16")
    msg = _errors(cfg)
    assert "fsdp_config.mixed_precision.param_dtype=bf16 contradicts actor precision none" in msg


@pytest.mark.parametrize("native_bf16", [True, False])
def test_half_precision_on_a_cpu_without_its_instructions_warns(monkeypatch, native_bf16):
    from verl.trainer.rl import precision_checks

    monkeypatch.setattr(precision_checks, "cpu_bf16_is_fast_and_correct", lambda: native_bf16)
    bf16 = TrainerConfig(mixed_precision="bf16")
    bf16.trainer.device = "cpu"
    emulated = [w for w in bf16.validate() if "bf16 on a CPU without native bf16" in w]
    if native_bf16:
        assert emulated == []
    else:  # names the roles and what to use instead
        assert len(emulated) == 1 and "actor" in emulated[0] and "use none (fp32)" in emulated[0]
    fp16 = TrainerConfig(mixed_precision="fp16")
    fp16.trainer.device = "cpu"
    (warning,) = [w for w in fp16.validate() if w.startswith("fp16 on CPU")]
    # the way out it names is one this CPU runs fast
    assert warning.endswith("use bf16 or none" if native_bf16 else "use none (fp32) or auto")
