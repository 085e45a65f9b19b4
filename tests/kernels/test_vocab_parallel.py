"""Vocabulary-parallel log-probs and entropies (``verl.kernels.vocab_parallel``) on 2 gloo
ranks against one process.

One spawned run. (1) Raw logits: each rank holds half of the vocabulary columns of the
same ``(rows, V)`` logits (one banned, ``-inf``, token included) and computes log-probs,
entropies, ``sum p^2`` and the gradient of a loss over them; the test process computes the
same with the one-process kernel (``LogProbEntropy``) on the full rows. (2) A tiny Qwen2
split by ``verl.engine.tensor_parallel`` (no FSDP): ``compute_response_log_probs`` on a
padded batch, whose head never gathers the vocabulary, against the unsplit model; and the
head called outside it returns the gathered full logits. All within 1e-5 in fp32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.ranks import run_ranks
from verl.kernels.logprob_kernels import LogProbEntropy
from verl.kernels.torch_functional import compute_response_log_probs
from verl.models.tiny import build_tiny_model

WORLD = 2
ROWS, VOCAB = 9, 40
PROMPT_LEN, RESPONSE_LEN = 6, 5
TOL = 1e-5
MEASURED: dict[str, float] = {}
# a 2-rank spawned run, made once (``results``) for both tests: one xdist worker runs them
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("vocab_parallel_results")]


def _logits() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(ROWS, VOCAB, generator=g) * 3
    logits[2, 31] = float("-inf")  # a banned token on rank 1's half
    labels = torch.randint(0, VOCAB, (ROWS,), generator=g)
    labels[0], labels[1] = 0, VOCAB - 1  # the first and last id
    return logits, labels


def _raw_loss(lp: torch.Tensor, ent: torch.Tensor) -> torch.Tensor:
    return (lp * torch.linspace(-1, 1, ROWS)).sum() + 0.3 * ent.sum()


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompts + right-padded responses."""
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 700, (4, PROMPT_LEN + RESPONSE_LEN), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[2, :1] = 0
    mask[1, -2:] = 0
    mask[3, -4:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos


def _model_run(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    ids, mask, pos = _batch()
    lp, ent, sps = compute_response_log_probs(
        model, ids, mask, pos, RESPONSE_LEN, temperature=0.8, chunk_size=3,
        calculate_entropy=True, calculate_sum_pi_squared=True,
    )  # fmt: skip
    resp = mask[:, -RESPONSE_LEN:].bool()
    loss = -((lp + 0.1 * ent) * resp).sum() / resp.sum()
    loss.backward()
    return {"lp": lp.detach()[resp], "ent": ent.detach()[resp], "sps": sps[resp], "loss": loss}


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    import torch.distributed as dist

    from verl.engine.tensor_parallel import apply_tensor_parallel, build_tensor_parallel
    from verl.kernels.vocab_parallel import VocabShard, vocab_parallel_log_probs
    from verl.utils.distributed import init_distributed

    init_distributed(rank, WORLD, "127.0.0.1", port, device_type="cpu", timeout_s=120)
    res: dict[str, Any] = {}
    # (1) raw logit shards
    logits, labels = _logits()
    size = VOCAB // WORLD
    mine = logits[:, rank * size : (rank + 1) * size].clone().requires_grad_(True)
    shard = VocabShard(dist.group.WORLD, rank * size, size, VOCAB)
    lp, ent, sps = vocab_parallel_log_probs(mine, labels, shard, True, True)
    _raw_loss(lp, ent).backward()
    parts = [torch.empty_like(mine.grad) for _ in range(WORLD)]
    dist.all_gather(parts, mine.grad)
    res["raw"] = {"lp": lp.detach(), "ent": ent.detach(), "sps": sps, "grad": torch.cat(parts, 1)}
    # (2) a tensor-parallel tiny model
    tp = build_tensor_parallel("cpu", WORLD)
    model = build_tiny_model()
    apply_tensor_parallel(model, tp)
    out = _model_run(model)
    grads = {}
    for name, p in model.named_parameters():
        grad = p.grad
        grads[name] = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
    out["grads"] = grads
    ids, mask, pos = _batch()
    with torch.no_grad():
        out["full_logits"] = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    res["model"] = out
    torch.save(res, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory, request) -> list[dict[str, Any]]:
    from verl.utils.distributed import find_free_port

    out_dir = tmp_path_factory.mktemp("vocab_parallel")
    run_ranks(_worker, (find_free_port(), str(out_dir)), WORLD, request)
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(WORLD)]


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> float:
    diff = (got - want).abs().max().item()
    assert diff <= TOL, f"{what}: max difference {diff}"
    MEASURED[what.split(" of ")[0]] = max(MEASURED.get(what.split(" of ")[0], 0.0), diff)
    return diff


def test_sharded_logits_equal_the_full_row_kernel(results):
    logits, labels = _logits()
    full = logits.clone().requires_grad_(True)
    lp, ent = LogProbEntropy.apply(full, labels, True, False)
    _raw_loss(lp, ent).backward()
    probs = torch.softmax(logits, -1)
    for res in results:
        raw = res["raw"]
        _close(raw["lp"], lp.detach(), "log-probs")
        _close(raw["ent"], ent.detach(), "entropy")
        _close(raw["sps"], probs.square().sum(-1), "sum p^2")
        _close(raw["grad"], full.grad, "logit gradient")
    assert torch.isfinite(results[0]["raw"]["grad"]).all()
    print(f"vocabulary-parallel kernel vs one process, max abs differences: {MEASURED}")


def test_tensor_parallel_model_equals_one_process_on_a_padded_batch(results):
    model = build_tiny_model()
    want = _model_run(model)
    for res in results:
        got = res["model"]
        for key in ("lp", "ent", "sps", "loss"):
            _close(got[key], want[key].detach(), key)
        for name, p in model.named_parameters():
            _close(got["grads"][name], p.grad, f"gradient of {name}")
    ids, mask, pos = _batch()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    assert results[0]["model"]["full_logits"].shape == logits.shape
    _close(results[0]["model"]["full_logits"], logits, "logits of a plain forward (gathered)")
    print(f"tensor-parallel model vs one process, max abs differences: {MEASURED}")
