"""Offload between uses: what moves when, and the config reaching the engines.

On this CPU-only machine nothing physically moves (the device *is* the host), so the tests
check the bookkeeping with the move recorded instead of performed, and the move itself on
the ``meta`` device (every parameter, gradient and optimizer state tensor must follow).
"""

from __future__ import annotations

import torch

from verl.engine import OptimSpec, build_engine
from verl.models import build_tiny_model

SPEC = dict(lr=1e-3, weight_decay=0.0, warmup_steps=0, total_steps=10)


def _engine(**kwargs):
    return build_engine(
        "single", build_tiny_model(hidden_size=32, num_layers=1), OptimSpec(**SPEC), **kwargs
    )


def _step(engine):
    ids = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    with engine.train_mode():
        loss = engine.module(ids).logits.float().square().mean()
        engine.backward(loss)
        engine.optimizer_step()


def test_move_takes_parameters_grads_and_optimizer_state():
    engine = _engine()
    _step(engine)
    for p in engine.module.parameters():
        p.grad = torch.zeros_like(p)
    engine._move(torch.device("meta"), model=True, optimizer=True)
    assert {p.device.type for p in engine.module.parameters()} == {"meta"}
    assert {p.grad.device.type for p in engine.module.parameters()} == {"meta"}
    state = [v for s in engine.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert state and {t.device.type for t in state} == {"meta"}


def _record(monkeypatch):
    moves: list[tuple[str, bool, bool]] = []
    monkeypatch.setattr(
        "verl.engine.base.TrainEngine.load_to_device",
        lambda self, model=True, optimizer=True: moves.append(("load", model, optimizer)),
    )
    monkeypatch.setattr(
        "verl.engine.base.TrainEngine.offload_to_cpu",
        lambda self, model=True, optimizer=True: moves.append(("offload", model, optimizer)),
    )
    return moves


def test_offloaded_state_is_resident_only_inside_the_outermost_block(monkeypatch):
    moves = _record(monkeypatch)
    engine = _engine(offload_params=True, offload_optimizer=True)
    assert moves == [("offload", True, True)]  # offloaded once built
    moves.clear()
    with engine.train_mode():
        with engine.eval_mode(), engine.gathered_params():
            pass
        assert "offload" not in [m[0] for m in moves]  # inner blocks never offload early
    assert moves[0] == ("load", True, True) and moves[-1] == ("offload", True, True)
    assert [m[0] for m in moves].count("offload") == 1
    moves.clear()
    with engine.eval_mode():  # inference needs the weights, not the optimizer state
        pass
    assert moves == [("load", True, False), ("offload", True, False)]
    moves.clear()
    _step(engine)  # a real step with the bookkeeping on: same pattern, and it trains
    assert moves == [("load", True, True), ("offload", True, True)]


def test_no_offload_means_no_moves(monkeypatch):
    moves = _record(monkeypatch)
    engine = _engine()
    with engine.train_mode(), engine.eval_mode():
        pass
    assert moves == []


def test_fsdp2_param_offload_is_the_cpu_offload_policy():
    from types import SimpleNamespace

    from verl.workers.role_options import engine_options

    def fsdp(params, optim):
        return SimpleNamespace(
            param_offload=params,
            optimizer_offload=optim,
            reshard_after_forward=True,
            mixed_precision=None,
        )

    both = engine_options("fsdp2", fsdp(True, True))
    assert (both["cpu_offload"], both["offload_optimizer"]) == (True, False)
    optim_only = engine_options("fsdp2", fsdp(False, True))
    assert (optim_only["cpu_offload"], optim_only["offload_optimizer"]) == (False, True)
    single = engine_options("single", fsdp(True, False))
    assert single == {"offload_params": True, "offload_optimizer": False}
