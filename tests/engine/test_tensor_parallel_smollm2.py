"""Tensor parallelism at ``tensor_parallel_size=3`` with SmolLM2-135M's shapes (9 query / 3
key/value heads of 64, hidden 576, MLP 1536, vocabulary 49152, tied embeddings) on 3 gloo
ranks, against the single-process engine.

The model is built offline from a ``LlamaConfig`` with SmolLM2's ``config.json`` shapes but
2 decoder layers (randomly initialised, seed 0), so each rank holds 3 query heads, 1
key/value head, a third of the MLP width and a third of the vocabulary. One
``forward_backward`` over two micro-batches: the response log-probs and entropies, the loss
and every parameter's gradient (gathered from its DTensor shards) must equal the single
engine's within 1e-5 (fp32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.ranks import run_ranks
from verl.engine import OptimSpec, build_engine
from verl.kernels.torch_functional import compute_response_log_probs

pytestmark = pytest.mark.slow

WORLD = 3
BATCH = 4
PROMPT_LEN, RESPONSE_LEN = 5, 4
TOL = 1e-5


def _smollm2_like() -> torch.nn.Module:
    """SmolLM2-135M's shapes (its ``config.json``), 2 layers instead of 30."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=2,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        hidden_act="silu",
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).float()


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompts + right-padded responses: ids, mask, position ids."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 49152, (BATCH, PROMPT_LEN + RESPONSE_LEN), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[3, -2:] = 0
    ids = ids.masked_fill(mask == 0, 2)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos


def _loss_fn(module: torch.nn.Module, mb: tuple[torch.Tensor, ...]):
    """Token mean of -(log-prob + 0.05 entropy) over the micro-batch."""
    ids, mask, pos = mb
    lp, ent = compute_response_log_probs(
        module, ids, mask, pos, RESPONSE_LEN, calculate_entropy=True
    )
    resp = mask[:, -RESPONSE_LEN:].float()
    return -((lp + 0.05 * ent) * resp).sum() / resp.sum(), {}


def _run(engine) -> dict[str, Any]:
    ids, mask, pos = _batch()
    res: dict[str, Any] = {}
    with engine.eval_mode():
        res["lp"], res["ent"] = compute_response_log_probs(
            engine.module, ids, mask, pos, RESPONSE_LEN, calculate_entropy=True
        )
    mbs = [(ids[:2], mask[:2], pos[:2]), (ids[2:], mask[2:], pos[2:])]
    res["loss"] = [m["loss"] for m in engine.forward_backward(mbs, _loss_fn, [0.5, 0.5])]
    res["grads"] = {
        name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).clone()
        for name, p in engine.module.named_parameters()
    }
    return res


def _tp_worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from verl.utils.distributed import init_distributed

    torch.set_num_threads(1)
    init_distributed(rank, WORLD, "127.0.0.1", port, device_type="cpu", timeout_s=300)
    engine = build_engine("fsdp2", _smollm2_like(), OptimSpec(lr=1e-2), tensor_parallel_size=WORLD)
    res = _run(engine)
    q = engine.module.model.layers[0].self_attn.q_proj.weight
    k = engine.module.model.layers[0].self_attn.k_proj.weight
    res["local_shapes"] = tuple(
        tuple(w.to_local().shape) if isinstance(w, DTensor) else None for w in (q, k)
    )
    if rank == 0:
        torch.save(res, Path(out_dir) / "rank0.pt")
    else:  # the rows are the same on every rank of the group: rank 0's gradients suffice
        torch.save({k: v for k, v in res.items() if k != "grads"}, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def test_smollm2_shapes_at_tensor_3_equal_one_process(tmp_path, request):
    from verl.utils.distributed import find_free_port

    run_ranks(_tp_worker, (find_free_port(), str(tmp_path)), WORLD, request)
    want = _run(build_engine("single", _smollm2_like(), OptimSpec(lr=1e-2)))
    mask = _batch()[1][:, -RESPONSE_LEN:].bool()
    worst: dict[str, float] = {}

    def close(got, ref, what: str, kind: str) -> None:
        diff = float((torch.as_tensor(got) - torch.as_tensor(ref)).abs().max())
        assert diff <= TOL, f"{what}: max difference {diff:.3g}"
        worst[kind] = max(worst.get(kind, 0.0), diff)

    for rank in range(WORLD):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        # 3 of 9 query heads (192 rows) and 1 of 3 key/value heads (64 rows) per rank
        assert got["local_shapes"] == ((192, 576), (64, 576)), got["local_shapes"]
        close(got["lp"][mask], want["lp"][mask], "log-probs", "log_probs")
        close(got["ent"][mask], want["ent"][mask], "entropies", "entropy")
        close(got["loss"], want["loss"], "loss", "loss")
    grads = torch.load(tmp_path / "rank0.pt")["grads"]
    assert set(grads) == set(want["grads"])
    for name, grad in want["grads"].items():
        assert grad.abs().max() > 0, name
        close(grads[name], grad, f"gradient of {name}", "grads")
    print(f"SmolLM2 shapes, tensor=3 vs one process, max abs differences: {worst}")
