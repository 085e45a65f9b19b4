"""Tensor parallelism in the fsdp2 engine (``tensor_parallel_size=2``, a (data, tensor) mesh
of 1 x 2 on 2 gloo ranks) against the single-process engine, plus its refusals.

One spawned run trains two optimizer steps on the whole batch (both ranks of the tensor
group hold the same rows): a padded step of two micro-batches, then a packed one. Each
rank records the loss, the log-probs and entropies, the gradients (gathered from their
DTensor shards) before each step, the gradient norm and the weights after it, greedy
tokens generated inside ``gathered_params`` and a DCP checkpoint after the first step. A
second run of one process (fsdp2 engine, no tensor parallelism) loads that checkpoint and
takes the second step. The test process runs the same steps on the single engine and
compares within 1e-5 (fp32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.ranks import run_ranks
from verl.engine import OptimSpec, build_engine
from verl.engine.options import EngineOptions
from verl.engine.tensor_parallel import (
    TensorParallel,
    apply_tensor_parallel,
    build_tensor_parallel,
    check_tensor_parallel,
)
from verl.kernels.torch_functional import compute_response_log_probs
from verl.models.tiny import build_tiny_model, build_tiny_tokenizer

WORLD = 2
BATCH = 6
PROMPT_LEN, RESPONSE_LEN = 6, 5
# Adam's eps well above the gradients' rounding: with eps=1e-8 a first step divides each
# gradient by its own magnitude, and gradients near zero (equal within 1e-5) would move their
# weights by up to lr in different directions
SPEC = dict(lr=1e-2, weight_decay=0.1, eps=1e-3)
GRAD_CLIP = 0.5
TOL = 1e-5
MEASURED: dict[str, float] = {}


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompts + right-padded responses: ids, mask, position ids."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 700, (BATCH, PROMPT_LEN + RESPONSE_LEN), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[3, :1] = 0
    mask[1, -2:] = 0
    mask[4, -4:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos


def _loss_fn(pack: bool):
    def loss_fn(module: torch.nn.Module, mb: tuple[torch.Tensor, ...]):
        """Token mean of -(log-prob + 0.05 entropy) over the micro-batch."""
        ids, mask, pos = mb
        lp, ent = compute_response_log_probs(
            module, ids, mask, pos, RESPONSE_LEN, temperature=0.9, chunk_size=4,
            calculate_entropy=True, pack=pack,
        )  # fmt: skip
        resp = mask[:, -RESPONSE_LEN:].float()
        return -((lp + 0.05 * ent) * resp).sum() / resp.sum(), {}

    return loss_fn


def _micro_batches() -> list[tuple[torch.Tensor, ...]]:
    ids, mask, pos = _batch()
    return [(ids[:3], mask[:3], pos[:3]), (ids[3:], mask[3:], pos[3:])]


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _greedy(module: torch.nn.Module) -> torch.Tensor:
    from verl.protocol import DataProto
    from verl.rollout import SamplingParams
    from verl.rollout.native import NativeRollout

    tok = build_tiny_tokenizer()
    tok.padding_side = "left"
    enc = tok(["What is 1 + 2?", "Hello world"], return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    prompts = DataProto.from_dict(
        tensors={"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": pos}
    )
    params = SamplingParams(n=1, do_sample=False, max_new_tokens=5, stop_token_ids=[])
    return NativeRollout(module, tok).generate(prompts, params).batch["responses"]


def _steps(engine, record, ckpt: str | None = None) -> dict[str, Any]:
    """Two steps (padded, then packed), recording as the module docstring says."""
    res: dict[str, Any] = {}
    ids, mask, pos = _batch()
    with engine.eval_mode():
        res["lp_padded"], res["ent_padded"] = compute_response_log_probs(
            engine.module, ids, mask, pos, RESPONSE_LEN, calculate_entropy=True
        )
        res["lp_packed"], _ = compute_response_log_probs(
            engine.module, ids, mask, pos, RESPONSE_LEN, pack=True
        )
    for i, pack in enumerate((False, True)):
        metrics = engine.forward_backward(_micro_batches(), _loss_fn(pack), [0.5, 0.5])
        res[f"loss{i}"] = [m["loss"] for m in metrics]
        res[f"grads{i}"] = record(engine)
        res[f"step{i}"] = engine.optimizer_step()
        res[f"sd{i}"] = engine.state_dict_for_save()
        if i == 0 and ckpt is not None:
            engine.save_checkpoint(ckpt)
    with engine.gathered_params() as module, torch.no_grad():
        res["greedy"] = _greedy(module)
    return res


def _grads(engine) -> dict[str, torch.Tensor]:
    return {n: _full(p.grad).clone() for n, p in engine.module.named_parameters()}


def _init(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)
    from verl.utils.distributed import init_distributed

    init_distributed(rank, world, "127.0.0.1", port, device_type="cpu", timeout_s=120)


def _tp_worker(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    _init(rank, WORLD, port)
    engine = build_engine(
        "fsdp2", build_tiny_model(), OptimSpec(**SPEC), grad_clip=GRAD_CLIP,
        tensor_parallel_size=WORLD,
    )  # fmt: skip
    res = _steps(engine, _grads, str(Path(out_dir) / "ckpt"))
    res["data_parallel_size"] = engine.data_parallel_size
    res["tensor"] = (engine.tensor_parallel.size, engine.tensor_parallel.rank)
    q = engine.module.model.layers[0].self_attn.q_proj.weight
    res["q_local_shape"] = tuple(q.to_local().shape) if isinstance(q, DTensor) else None
    res["head_placements"] = str(engine.module.lm_head.weight.placements)
    torch.save(res, Path(out_dir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def _resume_worker(rank: int, port: int, out_dir: str) -> None:
    """One process: load the tensor=2 checkpoint, take the second (packed) step."""
    import torch.distributed as dist

    _init(rank, 1, port)
    engine = build_engine("fsdp2", build_tiny_model(seed=5), OptimSpec(**SPEC), grad_clip=GRAD_CLIP)
    engine.load_checkpoint(str(Path(out_dir) / "ckpt"))
    res = {"loaded": engine.state_dict_for_save(), "global_step": engine.global_step}
    engine.forward_backward(_micro_batches(), _loss_fn(True), [0.5, 0.5])
    res["step1"] = engine.optimizer_step()
    res["sd1"] = engine.state_dict_for_save()
    torch.save(res, Path(out_dir) / "resumed.pt")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory, request) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from verl.utils.distributed import find_free_port

    out = tmp_path_factory.mktemp("tensor_parallel")
    run_ranks(_tp_worker, (find_free_port(), str(out)), WORLD, request)
    run_ranks(_resume_worker, (find_free_port(), str(out)), 1, request)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)], torch.load(out / "resumed.pt")


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    engine = build_engine("single", build_tiny_model(), OptimSpec(**SPEC), grad_clip=GRAD_CLIP)
    return _steps(engine, _grads)


def _close(got, want, what: str, kind: str, tol: float = TOL) -> float:
    got, want = torch.as_tensor(got), torch.as_tensor(want)
    diff = (got - want).abs().max().item()
    assert diff <= tol, f"{what}: max difference {diff}"
    MEASURED[kind] = max(MEASURED.get(kind, 0.0), diff)
    return diff


# The two spawned runs (``results``) are made once for both tests: one xdist worker runs them.
SHARED_RUNS = pytest.mark.xdist_group("engine_tensor_parallel_results")


@pytest.mark.slow
@SHARED_RUNS
def test_tensor_parallel_engine_equals_one_process(results, reference):
    ranks, _ = results
    want = reference
    mask = _batch()[1][:, -RESPONSE_LEN:].bool()
    for rank, got in enumerate(ranks):
        assert got["data_parallel_size"] == 1
        assert got["tensor"] == (2, rank)
        assert got["q_local_shape"] == (32, 64)  # 4 heads of 16 split over 2 ranks
        assert "Shard(dim=0)" in got["head_placements"]  # the head split over the vocabulary
        for key in ("lp_padded", "ent_padded", "lp_packed"):
            _close(got[key][mask], want[key][mask], key, key)
        for i in (0, 1):
            _close(got[f"loss{i}"], want[f"loss{i}"], f"loss of step {i}", "loss")
            assert set(got[f"grads{i}"]) == set(want[f"grads{i}"])
            for name, grad in want[f"grads{i}"].items():
                _close(got[f"grads{i}"][name], grad, f"gradient of {name} (step {i})", "grads")
            _close(got[f"step{i}"]["grad_norm"], want[f"step{i}"]["grad_norm"], "norm", "grad_norm")
            assert got[f"step{i}"]["grad_norm"] > GRAD_CLIP  # clipping was exercised
            if rank > 0:  # the full state dict is rank 0's
                assert got[f"sd{i}"] == {}
                continue
            for name, value in want[f"sd{i}"].items():
                _close(got[f"sd{i}"][name], value, f"{name} after step {i}", "weights")
        assert torch.equal(got["greedy"], want["greedy"])
    print(f"tensor=2 vs one process, max abs differences: {MEASURED}")


@pytest.mark.slow
@SHARED_RUNS
def test_tensor_parallel_checkpoint_resumes_in_one_process(results, reference):
    ranks, resumed = results
    assert resumed["global_step"] == 1
    for name, value in ranks[0]["sd0"].items():
        _close(resumed["loaded"][name], value, f"loaded {name}", "loaded")
    _close(resumed["step1"]["grad_norm"], reference["step1"]["grad_norm"], "norm", "resumed_norm")
    for name, value in reference["sd1"].items():
        _close(resumed["sd1"][name], value, f"resumed {name}", "resumed_weights")
    print(f"resumed in one process, max abs differences: {MEASURED}")


# ---- refusals (no process group needed) --------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(num_heads=4, num_kv_heads=1), r"key/value heads \(1\) cannot be split evenly over 2"),
        (dict(hidden_size=48, num_heads=3, num_kv_heads=1), r"query heads \(3\)"),
        (dict(intermediate_size=129), r"intermediate size \(129\)"),
    ],
)
def test_indivisible_models_are_refused(kwargs, match):
    model = build_tiny_model(**kwargs)
    with pytest.raises(ValueError, match=match):
        check_tensor_parallel(model.config, 2)


def test_unsupported_combinations_are_refused():
    fake = TensorParallel(mesh=None, group=None, size=2, rank=0, dp_size=1, dp_rank=0)
    config = build_tiny_model().config
    config.model_type = "gemma"
    with pytest.raises(NotImplementedError, match="model_type='gemma' has no tensor-parallel plan"):
        check_tensor_parallel(config, 2)

    class PeftLike(torch.nn.Module):
        def get_base_model(self):
            return build_tiny_model()

    with pytest.raises(NotImplementedError, match="LoRA"):
        apply_tensor_parallel(PeftLike(), fake)
    with pytest.raises(NotImplementedError, match="ulysses_sequence_parallel_size=2"):
        build_tensor_parallel("cpu", 2, EngineOptions(sequence_parallel_size=2))
    with pytest.raises(ValueError, match="tensor_parallel_size=2 needs the fsdp2 engine"):
        build_engine("single", build_tiny_model(), None, tensor_parallel_size=2)
