"""FSDP2 on 2 CPU ranks (gloo): tutorial 000's per-role shard dims (section 6.4,
``hybrid_engine_config.{actor,critic}_shard_dim`` -> ``<role>.fsdp_config.shard_dim``, FSDP2's
``shard_placement_fn``) and its gradient compression (section 2, "梯度同步时自动压缩":
``fsdp_config.mixed_precision.reduce_dtype=bf16``, the reduce-scatter in bf16).

One spawned run (the helpers and the reference of ``test_fsdp2_engine``) builds the engines
from the tutorial's config and records each rank's shard shapes, the bytes every
reduce-scatter moves, the gradients after one backward and the weights after one step.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_fsdp2_engine import (
    BATCH,
    GRAD_CLIP,
    SPEC,
    TOL,
    WORLD,
    _critic,
    _init,
    _loss_fn,
    _max_diff,
    _micro_batches,
    _reference,
    _train_step,
    _value_loss_fn,
)

from tests.ranks import run_ranks
from verl.engine import OptimSpec, build_engine
from verl.models.tiny import build_tiny_model

WEIGHT = "model.layers.0.self_attn.q_proj.weight"  # a [out, in] weight of the actor
CRITIC_WEIGHT = WEIGHT  # the critic's body keeps the LM's names


def _tutorial_config():
    """Tutorial 000 section 6.4's block, as written."""
    from verl import TrainerConfig

    return TrainerConfig(
        enable_3d_hybrid_engine=True,
        hybrid_engine_config={
            "actor_shard_dim": 0,  # 按列分片
            "critic_shard_dim": 1,  # 按行分片(错开减小通信)
            "enable_activation_recomputation": True,
        },
    )


def _local_shapes(module: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """``{name: (full shape, this rank's shard shape)}`` of every parameter."""
    return {n: (tuple(p.shape), tuple(p.to_local().shape)) for n, p in module.named_parameters()}


def _full_grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.full_tensor().clone() for n, p in module.named_parameters()}


def _worker(rank: int, port: int, out_dir: str) -> None:
    _init(rank, port)
    import torch.distributed as dist

    cfg = _tutorial_config()
    res: dict[str, Any] = {}
    rows = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)

    # per role: the actor along 0, the critic along 1, as the config says
    actor_dim = cfg.actor_rollout_ref.actor.fsdp_config.shard_dim
    critic_dim = cfg.critic.fsdp_config.shard_dim
    actor = build_engine(
        "fsdp2",
        build_tiny_model(),
        OptimSpec(**SPEC),
        grad_clip=GRAD_CLIP,
        shard_dim=actor_dim,
    )
    critic = build_engine("fsdp2", _critic(), OptimSpec(**SPEC), shard_dim=critic_dim)
    res["actor_shapes"] = _local_shapes(actor.module)
    res["critic_shapes"] = _local_shapes(critic.module)
    critic.forward_backward(_micro_batches(rows), _value_loss_fn, [0.5, 0.5])
    res["critic_step"] = critic.optimizer_step()

    # the same actor sharded along dim 1 trains to the same weights (two steps)
    by_cols = build_engine(
        "fsdp2", build_tiny_model(), OptimSpec(**SPEC), grad_clip=GRAD_CLIP, shard_dim=1
    )
    res["cols_shapes"] = _local_shapes(by_cols.module)
    for _ in range(2):
        _train_step(by_cols, rows)
    res["cols_state"] = by_cols.state_dict_for_save()

    # gradient compression: count the bytes of every reduce-scatter, fp32 vs bf16
    sent: list[tuple[int, torch.dtype]] = []
    real = dist.reduce_scatter_single

    def counting(output, input, *args, **kwargs):
        sent.append((input.numel() * input.element_size(), input.dtype))
        return real(output, input, *args, **kwargs)

    dist.reduce_scatter_single = counting
    try:
        for name, reduce_dtype in (("fp32", "fp32"), ("bf16", "bf16")):
            sent.clear()
            engine = build_engine(
                "fsdp2",
                build_tiny_model(),
                OptimSpec(**SPEC),
                grad_clip=GRAD_CLIP,
                mixed_precision={"reduce_dtype": reduce_dtype},
            )
            engine.forward_backward(_micro_batches(rows), _loss_fn, [0.5, 0.5])
            res[f"grads_{name}"] = _full_grads(engine.module)
            res[f"bytes_{name}"] = sum(b for b, _ in sent)
            res[f"dtypes_{name}"] = sorted({str(d) for _, d in sent})
            res[f"grad_dtype_{name}"] = {str(p.grad.dtype) for p in engine.module.parameters()}
    finally:
        dist.reduce_scatter_single = real
    torch.save(res, Path(out_dir) / f"shard_rank{rank}.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory, request) -> list[dict[str, Any]]:
    from verl.utils.distributed import find_free_port

    out = tmp_path_factory.mktemp("fsdp2_shard_dim")
    run_ranks(_worker, (find_free_port(), str(out)), WORLD, request)
    return [torch.load(out / f"shard_rank{r}.pt") for r in range(WORLD)]


def test_tutorial_shard_dims_reach_each_role(caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="verl.compat"):
        cfg = _tutorial_config()
    assert cfg.actor_rollout_ref.actor.fsdp_config.shard_dim == 0
    assert cfg.critic.fsdp_config.shard_dim == 1
    assert "hybrid_engine_config.critic_shard_dim -> critic.fsdp_config.shard_dim=1" in caplog.text


def test_shard_shapes_follow_the_role_shard_dim(results):
    for res in results:
        full, local = res["actor_shapes"][WEIGHT]
        assert local == (full[0] // WORLD, full[1])  # rows
        full, local = res["critic_shapes"][CRITIC_WEIGHT]
        assert local == (full[0], full[1] // WORLD)  # columns
        full, local = res["cols_shapes"][WEIGHT]
        assert local == (full[0], full[1] // WORLD)
        # a 1-D parameter (a norm's weight) is sharded along 0 whatever the dim
        norm = "model.layers.0.input_layernorm.weight"
        full, local = res["cols_shapes"][norm]
        assert local == (full[0] // WORLD,)
        assert res["critic_step"]["grad_norm"] > 0


def test_column_shards_train_like_the_single_process_engine(results):
    ref_state = _reference()[1][1]  # after two steps
    assert results[1]["cols_state"] == {}  # the full state dict lives on rank 0
    assert _max_diff(results[0]["cols_state"], ref_state) < TOL


def test_bf16_reduce_scatter_halves_the_bytes_and_bounds_the_error(results):
    for res in results:
        assert res["dtypes_fp32"] == ["torch.float32"]
        assert res["dtypes_bf16"] == ["torch.bfloat16"]
        assert res["bytes_fp32"] > 0 and res["bytes_fp32"] == 2 * res["bytes_bf16"]
        # the reduced gradients are kept in fp32 (the parameters' dtype)
        assert res["grad_dtype_bf16"] == {"torch.float32"}
        exact, compressed = res["grads_fp32"], res["grads_bf16"]
        rel = max(
            ((compressed[n] - g).abs().max() / g.abs().max().clamp(min=1e-12)).item()
            for n, g in exact.items()
        )
        # bf16 rounding of the reduced values: visible, and within a few bf16 ulps
        assert 1e-5 < rel < 2**-6
    # both ranks hold the same full gradient
    assert _max_diff(results[0]["grads_bf16"], results[1]["grads_bf16"]) == 0


def test_reduce_dtype_bf16_validates_with_a_warning():
    from verl import TrainerConfig

    cfg = TrainerConfig(
        mixed_precision="bf16",
        fsdp_config={
            "mixed_precision": {
                "param_dtype": "bf16",
                "reduce_dtype": "bf16",
                "buffer_dtype": "fp32",
            }
        },
    )
    cfg.actor_rollout_ref.actor.strategy = "fsdp2"
    warnings = cfg.validate()
    assert any(
        "fsdp_config.mixed_precision.reduce_dtype=bf16: the actor's gradients are "
        "reduce-scattered in bf16 (gradient compression: half the bytes of fp32)" in w
        for w in warnings
    )
