"""One precision key per role: the other spellings are adapters applied at the API edge.

The role keys (``<role section>.precision``) are all that ``role_precision`` reads; the
trainer-wide keys (``trainer.mixed_precision``, ``trainer.model_precision_map``), the FSDP2
block's ``param_dtype`` and dtypes written as text fill them when a config is built and when
it is validated (``verl.compat.precision_keys``). The expected precisions below are what
the same inputs resolved to when the trainer-wide keys were read live whenever a role key
was null (roles actor, critic, reference, reward; a GAE run with a KL loss, so every role
is built but the reward model; a CPU without native bf16, so ``auto`` is ``none``).
"""

from __future__ import annotations

import pytest

from verl.config import TrainerConfig, load_config
from verl.config import precision as P

BASE = [
    "algorithm.adv_estimator=gae",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "trainer.device=cpu",
]
FSDP2_BLOCK = [
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
]

LOADED = [
    ([], ["none", "none", "none", "none"]),
    (["trainer.mixed_precision=bf16"], ["bf16", "bf16", "bf16", "bf16"]),
    (["trainer.mixed_precision=fp16"], ["fp16", "fp16", "fp16", "fp16"]),
    (["trainer.mixed_precision=none"], ["none", "none", "none", "none"]),
    (["trainer.mixed_precision=fp32"], ["fp32", "fp32", "fp32", "fp32"]),
    (["trainer.mixed_precision=fp8"], ["bf16", "bf16", "fp8", "fp8"]),
    (["trainer.mixed_precision=int4"], ["bf16", "bf16", "int4", "int4"]),
    (["trainer.mixed_precision=auto"], ["none", "none", "none", "none"]),
    (["trainer.model_precision_map={reference: fp8}"], ["none", "none", "fp8", "none"]),
    (
        [
            "trainer.mixed_precision=bf16",
            "trainer.model_precision_map={reference: fp8, reward: int4}",
        ],
        ["bf16", "bf16", "fp8", "int4"],
    ),
    (
        ["trainer.mixed_precision=bf16", "trainer.model_precision_map={critic: fp16}"],
        ["bf16", "bf16", "bf16", "bf16"],
    ),
    (["trainer.model_precision_map={actor: bf16, critic: fp16}"], ["bf16", "bf16", "none", "none"]),
    (["trainer.mixed_precision=bf16", "critic.precision=fp32"], ["bf16", "fp32", "bf16", "bf16"]),
    (["trainer.mixed_precision=bfloat16"], ["bf16", "bf16", "bf16", "bf16"]),
    (["trainer.model_precision_map={reference: float16}"], ["none", "none", "fp16", "none"]),
    (["actor_rollout_ref.ref.precision=int4"], ["none", "none", "int4", "none"]),
    (FSDP2_BLOCK, ["bf16", "none", "none", "none"]),
    (
        [
            "trainer.mixed_precision=fp16",
            "actor_rollout_ref.actor.precision=fp16",
            "critic.precision=fp16",
        ],
        ["fp16", "fp16", "fp16", "fp16"],
    ),
]

BUILT = [
    ({}, ["none", "none", "none", "none"]),
    ({"mixed_precision": "bf16"}, ["bf16", "bf16", "bf16", "bf16"]),
    ({"mixed_precision": "fp8"}, ["bf16", "bf16", "fp8", "fp8"]),
    (
        {"model_precision_map": {"critic": "fp16"}, "mixed_precision": "bf16"},
        ["bf16", "bf16", "bf16", "bf16"],
    ),
]


@pytest.fixture(autouse=True)
def _no_native_bf16(monkeypatch):
    monkeypatch.setattr(P, "cpu_bf16_is_fast_and_correct", lambda: False)


def _resolved(cfg: TrainerConfig) -> list[str]:
    return [P.role_precision(cfg, role) for role in P.ROLES]


@pytest.mark.parametrize(("overrides", "expected"), LOADED)
def test_loaded_inputs_resolve_as_before_and_live_in_the_role_keys(overrides, expected):
    cfg = load_config(overrides=BASE + overrides)
    assert _resolved(cfg) == expected
    # the role keys hold the answer: with the trainer-wide keys cleared it is the same
    cfg.trainer.mixed_precision, cfg.trainer.model_precision_map = None, {}
    assert _resolved(cfg) == expected


@pytest.mark.parametrize(("kwargs", "expected"), BUILT)
def test_python_api_resolves_as_before(kwargs, expected):
    cfg = TrainerConfig(**kwargs)
    cfg.algorithm.adv_estimator = "gae"
    cfg.actor_rollout_ref.actor.use_kl_loss = True
    cfg.trainer.device = "cpu"
    cfg.validate()
    assert _resolved(cfg) == expected


def test_a_trainer_key_set_on_a_built_config_is_applied_by_validation_only():
    cfg = TrainerConfig()
    cfg.trainer.device = "cpu"
    cfg.trainer.mixed_precision = "bf16"
    assert _resolved(cfg) == ["none"] * 4  # not read live: the role keys are null (auto)
    cfg.validate()  # the resolve step the trainer runs when it is built
    assert _resolved(cfg) == ["bf16"] * 4
