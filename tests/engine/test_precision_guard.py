"""Precision in the train engine: fp16 dynamic loss scaling and the non-finite guard."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from verl.engine import NonFiniteLossError, OptimSpec, build_engine


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


X = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))


def _loss(module, poison=None):
    out = module(X)
    loss = out.float().pow(2).mean()
    if poison == "grad":  # inf loss and inf gradients
        loss = loss * float("inf")
    elif poison == "value":  # nan loss whose gradient is finite
        loss = loss + torch.tensor(float("nan"))
    return loss, {"out_dtype": float(out.dtype == torch.float16)}


def _step(engine, poison=None):
    metrics = engine.forward_backward([poison], lambda m, p: _loss(m, p))
    return metrics, engine.optimizer_step()


def _params(engine):
    return [p.detach().clone() for p in engine.module.parameters()]


def test_fp16_autocast_keeps_fp32_master_weights_and_scales_the_loss():
    engine = build_engine("single", _mlp(), OptimSpec(lr=1e-2), autocast_dtype="fp16")
    assert engine.scaler is not None
    assert {p.dtype for p in engine.module.parameters()} == {torch.float32}
    metrics, step = _step(engine)
    assert metrics[0]["out_dtype"] == 1.0  # computed in fp16
    assert step["skipped"] == 0.0 and step["loss_scale"] == 65536.0


def test_fp16_loss_scaling_skips_a_step_with_an_injected_inf_and_halves_the_scale():
    engine = build_engine("single", _mlp(), OptimSpec(lr=1e-2), autocast_dtype="fp16")
    before = _params(engine)
    _, step = _step(engine, poison="grad")
    assert step["skipped"] == 1.0 and step["loss_scale"] == 65536.0
    assert engine.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, _params(engine)))
    assert all(p.grad is None for p in engine.module.parameters())  # grads zeroed
    assert engine.optimizer.state == {}  # AdamW never stepped
    assert engine.scaler.get_scale() == 32768.0
    _, step = _step(engine)  # the next good step runs at the halved scale
    assert step["skipped"] == 0.0 and step["loss_scale"] == 32768.0
    assert engine.consecutive_skipped == 0
    assert not all(torch.equal(a, b) for a, b in zip(before, _params(engine)))


def test_gradient_scaling_can_be_turned_off_and_on_explicitly():
    off = build_engine("single", _mlp(), OptimSpec(), autocast_dtype="fp16", grad_scaling=False)
    assert off.scaler is None
    on = build_engine("single", _mlp(), OptimSpec(), grad_scaling=True)
    assert on.scaler is not None


@pytest.mark.parametrize("poison", ["grad", "value"])
def test_nonfinite_guard_skips_counts_and_stops_after_n_in_a_row(poison):
    engine = build_engine("single", _mlp(), OptimSpec(lr=1e-2), max_consecutive_nonfinite=3)
    before = _params(engine)
    for expected in (1, 2):
        _, step = _step(engine, poison=poison)
        assert step["skipped"] == 1.0 and engine.consecutive_skipped == expected
    assert all(torch.equal(a, b) for a, b in zip(before, _params(engine)))
    _step(engine)  # a good step resets the run of bad ones
    assert engine.consecutive_skipped == 0 and engine.skipped_steps == 2
    _step(engine, poison=poison)
    _step(engine, poison=poison)
    with pytest.raises(NonFiniteLossError, match=r"3 optimizer steps in a row .* non-finite"):
        _step(engine, poison=poison)
    assert engine.skipped_steps == 5


def test_guard_zero_never_stops():
    engine = build_engine("single", _mlp(), OptimSpec(), max_consecutive_nonfinite=0)
    for _ in range(5):
        _step(engine, poison="grad")
    assert engine.skipped_steps == 5


def test_bf16_autocast_computes_in_bf16_without_a_scaler():
    engine = build_engine("single", _mlp(), OptimSpec(), autocast_dtype="bf16")
    assert engine.scaler is None
    seen = []
    engine.module[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    _step(engine)
    assert seen == [torch.bfloat16]
    assert {p.dtype for p in engine.module.parameters()} == {torch.float32}
