"""The precision map reaches each role: parameter dtype and compute dtype per role."""

from __future__ import annotations

import pytest
import torch

from tests.ranks import run_ranks
from verl.config import load_config
from verl.models.tiny import save_tiny_model_dir
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.critic import CriticWorker
from verl.workers.role_options import precision_options
from verl.workers.specs import actor_rollout_ref_spec, critic_spec, reward_model_spec


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", arch="qwen2")


def _config(model_dir, *overrides):
    return load_config(
        overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            "algorithm.adv_estimator=gae",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "trainer.device=cpu",
            *overrides,
        ]
    )


def _compute_dtypes(module, run):
    """dtypes of every nn.Linear output while ``run()`` executes."""
    seen = set()
    hooks = [
        m.register_forward_hook(lambda m, i, o: seen.add(o.dtype))
        for m in module.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    try:
        run()
    finally:
        for h in hooks:
            h.remove()
    return seen


def _ids():
    return torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(0))


def test_precision_map_reaches_actor_reference_and_critic(model_dir):
    cfg = _config(
        model_dir,
        "trainer.mixed_precision=bf16",
        "trainer.model_precision_map={reference: fp16, critic: bf16}",
        "trainer.max_consecutive_nonfinite_steps=5",
    )
    actor = ActorRolloutRefWorker(actor_rollout_ref_spec(cfg, role="actor_rollout_ref"))
    actor.init_model(total_steps=2)
    ids = _ids()

    # actor: fp32 master weights, bf16 compute under the engine's autocast
    eng = actor.engine
    assert {p.dtype for p in eng.module.parameters()} == {torch.float32}
    assert eng.autocast_dtype == torch.bfloat16 and eng.scaler is None
    assert eng.max_consecutive_nonfinite == 5

    def actor_forward():
        with eng.autocast():
            eng.module(ids)

    assert _compute_dtypes(eng.module, actor_forward) == {torch.bfloat16}

    # reference: stored and computed in fp16, no optimizer
    ref = actor.ref_engine
    assert {p.dtype for p in ref.module.parameters()} == {torch.float16}
    assert ref.optimizer is None

    def ref_forward():
        with ref.eval_mode():
            ref.module(ids)

    assert _compute_dtypes(ref.module, ref_forward) == {torch.float16}

    critic = CriticWorker(critic_spec(cfg), tokenizer=actor.tokenizer)
    critic.init_model(total_steps=2)
    ceng = critic.engine
    assert {p.dtype for p in ceng.module.parameters()} == {torch.float32}
    assert ceng.autocast_dtype == torch.bfloat16


@pytest.mark.parametrize("precision, want", [("bf16", torch.bfloat16), ("none", torch.float32)])
def test_generation_computes_in_the_training_precision(model_dir, precision, want):
    """mixed_precision=bf16 reaches the rollout (it used to sample in fp32 silently)."""
    from verl.protocol import DataProto

    cfg = _config(model_dir, f"trainer.mixed_precision={precision}", "data.max_response_length=3")
    actor = ActorRolloutRefWorker(actor_rollout_ref_spec(cfg, role="actor_rollout"))
    actor.init_model(total_steps=2)
    ids = _ids()
    prompts = DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "position_ids": torch.arange(5).expand(2, 5).clone(),
        }
    )
    out = {}

    def generate():
        out["gen"] = actor.generate_sequences(prompts)

    assert _compute_dtypes(actor.engine.module, generate) == {want}
    assert out["gen"].batch["responses"].shape[0] == 2 * cfg.actor_rollout_ref.rollout.n


def test_fp16_training_gets_loss_scaling(model_dir):
    cfg = _config(model_dir, "trainer.mixed_precision=fp16")
    actor = ActorRolloutRefWorker(actor_rollout_ref_spec(cfg, role="actor_rollout"))
    actor.init_model(total_steps=2)
    assert actor.engine.autocast_dtype == torch.float16
    assert actor.engine.scaler is not None
    cfg = _config(model_dir, "trainer.mixed_precision=fp16", "trainer.use_gradient_scaling=false")
    assert precision_options(cfg, "actor", "single", {})["grad_scaling"] is False


@pytest.mark.parametrize("native_bf16", [True, False])
def test_default_precision_is_auto_bf16_autocast_where_the_cpu_has_it(
    model_dir, monkeypatch, native_bf16
):
    from verl.config import precision

    monkeypatch.setattr(precision, "cpu_bf16_is_fast_and_correct", lambda: native_bf16)
    cfg = _config(model_dir)
    opts = precision_options(cfg, "actor", "single", {})
    base = {"max_consecutive_nonfinite": 3, "grad_scaling": None}
    if native_bf16:  # fp32 master weights, bf16 autocast; the reference stored in bf16
        assert opts == {**base, "autocast_dtype": "bf16"}
        assert precision_options(cfg, "reference", "single", {}) == {"param_dtype": "bf16"}
    else:  # the model's dtype (fp32), no autocast: what `none` gives
        assert opts == base
        assert precision_options(cfg, "reference", "single", {}) == {}


def test_precision_none_changes_nothing(model_dir):
    cfg = _config(model_dir, "trainer.mixed_precision=none")
    opts = precision_options(cfg, "actor", "single", {})
    assert opts == {"max_consecutive_nonfinite": 3, "grad_scaling": None}
    assert precision_options(cfg, "reference", "single", {}) == {}


def test_fsdp2_roles_get_a_mixed_precision_policy(model_dir):
    cfg = _config(model_dir, "trainer.mixed_precision=bf16")
    opts = precision_options(cfg, "actor", "fsdp2", {"mixed_precision": None})
    assert opts["mixed_precision"] == {
        "param_dtype": "bf16",
        "reduce_dtype": "fp32",
        "buffer_dtype": "fp32",
    }
    assert "autocast_dtype" not in opts
    given = {"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "bf16"}
    assert (
        precision_options(cfg, "actor", "fsdp2", {"mixed_precision": given})["mixed_precision"]
        == given
    )


def test_fp8_reference_gets_fp8_layers_and_the_actor_does_not(model_dir):
    from verl.models.fp8 import Fp8Linear, is_fp8_model

    cfg = _config(model_dir, "trainer.model_precision_map={reference: fp8}")
    worker = ActorRolloutRefWorker(actor_rollout_ref_spec(cfg, role="actor_rollout_ref"))
    worker.init_model(total_steps=2)
    assert is_fp8_model(worker.ref_engine.module)
    assert not is_fp8_model(worker.engine.module)
    layer = next(m for m in worker.ref_engine.module.modules() if isinstance(m, Fp8Linear))
    assert layer.qweight.dtype == torch.float8_e4m3fn
    assert worker.ref_engine.module.lm_head.weight.dtype == torch.float32  # head kept
    with torch.no_grad():
        out = worker.ref_engine.module(_ids()).logits
    assert torch.isfinite(out).all()


def _fsdp2_actor(rank: int, model_dir: str, out: str) -> None:
    """One FSDP2 rank (its own process group): the bf16 precision reaches the policy."""
    torch.set_num_threads(1)
    cfg = _config(
        model_dir,
        "trainer.mixed_precision=bf16",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_device=2",
    )
    worker = ActorRolloutRefWorker(actor_rollout_ref_spec(cfg, role="actor_rollout"))
    worker.init_model(total_steps=2)
    eng = worker.engine
    ids = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(0))
    res = {
        "param_dtypes": sorted({str(p.dtype) for p in eng.module.parameters()}),
        "policy": eng.mixed_precision,
        "compute": sorted(str(d) for d in _compute_dtypes(eng.module, lambda: eng.module(ids))),
    }
    torch.save(res, out)
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_fsdp2_actor_computes_in_bf16_with_fp32_master_weights(model_dir, tmp_path, request):
    out = tmp_path / "res.pt"
    run_ranks(_fsdp2_actor, (str(model_dir), str(out)), 1, request)
    res = torch.load(out)
    assert res["param_dtypes"] == ["torch.float32"]
    assert res["policy"] == {"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    assert res["compute"] == ["torch.bfloat16"]


def test_reward_model_is_stored_in_its_precision():
    from verl.config.schema import TrainerConfig
    from verl.models import build_tiny_model, build_tiny_tokenizer
    from verl.workers.reward_model import RewardModelWorker

    tok = build_tiny_tokenizer()
    reward_model = build_tiny_model(tokenizer=tok, hidden_size=32, num_layers=1, reward_head=True)
    cfg = TrainerConfig(model_precision_map={"reward": "bf16"})
    cfg.trainer.device = "cpu"
    cfg.reward_model.enable = True
    worker = RewardModelWorker(
        reward_model_spec(cfg),
        module=reward_model,
        tokenizer=tok,
        actor_tokenizer=tok,
    )
    worker.init_model()
    assert {p.dtype for p in worker.module.parameters()} == {torch.bfloat16}
    ids = torch.randint(0, len(tok), (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert _compute_dtypes(worker.module, lambda: worker.module(ids)) == {torch.bfloat16}


def test_null_checkpointing_is_decided_per_role_by_its_micro_batch_tokens(model_dir):
    """enable_gradient_checkpointing=null (the default): on for a role whose micro-batch
    could hold more activations than verl.models.precision's threshold, off otherwise."""
    from verl.models.precision import (
        ACTIVATION_BYTES_PER_TOKEN_LAYER_HIDDEN as PER_UNIT,
    )
    from verl.models.precision import (
        AUTO_CHECKPOINTING_MIN_BYTES,
        is_activation_checkpointing,
    )

    cfg = _config(model_dir)
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing is None
    assert cfg.critic.model.enable_gradient_checkpointing is None
    actor = ActorRolloutRefWorker(actor_rollout_ref_spec(cfg, role="actor_rollout_ref"))
    actor.init_model(total_steps=1)
    hf = actor.engine.module.config
    tokens_at_threshold = AUTO_CHECKPOINTING_MIN_BYTES // (
        hf.num_hidden_layers * hf.hidden_size * PER_UNIT
    )
    assert cfg.actor_rollout_ref.actor.token_budget < tokens_at_threshold
    assert not is_activation_checkpointing(actor.engine.module)

    # a token budget above the threshold turns the actor's on; the critic's row-count
    # micro-batches (2 rows of prompt + response) stay below it
    cfg = _config(
        model_dir,
        f"actor_rollout_ref.actor.ppo_max_token_len_per_device={tokens_at_threshold + 1}",
        "critic.ppo_micro_batch_size_per_device=2",
    )
    actor = ActorRolloutRefWorker(actor_rollout_ref_spec(cfg, role="actor_rollout_ref"))
    actor.init_model(total_steps=1)
    assert is_activation_checkpointing(actor.engine.module)
    critic = CriticWorker(critic_spec(cfg), tokenizer=actor.tokenizer)
    critic.init_model(total_steps=1)
    assert not is_activation_checkpointing(critic.engine.module)
