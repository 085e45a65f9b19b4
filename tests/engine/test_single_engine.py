"""Tests for the single-process TrainEngine: accumulation, clipping, guard, schedule, checkpoints."""

from __future__ import annotations

import copy
import json
import math
import os
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.engine import OptimSpec, SingleProcessEngine, build_engine
from verl.engine.single import STATE_FILE, TENSORS_FILE
from verl.kernels.torch_functional import compute_response_log_probs


class VectorModel(nn.Module):
    """One parameter vector; loss = <p, g> has gradient g, so grad norms are hand-computable."""

    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.zeros(n))


def _dot_loss(module, g):
    return (module.p * g).sum(), {}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _regression_data(n: int = 8):
    torch.manual_seed(1)
    x = torch.randn(n, 6)
    y = torch.randn(n, 3)
    mask = (torch.rand(n, 3) > 0.3).float()  # "tokens" per sample differ
    return x, y, mask


def test_grad_accumulation_equals_full_batch_sample_mean():
    x, y, _ = _regression_data()
    spec = OptimSpec(lr=1e-2, weight_decay=0.1)
    full = SingleProcessEngine(_mlp(), spec)
    accum = SingleProcessEngine(_mlp(), spec)

    def loss_fn(module, batch):
        bx, by = batch
        loss = ((module(bx) - by) ** 2).mean()
        return loss, {"n": len(bx)}

    full.forward_backward([(x, y)], loss_fn, [1.0])
    full_step = full.optimizer_step()
    # Uneven micro-batches 3 + 5: scale by each one's share of the mini-batch.
    metrics = accum.forward_backward([(x[:3], y[:3]), (x[3:], y[3:])], loss_fn, [3 / 8, 5 / 8])
    accum_step = accum.optimizer_step()

    assert [m["n"] for m in metrics] == [3.0, 5.0]
    assert set(metrics[0]) == {"n", "loss"}
    assert accum_step["grad_norm"] == pytest.approx(full_step["grad_norm"], rel=1e-6)
    for a, b in zip(accum.module.parameters(), full.module.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_grad_accumulation_token_mean_is_exact():
    x, y, mask = _regression_data()
    total_tokens = mask.sum()
    full = SingleProcessEngine(_mlp(), OptimSpec(lr=1e-2))
    accum = SingleProcessEngine(_mlp(), OptimSpec(lr=1e-2))

    def loss_fn(module, batch):  # token-mean within the micro-batch
        bx, by, bm = batch
        return (((module(bx) - by) ** 2) * bm).sum() / bm.sum(), {}

    manual = build_engine("single", _mlp(), optim=OptimSpec(lr=1e-2))
    full.forward_backward([(x, y, mask)], loss_fn, [1.0])
    full.optimizer_step()
    parts = [(x[:2], y[:2], mask[:2]), (x[2:], y[2:], mask[2:])]
    scales = [float(p[2].sum() / total_tokens) for p in parts]
    accum.forward_backward(parts, loss_fn, scales)
    accum.optimizer_step()
    # The same accumulation through the caller-driven loop (engine.backward).
    with manual.train_mode():
        for i, (part, scale) in enumerate(zip(parts, scales)):
            loss, _ = loss_fn(manual.module, part)
            manual.backward(loss * scale, is_last_micro_batch=i == len(parts) - 1)
    manual.optimizer_step()
    for a, b, c in zip(
        accum.module.parameters(), full.module.parameters(), manual.module.parameters()
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
        torch.testing.assert_close(c, a, rtol=0, atol=0)


def test_grad_clip_returns_pre_clip_norm_and_clips():
    engine = SingleProcessEngine(VectorModel(), OptimSpec(lr=0.1, weight_decay=0.0), grad_clip=1.0)
    seen = []
    engine.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append(engine.module.p.grad.clone())
    )
    engine.forward_backward([torch.tensor([3.0, 4.0, 0.0, 0.0])], _dot_loss, [1.0])
    out = engine.optimizer_step()
    assert out["grad_norm"] == pytest.approx(5.0)
    assert out["skipped"] == 0.0
    torch.testing.assert_close(seen[0], torch.tensor([0.6, 0.8, 0.0, 0.0]))
    assert engine.module.p.grad is None  # cleared after the step

    unclipped = SingleProcessEngine(VectorModel(), OptimSpec(lr=0.1), grad_clip=None)
    unclipped.forward_backward([torch.tensor([3.0, 4.0, 0.0, 0.0])], _dot_loss, [2.0])
    assert unclipped.optimizer_step()["grad_norm"] == pytest.approx(10.0)


@pytest.mark.parametrize("bad", [math.inf, math.nan])
def test_non_finite_grad_norm_skips_step(bad):
    engine = SingleProcessEngine(VectorModel(), OptimSpec(lr=0.1), grad_clip=1.0)
    engine.forward_backward([torch.tensor([bad, 1.0, 0.0, 0.0])], _dot_loss, [1.0])
    out = engine.optimizer_step()
    assert not math.isfinite(out["grad_norm"])
    assert out["skipped"] == 1.0
    assert engine.skipped_steps == 1
    assert engine.module.p.grad is None
    torch.testing.assert_close(engine.module.p.detach(), torch.zeros(4))
    assert engine.global_step == 1  # the schedule still advances

    engine.forward_backward([torch.tensor([1.0, 0.0, 0.0, 0.0])], _dot_loss, [1.0])
    assert engine.optimizer_step()["skipped"] == 0.0
    # Adam's first step moves by ~lr against the gradient sign (weight decay of zeros is 0).
    assert engine.module.p[0].item() == pytest.approx(-0.1, abs=1e-6)


def test_warmup_then_cosine_lr():
    spec = OptimSpec(lr=2.0, warmup_steps=2, warmup_style="cosine", total_steps=6, min_lr_ratio=0.1)
    engine = SingleProcessEngine(VectorModel(), spec)
    lrs = []
    for _ in range(8):
        engine.forward_backward([torch.ones(4)], _dot_loss, [1.0])
        lrs.append(engine.optimizer_step()["lr"])
    c = math.cos(math.pi / 4)
    expected = [1.0, 2.0, 2.0, 2 * (0.1 + 0.45 * (1 + c)), 2 * 0.55, 2 * (0.1 + 0.45 * (1 - c))]
    expected += [0.2, 0.2]
    assert lrs == pytest.approx(expected, abs=1e-12)
    assert engine.lr == pytest.approx(0.2)


def test_warmup_then_constant_lr():
    spec = OptimSpec(lr=3.0, warmup_steps=3)
    assert [spec.lr * spec.lr_factor(s) for s in range(5)] == pytest.approx([1, 2, 3, 3, 3])


def test_optim_spec_from_config():
    cfg = SimpleNamespace(
        lr=1e-5,
        betas=[0.9, 0.95],
        weight_decay=0.0,
        eps=1e-6,
        lr_warmup_steps=-1,
        lr_warmup_steps_ratio=0.1,
        warmup_style="cosine",
        min_lr_ratio=0.2,
        total_training_steps=50,
    )
    spec = OptimSpec.from_config(cfg)
    assert (spec.warmup_steps, spec.total_steps, spec.betas) == (5, 50, (0.9, 0.95))
    assert OptimSpec.from_config(cfg, total_steps=200).warmup_steps == 20
    cfg.lr_warmup_steps = 7
    assert OptimSpec.from_config(cfg, total_steps=200).warmup_steps == 7


def test_optim_spec_validation():
    with pytest.raises(ValueError, match="total_steps"):
        OptimSpec(warmup_style="cosine")
    with pytest.raises(ValueError, match="warmup_style='linear'"):
        OptimSpec(warmup_style="linear")
    with pytest.raises(ValueError, match="grad_clip=0"):
        SingleProcessEngine(VectorModel(), OptimSpec(), grad_clip=0)


def test_build_engine_strategies():
    assert isinstance(build_engine("single", VectorModel(), OptimSpec()), SingleProcessEngine)
    # fsdp2 needs a process group (tests/engine/test_fsdp2_engine.py runs it on 2 ranks)
    with pytest.raises(RuntimeError, match="init_distributed"):
        build_engine("fsdp2", VectorModel(), OptimSpec())
    with pytest.raises(ValueError, match="strategy='ddp'"):
        build_engine("ddp", VectorModel(), OptimSpec())


def test_inference_only_engine_and_modes():
    engine = build_engine("single", _mlp(), None, autocast_dtype="bf16")
    engine.module.train()
    with engine.eval_mode():
        assert not engine.module.training
        assert not torch.is_grad_enabled()
        assert engine.module(torch.randn(2, 6)).dtype == torch.bfloat16
    assert engine.module.training
    with pytest.raises(RuntimeError, match="inference only"):
        engine.optimizer_step()


def test_fp16_autocast_uses_grad_scaler():
    engine = SingleProcessEngine(_mlp(), OptimSpec(lr=1e-2), autocast_dtype=torch.float16)
    assert engine.scaler is not None
    x, y, _ = _regression_data()
    engine.forward_backward([(x, y)], lambda m, b: (((m(b[0]) - b[1]) ** 2).mean(), {}))
    out = engine.optimizer_step()
    assert out["skipped"] == 0.0 and math.isfinite(out["grad_norm"])
    with pytest.raises(ValueError, match="param_dtype=float16"):
        SingleProcessEngine(_mlp(), OptimSpec(), param_dtype="fp16", autocast_dtype="fp16")


def _tiny_qwen2() -> nn.Module:
    config = Qwen2Config(
        vocab_size=61,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def _policy_loss(module, batch):
    input_ids, advantages = batch
    mask = torch.ones_like(input_ids)
    pos = mask.cumsum(-1) - 1
    log_probs, _ = compute_response_log_probs(module, input_ids, mask, pos, response_len=4)
    return -(log_probs * advantages[:, None]).mean(), {}


def test_checkpoint_round_trip_is_bitwise(tmp_path, monkeypatch):
    torch.manual_seed(0)
    spec = OptimSpec(lr=1e-3, warmup_steps=1, warmup_style="cosine", total_steps=10)
    engine = SingleProcessEngine(_tiny_qwen2(), spec, grad_clip=1.0)
    batches = [(torch.randint(0, 61, (4, 9)), torch.randn(4)) for _ in range(3)]
    for batch in batches[:2]:
        engine.forward_backward([batch], _policy_loss)
        engine.optimizer_step()
    fresh_copy = copy.deepcopy(engine.module)  # structure only; weights get re-randomised
    engine.save_checkpoint(str(tmp_path / "ckpt"))
    engine.forward_backward([batches[2]], _policy_loss)
    expected_step = engine.optimizer_step()
    expected = engine.state_dict_for_save()

    torch.manual_seed(123)
    for p in fresh_copy.parameters():
        nn.init.normal_(p)
    restored = SingleProcessEngine(fresh_copy, spec, grad_clip=1.0)
    load_kwargs = []
    real_load = torch.load
    monkeypatch.setattr(
        torch, "load", lambda *a, **k: (load_kwargs.append(k), real_load(*a, **k))[1]
    )
    restored.load_checkpoint(str(tmp_path / "ckpt"))
    assert load_kwargs and all(k.get("weights_only") is True for k in load_kwargs)
    assert restored.global_step == 2
    assert restored.lr == 1e-3 * spec.lr_factor(2)
    model = restored.module
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tie survives loading

    restored.forward_backward([batches[2]], _policy_loss)
    assert restored.optimizer_step() == expected_step
    got = restored.state_dict_for_save()
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_state_dict_round_trip_continues_bitwise():
    # The in-memory state (what save_checkpoint writes) carries the model, AdamW moments,
    # the schedule's position and the counters: a fresh engine continues identically.
    torch.manual_seed(0)
    spec = OptimSpec(lr=1e-3, warmup_steps=1, warmup_style="cosine", total_steps=10)
    engine = SingleProcessEngine(_tiny_qwen2(), spec, grad_clip=1.0)
    batches = [(torch.randint(0, 61, (4, 9)), torch.randn(4)) for _ in range(3)]
    for batch in batches[:2]:
        engine.forward_backward([batch], _policy_loss)
        engine.optimizer_step()
    engine.skipped_steps = 1  # a counter the state must carry
    state = copy.deepcopy(engine.state_dict())
    assert state["optimizer"]["state"] and state["scaler"] is None
    assert state["scheduler"]["last_epoch"] == 2
    fresh_copy = copy.deepcopy(engine.module)
    engine.forward_backward([batches[2]], _policy_loss)
    expected_step = engine.optimizer_step()
    expected = engine.state_dict_for_save()

    torch.manual_seed(123)
    for p in fresh_copy.parameters():
        nn.init.normal_(p)
    restored = SingleProcessEngine(fresh_copy, spec, grad_clip=1.0)
    restored.load_state_dict(state)
    assert (restored.global_step, restored.skipped_steps) == (2, 1)
    restored.forward_backward([batches[2]], _policy_loss)
    assert restored.optimizer_step() == expected_step
    got = restored.state_dict_for_save()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_load_state_dict_refuses_an_optimizer_state_for_an_inference_engine():
    trained = SingleProcessEngine(_mlp(), OptimSpec(lr=1e-3))
    frozen = SingleProcessEngine(_mlp(), None)
    assert frozen.state_dict()["optimizer"] is None
    with pytest.raises(ValueError, match=r"engine state has optimizer=True but this engine"):
        frozen.load_state_dict(trained.state_dict())


def test_checkpoint_files_are_weights_only_and_json(tmp_path):
    engine = SingleProcessEngine(VectorModel(), OptimSpec(lr=0.1))
    engine.forward_backward([torch.ones(4)], _dot_loss, [1.0])
    engine.optimizer_step()
    engine.save_checkpoint(str(tmp_path))
    tensors = torch.load(os.path.join(tmp_path, TENSORS_FILE), weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in tensors.values())
    torch.testing.assert_close(tensors["optim.state.0.exp_avg"], torch.full((4,), 0.1))
    with open(os.path.join(tmp_path, STATE_FILE)) as f:
        state = json.load(f)
    assert state["param_names"] == ["p"]
    assert state["scheduler"]["last_epoch"] == 1
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]

    other = SingleProcessEngine(nn.Linear(2, 2), OptimSpec())
    with pytest.raises(ValueError, match="different trainable parameters"):
        other.load_checkpoint(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="missing"):
        other.load_checkpoint(str(tmp_path / "nowhere"))


def _count_host_reads(monkeypatch) -> list[str]:
    """Record every read of a tensor value into Python (item/float/int/bool/tolist)."""
    reads: list[str] = []
    for name in ("item", "__float__", "__int__", "__bool__", "tolist"):
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _name=name, _original=original, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    return reads


@pytest.mark.parametrize("n_micro", [2, 5])
def test_forward_backward_reads_metrics_once_and_defers_sync(monkeypatch, n_micro):
    x, y, _ = _regression_data(10)
    engine = build_engine("single", _mlp(), OptimSpec(lr=0.1))
    flags = []
    context = engine._backward_context

    def spy(is_last_micro_batch):
        flags.append(is_last_micro_batch)
        return context(is_last_micro_batch)

    engine._backward_context = spy

    def loss_fn(module, mb):
        err = (module(mb[0]) - mb[1]) ** 2
        return err.mean(), {"max_err": err.detach().max(), "rows": float(len(mb[0]))}

    parts = list(zip(x.chunk(n_micro), y.chunk(n_micro)))
    before = copy.deepcopy(engine.module)
    reads = _count_host_reads(monkeypatch)
    results = engine.forward_backward(parts, loss_fn, [1 / n_micro] * n_micro)
    assert reads == ["tolist"], "one host read for all micro-batches' metrics"
    assert flags == [False] * (n_micro - 1) + [True]
    del reads[:]
    step = engine.optimizer_step()
    assert reads == ["tolist"], "the grad norm and the non-finite flag in one read"
    monkeypatch.undo()
    for (xi, yi), res in zip(parts, results):
        with torch.no_grad():
            err = (before(xi) - yi) ** 2
        assert set(res) == {"max_err", "rows", "loss"} and res["rows"] == float(len(xi))
        assert res["max_err"] == pytest.approx(err.max().item())
        assert res["loss"] == pytest.approx(err.mean().item())
    assert step["skipped"] == 0.0 and step["grad_norm"] > 0


def test_forward_backward_refuses_a_non_scalar_metric():
    engine = build_engine("single", _mlp(), OptimSpec())
    x, y, _ = _regression_data(4)

    def loss_fn(module, mb):
        err = (module(mb[0]) - mb[1]) ** 2
        return err.mean(), {"per_row": err.detach().mean(-1)}

    with pytest.raises(TypeError, match=r"metric 'per_row' of micro-batch 0 must be a scalar"):
        engine.forward_backward([(x, y)], loss_fn)


def test_checkpointed_update_casts_weights_uncached_and_matches_the_plain_one():
    """Under bf16 autocast with activation checkpointing, forward_backward turns autocast's
    cache of cast weights off (it would hold a bf16 copy of every weight for the whole
    forward); the gradients are those of the same update without checkpointing."""
    from verl.models import build_tiny_model, enable_activation_checkpointing

    ids = torch.randint(3, 700, (3, 12), generator=torch.Generator().manual_seed(4))
    grads, cache_flags = {}, {}
    for ckpt in (False, True):
        model = build_tiny_model(seed=3)
        if ckpt:
            enable_activation_checkpointing(model)
        engine = build_engine("single", model, OptimSpec(lr=1e-3), autocast_dtype="bf16")
        seen = []

        def loss_fn(module, mb, seen=seen):
            seen.append(torch.is_autocast_cache_enabled())
            return module(input_ids=mb, use_cache=False).logits.float().pow(2).mean(), {}

        engine.forward_backward([ids[:2], ids[2:]], loss_fn)
        grads[ckpt] = {n: p.grad.clone() for n, p in engine.module.named_parameters()}
        cache_flags[ckpt] = seen
    assert cache_flags == {False: [True, True], True: [False, False]}
    for name, g in grads[False].items():
        torch.testing.assert_close(grads[True][name], g, rtol=1e-5, atol=1e-7)
