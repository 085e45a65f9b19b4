"""Tests for the FSDP2 train engine on 2 CPU ranks (gloo), against the single-process engine.

Spawning a process group costs seconds on this machine, so one spawned run does the
training / generation / checkpoint / mixed-precision checks and a second one the
initialisation variants (rank-0 broadcast from ``meta``, CPU offload, SHARD_GRAD_OP with
activation checkpointing, an untied head). Each rank writes its results with
``torch.save``; the test process computes the single-process references and compares.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.ranks import run_ranks
from verl.engine import OptimSpec, build_engine
from verl.kernels.torch_functional import compute_response_log_probs
from verl.models.tiny import build_tiny_model, build_tiny_tokenizer

WORLD = 2
BATCH = 8  # 4 samples per rank, 2 micro-batches of 2 per rank
PROMPT_LEN, RESPONSE_LEN = 6, 5
SPEC = dict(lr=1e-2, weight_decay=0.1)
GRAD_CLIP = 0.5
TOL = 1e-5


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Left-padded prompts + right-padded responses: ids, mask, position ids (BATCH, 11)."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 700, (BATCH, PROMPT_LEN + RESPONSE_LEN), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[3, :1] = 0
    mask[1, -2:] = 0
    mask[6, -4:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos


def _loss_fn(module: torch.nn.Module, mb: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, dict]:
    """Sample mean of each response's token-mean negative log-likelihood."""
    ids, mask, pos = mb
    log_probs, _ = compute_response_log_probs(module, ids, mask, pos, RESPONSE_LEN, chunk_size=4)
    resp_mask = mask[:, -RESPONSE_LEN:].float()
    per_sample = -(log_probs * resp_mask).sum(-1) / resp_mask.sum(-1)
    return per_sample.mean(), {}


def _micro_batches(rows: slice) -> list[tuple[torch.Tensor, ...]]:
    ids, mask, pos = _batch()
    ids, mask, pos = ids[rows], mask[rows], pos[rows]
    half = ids.shape[0] // 2
    return [(ids[:half], mask[:half], pos[:half]), (ids[half:], mask[half:], pos[half:])]


def _prompts():
    from verl.protocol import DataProto

    tok = build_tiny_tokenizer()
    tok.padding_side = "left"
    enc = tok(["What is 1 + 2?", "Hello world, the answer is"], return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    batch = {"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": pos}
    return tok, DataProto.from_dict(tensors=batch)


def _generate(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Greedy and seeded-sampling rollouts of the native engine: tokens and log-probs."""
    from verl.rollout import SamplingParams
    from verl.rollout.native import NativeRollout

    tok, prompts = _prompts()
    rollout = NativeRollout(module, tok)
    out = {}
    for name, params in (
        ("greedy", SamplingParams(n=2, do_sample=False, max_new_tokens=6, stop_token_ids=[])),
        ("sample", SamplingParams(n=3, max_new_tokens=6, seed=7, stop_token_ids=[])),
    ):
        res = rollout.generate(prompts, params)
        out[f"{name}_tokens"] = res.batch["responses"]
        out[f"{name}_log_probs"] = res.batch["rollout_log_probs"]
    return out


def _critic() -> torch.nn.Module:
    from verl.models import CausalLMWithValueHead

    return CausalLMWithValueHead(build_tiny_model())


def _value_loss_fn(module: torch.nn.Module, mb: tuple[torch.Tensor, ...]):
    """Sample mean of each row's token-mean squared error of the values to 0.5."""
    ids, mask, pos = mb
    values = module(input_ids=ids, attention_mask=mask, position_ids=pos)  # (batch, seq)
    err = (values - 0.5) ** 2 * mask
    return (err.sum(-1) / mask.sum(-1)).mean(), {}


def _rm_scores(module: torch.nn.Module) -> torch.Tensor:
    """Last-token reward scores ``(batch,)`` via ``base_model`` + ``score``."""
    ids, mask, pos = _batch()
    hidden = module.base_model(input_ids=ids, attention_mask=mask, position_ids=pos)
    return module.score(hidden.last_hidden_state[:, -1]).squeeze(-1).float()


def _all_sharded(module: torch.nn.Module) -> bool:
    from torch.distributed.tensor import DTensor

    return all(isinstance(p, DTensor) for p in module.parameters())


def _train_step(engine, rows: slice) -> dict[str, float]:
    engine.forward_backward(_micro_batches(rows), _loss_fn, [0.5, 0.5])
    return engine.optimizer_step()


# ---- spawned ranks ----------------------------------------------------------------------


def _init(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    from verl.utils.distributed import init_distributed

    init_distributed(rank, WORLD, "127.0.0.1", port, device_type="cpu", timeout_s=120)


def _main_worker(rank: int, port: int, out_dir: str) -> None:
    """Generation, training vs the reference, DCP round trip, bf16 mixed precision."""
    _init(rank, port)
    import torch.distributed as dist

    res: dict[str, Any] = {}
    rows = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
    engine = build_engine(
        "fsdp2", build_tiny_model(), OptimSpec(**SPEC), grad_clip=GRAD_CLIP, device="cpu"
    )
    res["sharded_at_start"] = _all_sharded(engine.module)
    # First forwards under torch.inference_mode with per-unit gathering (equal work on both
    # ranks): must leave the module trainable.
    res["gen_ungathered"] = _generate(engine.module)

    # (b) hybrid engine: generation on gathered weights, then back to shards.
    with engine.gathered_params():
        res["gathered_plain"] = not any(
            type(p).__name__ == "DTensor" for p in engine.module.parameters()
        )
        res["gen"] = _generate(engine.module)
    res["sharded_after_gather"] = _all_sharded(engine.module)
    # A no-grad scoring pass as the workers do it (no eval_mode), before training.
    ids, mask, pos = _batch()
    with torch.no_grad():
        res["log_probs"], _ = compute_response_log_probs(
            engine.module, ids, mask, pos, RESPONSE_LEN
        )

    # (a) one step on half the batch per rank (2 micro-batches, deferred grad sync).
    res["step1"] = _train_step(engine, rows)
    res["sd1"] = engine.state_dict_for_save()

    # (c) DCP round trip: save, step on; a fresh engine loads and takes the same step.
    ckpt = str(Path(out_dir) / "ckpt")
    engine.save_checkpoint(ckpt)
    engine.save_checkpoint(ckpt)  # overwriting a complete checkpoint is fine
    engine.forward_backward(_micro_batches(rows), _loss_fn, [0.5, 0.5])
    with engine.eval_mode():  # a scoring pass between backward and step keeps the grads
        compute_response_log_probs(engine.module, ids, mask, pos, RESPONSE_LEN)
    res["step2"] = engine.optimizer_step()
    res["sd2"] = engine.state_dict_for_save()
    fresh = build_engine("fsdp2", build_tiny_model(seed=1), OptimSpec(**SPEC), grad_clip=GRAD_CLIP)
    fresh.load_checkpoint(ckpt)
    res["loaded_sd"] = fresh.state_dict_for_save()
    res["loaded_global_step"] = fresh.global_step
    state = copy.deepcopy(fresh.state_dict())  # this rank's shards, in memory
    res["loaded_step2"] = _train_step(fresh, rows)
    res["loaded_sd2"] = fresh.state_dict_for_save()
    res["ckpt_dir"] = ckpt
    # (c') the same through state_dict() / load_state_dict(), no files
    in_memory = build_engine(
        "fsdp2", build_tiny_model(seed=2), OptimSpec(**SPEC), grad_clip=GRAD_CLIP
    )
    in_memory.load_state_dict(state)
    res["memory_step2"] = _train_step(in_memory, rows)
    res["memory_sd2"] = in_memory.state_dict_for_save()

    # (d) bf16 compute / fp32 reduce with fp32 master weights.
    bf16 = build_engine(
        "fsdp2",
        build_tiny_model(),
        OptimSpec(**SPEC),
        grad_clip=GRAD_CLIP,
        mixed_precision={"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
    )
    mb = _micro_batches(rows)
    metrics = bf16.forward_backward(mb, _loss_fn, [0.5, 0.5])
    res["bf16_losses"] = [m["loss"] for m in metrics]
    res["bf16_grad_dtypes"] = sorted({str(p.grad.dtype) for p in bf16.module.parameters()})
    res["bf16_step"] = bf16.optimizer_step()
    res["bf16_param_dtypes"] = sorted({str(p.dtype) for p in bf16.module.parameters()})
    res["bf16_sd"] = bf16.state_dict_for_save()
    with bf16.gathered_params():
        res["bf16_gathered_dtypes"] = sorted({str(p.dtype) for p in bf16.module.parameters()})

    torch.save(res, Path(out_dir) / f"main_rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def _variants_worker(rank: int, port: int, out_dir: str) -> None:
    """Rank-0 broadcast from meta, CPU offload, SHARD_GRAD_OP + checkpointing, untied head."""
    _init(rank, port)
    import torch.distributed as dist

    from verl.models import enable_activation_checkpointing

    res: dict[str, Any] = {}
    rows = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
    if rank == 0:
        model = build_tiny_model()
    else:
        with torch.device("meta"):
            model = build_tiny_model(seed=5)
    engine = build_engine(
        "fsdp2",
        model,
        OptimSpec(**SPEC),
        grad_clip=GRAD_CLIP,
        full_state_dict_from_rank0=True,
    )
    res["broadcast_sd"] = engine.state_dict_for_save()
    res["broadcast_step"] = _train_step(engine, rows)
    res["broadcast_sd1"] = engine.state_dict_for_save()

    try:
        offload = build_engine(
            "fsdp2", build_tiny_model(), OptimSpec(**SPEC), grad_clip=GRAD_CLIP, cpu_offload=True
        )
        res["offload_step"] = _train_step(offload, rows)
        res["offload_sd1"] = offload.state_dict_for_save()
    except Exception as err:  # recorded, asserted on in the test process
        res["offload_error"] = f"{type(err).__name__}: {err}"

    model = enable_activation_checkpointing(build_tiny_model())
    zero2 = build_engine(
        "fsdp2", model, OptimSpec(**SPEC), grad_clip=GRAD_CLIP, reshard_after_forward=False
    )
    res["zero2_step"] = _train_step(zero2, rows)
    res["zero2_sd1"] = zero2.state_dict_for_save()
    with zero2.gathered_params():
        res["zero2_gen"] = _generate(zero2.module)
    res["zero2_sharded_after_gather"] = _all_sharded(zero2.module)

    untied = build_engine(
        "fsdp2",
        build_tiny_model(tie_word_embeddings=False),
        OptimSpec(**SPEC),
        grad_clip=GRAD_CLIP,
    )
    res["untied_step"] = _train_step(untied, rows)
    res["untied_sd1"] = untied.state_dict_for_save()

    # A critic (not a HF PreTrainedModel: the whole module is the root unit).
    critic = build_engine(
        "fsdp2", _critic(), OptimSpec(**SPEC), grad_clip=GRAD_CLIP, reshard_after_forward=False
    )
    critic.forward_backward(_micro_batches(rows), _value_loss_fn, [0.5, 0.5])
    res["critic_step"] = critic.optimizer_step()
    res["critic_sd1"] = critic.state_dict_for_save()

    # An inference-only reward model scored as the reward worker does: body, then `score`.
    rm = build_engine("fsdp2", build_tiny_model(reward_head=True), None)
    with rm.eval_mode():
        res["rm_scores"] = _rm_scores(rm.module)

    torch.save(res, Path(out_dir) / f"variants_rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def _spawn(fn, out_dir: Path, name: str, request) -> list[dict[str, Any]]:
    from verl.utils.distributed import find_free_port

    run_ranks(fn, (find_free_port(), str(out_dir)), WORLD, request)
    return [torch.load(out_dir / f"{name}_rank{r}.pt") for r in range(WORLD)]


@pytest.fixture(scope="module")
def main_results(tmp_path_factory, request) -> list[dict[str, Any]]:
    return _spawn(_main_worker, tmp_path_factory.mktemp("fsdp2_main"), "main", request)


@pytest.fixture(scope="module")
def variant_results(tmp_path_factory, request) -> list[dict[str, Any]]:
    return _spawn(_variants_worker, tmp_path_factory.mktemp("fsdp2_variants"), "variants", request)


# ---- references ---------------------------------------------------------------------------


@functools.cache
def _reference(tie: bool = True, steps: int = 2):
    """Single-process engine trained ``steps`` times on the whole batch in one micro-batch:
    ``[(step metrics, state dict)]`` per step (cached: several tests compare to it)."""
    engine = build_engine(
        "single",
        build_tiny_model(tie_word_embeddings=tie),
        OptimSpec(**SPEC),
        grad_clip=GRAD_CLIP,
    )
    ids, mask, pos = _batch()
    out = []
    for _ in range(steps):
        engine.forward_backward([(ids, mask, pos)], _loss_fn, [1.0])
        out.append((engine.optimizer_step(), engine.state_dict_for_save()))
    return out


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


# ---- tests ------------------------------------------------------------------------------


def test_train_step_matches_single_process_reference(main_results):
    r0, r1 = main_results
    (ref_step, ref_sd), (ref_step2, ref_sd2) = _reference()
    assert r0["sharded_at_start"] and r1["sharded_at_start"]
    assert r1["sd1"] == {}  # the full state dict lives on rank 0 only
    assert all(v.device.type == "cpu" and type(v) is torch.Tensor for v in r0["sd1"].values())
    # HF names, tied head included, exactly as the unsharded model's state dict.
    assert set(r0["sd1"]) == set(build_tiny_model().state_dict())
    assert _max_diff(r0["sd1"], ref_sd) < TOL
    assert _max_diff(r0["sd2"], ref_sd2) < TOL
    for rank in (r0, r1):  # the clipped norm is the global one, identical on every rank
        assert rank["step1"]["grad_norm"] > GRAD_CLIP
        assert rank["step1"]["grad_norm"] == pytest.approx(ref_step["grad_norm"], rel=1e-5)
        assert rank["step2"]["grad_norm"] == pytest.approx(ref_step2["grad_norm"], rel=1e-5)
    assert r0["step1"] == r1["step1"]


def test_no_grad_log_probs_match_unsharded(main_results):
    model = build_tiny_model()
    ids, mask, pos = _batch()
    with torch.no_grad():
        expected, _ = compute_response_log_probs(model, ids, mask, pos, RESPONSE_LEN)
    for rank in main_results:
        torch.testing.assert_close(rank["log_probs"], expected, rtol=0, atol=1e-5)


def test_gathered_params_generation_matches_unsharded(main_results):
    expected = _generate(build_tiny_model())
    for rank in main_results:
        assert rank["gathered_plain"] and rank["sharded_after_gather"]
        for gen in (rank["gen"], rank["gen_ungathered"]):
            for key in ("greedy_tokens", "sample_tokens"):
                assert torch.equal(gen[key], expected[key]), key
            for key in ("greedy_log_probs", "sample_log_probs"):
                torch.testing.assert_close(gen[key], expected[key], rtol=0, atol=1e-5)


def test_dcp_checkpoint_restores_weights_and_optimizer(main_results):
    r0, r1 = main_results
    assert _max_diff(r0["loaded_sd"], r0["sd1"]) == 0.0
    assert r0["loaded_global_step"] == 1 == r1["loaded_global_step"]
    # The same next step (Adam moments restored), to the last bit.
    assert _max_diff(r0["loaded_sd2"], r0["sd2"]) == 0.0
    for rank in (r0, r1):
        assert rank["loaded_step2"] == rank["step2"]


def test_in_memory_state_dict_round_trip(main_results):
    # state_dict() / load_state_dict() of the sharded engine, without files: the same step.
    r0, r1 = main_results
    assert _max_diff(r0["memory_sd2"], r0["sd2"]) == 0.0
    for rank in (r0, r1):
        assert rank["memory_step2"] == rank["step2"]


def test_single_engine_loads_the_two_rank_checkpoint(main_results, monkeypatch):
    # Resuming a multi-rank run in one process: DCP re-shards into the unsharded module,
    # and the next step on the whole batch is the two ranks' next step.
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: (loads.append(k), real_load(*a, **k))[1])
    engine = build_engine(
        "single", build_tiny_model(seed=1), OptimSpec(**SPEC), grad_clip=GRAD_CLIP
    )
    engine.load_checkpoint(main_results[0]["ckpt_dir"])
    # the optimizer's non-tensor values are pickles in DCP: loaded only weights-only
    assert loads and all(k.get("weights_only") is True for k in loads)
    assert engine.global_step == 1
    assert _max_diff(engine.state_dict_for_save(), main_results[0]["sd1"]) == 0.0
    step = _train_step(engine, slice(0, BATCH))
    assert step["grad_norm"] == pytest.approx(main_results[0]["step2"]["grad_norm"], rel=TOL)
    assert step["lr"] == main_results[0]["step2"]["lr"]
    assert _max_diff(engine.state_dict_for_save(), main_results[0]["sd2"]) < TOL


def test_bf16_mixed_precision_keeps_fp32_master_weights(main_results):
    r0, r1 = main_results
    ref_sd = _reference()[0][1]
    for rank in (r0, r1):
        assert all(torch.isfinite(torch.tensor(rank["bf16_losses"])))
        assert rank["bf16_param_dtypes"] == ["torch.float32"]
        assert rank["bf16_grad_dtypes"] == ["torch.float32"]
        assert rank["bf16_gathered_dtypes"] == ["torch.bfloat16"]
        assert rank["bf16_step"]["skipped"] == 0.0
    assert all(v.dtype == torch.float32 for v in r0["bf16_sd"].values())
    # Adam's first update is ~lr * sign(grad) per element, so compare update directions:
    # bf16 flips the sign of some tiny gradients, but the step is the fp32 one overall.
    init = build_tiny_model().state_dict()
    update = torch.cat([(r0["bf16_sd"][k] - init[k]).flatten() for k in init])
    ref_update = torch.cat([(ref_sd[k] - init[k]).flatten() for k in init])
    assert update.abs().max() > 1e-3  # it trained
    assert torch.nn.functional.cosine_similarity(update, ref_update, dim=0) > 0.95


def test_rank0_broadcast_from_meta(variant_results):
    r0, _ = variant_results
    assert _max_diff(r0["broadcast_sd"], build_tiny_model().state_dict()) == 0.0
    ref_step, ref_sd = _reference()[0]
    assert _max_diff(r0["broadcast_sd1"], ref_sd) < TOL
    assert r0["broadcast_step"]["grad_norm"] == pytest.approx(ref_step["grad_norm"], rel=1e-5)


def test_cpu_offload_on_cpu(variant_results):
    r0, _ = variant_results
    assert "offload_error" not in r0, r0.get("offload_error")
    assert _max_diff(r0["offload_sd1"], _reference()[0][1]) < TOL


def test_shard_grad_op_with_activation_checkpointing(variant_results):
    r0, r1 = variant_results
    ref_step, ref_sd = _reference()[0]
    assert _max_diff(r0["zero2_sd1"], ref_sd) < TOL
    assert r0["zero2_step"]["grad_norm"] == pytest.approx(ref_step["grad_norm"], rel=1e-5)
    # Generation with the SGD-trained weights equals an unsharded copy of them.
    model = build_tiny_model()
    model.load_state_dict(ref_sd)
    expected = _generate(model)
    for rank in (r0, r1):
        assert rank["zero2_sharded_after_gather"]
        assert torch.equal(rank["zero2_gen"]["greedy_tokens"], expected["greedy_tokens"])


def test_untied_head(variant_results):
    r0, _ = variant_results
    ref_step, ref_sd = _reference(tie=False)[0]
    assert "lm_head.weight" in r0["untied_sd1"]
    assert _max_diff(r0["untied_sd1"], ref_sd) < TOL
    assert r0["untied_step"]["grad_norm"] == pytest.approx(ref_step["grad_norm"], rel=1e-5)


def test_critic_and_reward_model_layouts(variant_results):
    r0, r1 = variant_results
    ref = build_engine("single", _critic(), OptimSpec(**SPEC), grad_clip=GRAD_CLIP)
    ref.forward_backward([_batch()], _value_loss_fn, [1.0])
    ref_step = ref.optimizer_step()
    assert _max_diff(r0["critic_sd1"], ref.state_dict_for_save()) < TOL
    assert r0["critic_step"]["grad_norm"] == pytest.approx(ref_step["grad_norm"], rel=1e-5)
    assert "value_head.weight" in r0["critic_sd1"]
    with torch.no_grad():
        expected = _rm_scores(build_tiny_model(reward_head=True))
    for rank in (r0, r1):
        torch.testing.assert_close(rank["rm_scores"], expected, rtol=0, atol=1e-5)


def test_fsdp2_needs_an_initialised_process_group():
    import torch.distributed as dist

    assert not dist.is_initialized()
    with pytest.raises(RuntimeError, match=r"verl\.utils\.distributed\.init_distributed"):
        build_engine("fsdp2", build_tiny_model(), OptimSpec(**SPEC))


def test_single_engine_gathered_params_is_a_no_op():
    engine = build_engine("single", build_tiny_model(), OptimSpec(**SPEC))
    before = {k: v.clone() for k, v in engine.module.state_dict().items()}
    with engine.gathered_params():
        _generate(engine.module)
    assert _max_diff(engine.module.state_dict(), before) == 0.0


def test_single_engine_refuses_fsdp_options():
    with pytest.raises(ValueError, match="fsdp2 options"):
        build_engine("single", build_tiny_model(), cpu_offload=True)
