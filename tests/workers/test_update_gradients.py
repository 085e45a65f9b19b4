"""The actor's and critic's update gradients, pinned against a frozen plain-torch reference.

The reference below is the PPO update math written out by hand in plain torch (dual-clip
surrogate, truncated rollout importance weights, entropy bonus, k3 KL loss, the four
aggregation modes, the clipped value loss) and the micro-batch loop of the original worker
code: each micro-batch's loss times its share of the mini-batch (tokens, non-empty
sequences or rows), backward, gradients summed. The workers' ``update_actor`` /
``update_critic`` run on the same fixed inputs (tiny seeded model, uneven response lengths
including an empty one, two or more micro-batches) and the gradients they hand to the
optimizer must equal the reference's within 1e-6.

``test_the_tolerance_catches_a_dropped_micro_batch_weight`` shows the tolerance is tight
enough to notice a wrong scaling.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from tests.ranks import run_ranks
from verl.config import load_config
from verl.kernels.torch_functional import compute_response_log_probs
from verl.models import CausalLMWithValueHead
from verl.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny_model_dir
from verl.protocol import DataProto
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.common import micro_batches
from verl.workers.critic import CriticWorker
from verl.workers.micro_batching import split_micro_batches
from verl.workers.specs import actor_rollout_ref_spec, critic_spec

P, R = 6, 5
PROMPT_LENS = [6, 2, 4, 3, 5, 1]
RESPONSE_LENS = [5, 3, 1, 0, 4, 2]  # uneven, one empty response
ROWS = len(PROMPT_LENS)
TEMPERATURE = 0.7
CLIP_LOW, CLIP_HIGH, CLIP_C = 0.2, 0.28, 3.0
ENTROPY_COEFF, KL_COEF, IS_THRESHOLD = 0.01, 0.1, 1.1
SCALE_FACTOR = 7.0
CLIPRANGE_VALUE, VALUE_LOSS_COEF = 0.2, 0.5
TOKEN_BUDGET = 22  # packs the six rows into several micro-batches of different sizes
TOL = 1e-6
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", arch="qwen2")


def _inputs() -> dict[str, torch.Tensor]:
    """Left-padded prompts, right-padded responses, ids/masks/positions ``(ROWS, P + R)``."""
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(3, 200, (ROWS, P + R), generator=gen)
    mask = torch.zeros(ROWS, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS, strict=True)):
        mask[i, P - p : P + r] = 1
    ids = ids * mask
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
        "responses": ids[:, P:],
        "response_mask": mask[:, P:].float(),
    }


def _actor_batch(module: torch.nn.Module) -> DataProto:
    """Inputs plus old/ref/rollout log-probs near the model's own, and advantages."""
    t = _inputs()
    with torch.no_grad():
        current, _ = compute_response_log_probs(
            module, t["input_ids"], t["attention_mask"], t["position_ids"], R, TEMPERATURE
        )
    gen = torch.Generator().manual_seed(12)
    noise = [torch.randn(ROWS, R, generator=gen) for _ in range(4)]
    t["old_log_probs"] = current + 0.3 * noise[0]  # ratios on both sides of the clip range
    t["ref_log_probs"] = current + 0.5 * noise[1]
    t["rollout_log_probs"] = t["old_log_probs"] + 0.2 * noise[2]  # some IS weights truncated
    t["advantages"] = noise[3] * t["response_mask"]
    return DataProto.from_dict(tensors=t, meta_info={"temperature": TEMPERATURE})


def _critic_batch() -> DataProto:
    t = _inputs()
    gen = torch.Generator().manual_seed(13)
    t["values"] = 0.3 * torch.randn(ROWS, R, generator=gen) * t["response_mask"]
    t["returns"] = torch.randn(ROWS, R, generator=gen) * t["response_mask"]
    return DataProto.from_dict(tensors=t)


def _config(
    model_dir,
    mode: str,
    dynamic: bool,
    scale_factor: float | None = SCALE_FACTOR,
    extra: tuple[str, ...] = (),
    micro: tuple[str, ...] | None = None,
):
    """``micro``: the micro-batch keys of both roles (``()`` = the defaults); ``None`` =
    two-row micro-batches, or with ``dynamic`` the ``TOKEN_BUDGET``."""
    if micro is None:
        micro = ("use_dynamic_bsz=true", f"ppo_max_token_len_per_device={TOKEN_BUDGET}")
        if not dynamic:
            micro = ("ppo_micro_batch_size_per_device=2",)
    a, c = "actor_rollout_ref.actor", "critic"
    return load_config(
        overrides=[
            f"actor_rollout_ref.model.path={model_dir}",  # validated; the module is given
            "algorithm.adv_estimator=gae",
            "trainer.device=cpu",
            "trainer.mixed_precision=none",  # the fp32 reference gradients, on any CPU
            "data.train_batch_size=3",
            f"data.max_prompt_length={P}",
            f"data.max_response_length={R}",
            "actor_rollout_ref.rollout.n=2",
            f"{a}.ppo_mini_batch_size=3",  # 3 prompts x n=2: one mini-batch of all six rows
            *(f"{a}.{x}" for x in micro),
            f"{a}.shuffle=false",
            f"{a}.loss_agg_mode={mode}",
            f"{a}.loss_scale_factor={'null' if scale_factor is None else scale_factor}",
            f"{a}.clip_ratio_low={CLIP_LOW}",
            f"{a}.clip_ratio_high={CLIP_HIGH}",
            f"{a}.clip_ratio_c={CLIP_C}",
            f"{a}.entropy_coeff={ENTROPY_COEFF}",
            f"{a}.use_kl_loss=true",
            f"{a}.kl_loss_coef={KL_COEF}",
            f"{a}.kl_loss_type=low_var_kl",
            f"{a}.rollout_is_threshold={IS_THRESHOLD}",
            f"{a}.logprob_chunk_size=3",  # several head chunks per micro-batch
            f"{c}.ppo_mini_batch_size=3",
            *(f"{c}.{x}" for x in micro),
            f"{c}.shuffle=false",
            f"{c}.loss_agg_mode={mode}",
            f"{c}.cliprange_value={CLIPRANGE_VALUE}",
            f"{c}.loss_coef={VALUE_LOSS_COEF}",
            *extra,
        ]
    )


def _capture_step_grads(engine) -> list[list[torch.Tensor]]:
    """Record the gradients each optimizer step receives (before clipping)."""
    captured = []
    step = engine.optimizer_step

    def recording_step():
        captured.append([p.grad.detach().clone() for p in engine.module.parameters()])
        return step()

    engine.optimizer_step = recording_step
    return captured


# ---- the frozen reference: the original update math in plain torch -----------------------


def _agg(x: torch.Tensor, m: torch.Tensor, mode: str, scale: float | None) -> torch.Tensor:
    tokens = (x * m).sum(-1)
    counts = m.sum(-1)
    non_empty = counts > 0
    if mode == "token-mean":
        return (x * m).sum() / m.sum() if m.sum() > 0 else x.sum() * 0
    if mode == "seq-mean-token-sum":
        return tokens[non_empty].mean() if non_empty.any() else x.sum() * 0
    if mode == "seq-mean-token-mean":
        per_seq = tokens / counts.clamp_min(1)
        return per_seq[non_empty].mean() if non_empty.any() else x.sum() * 0
    divisor = x.shape[-1] if scale is None else scale
    return (x * m).sum() / (x.shape[0] * divisor)


def _shares(micro: list, mode: str, weighted: bool) -> list[float]:
    if not weighted:
        return [1.0] * len(micro)
    masks = [mb.data.batch["response_mask"] for mb in micro]
    if mode == "token-mean":
        counts = [float(m.sum()) for m in masks]
    elif mode == "seq-mean-token-sum-norm":
        counts = [float(m.shape[0]) for m in masks]
    else:
        counts = [float((m.sum(-1) > 0).sum()) for m in masks]
    return [c / sum(counts) for c in counts]


def _split(data: DataProto, dynamic: bool, packed: bool = False) -> list:
    """The workers' micro-batches; ``packed``: the token budget counts real tokens (a role
    with ``pack_sequences``). Only ``seq-mean-token-sum-norm`` of the critic, whose
    constant is each micro-batch's response width, depends on the split."""
    if dynamic:
        return split_micro_batches(data, R, max_token_len=TOKEN_BUDGET, packed=packed)
    return split_micro_batches(data, R, micro_batch_size=2)


def _reference_actor_grads(
    module: torch.nn.Module,
    micro: list,
    mode: str,
    weighted: bool = True,
    scale_factor: float | None = SCALE_FACTOR,
) -> list[torch.Tensor]:
    """Gradient of the weighted micro-batch losses of ``micro`` (all ranks' micro-batches)."""
    module.train()
    module.zero_grad(set_to_none=True)
    assert len(micro) >= 2
    for mb, share in zip(micro, _shares(micro, mode, weighted)):
        b = mb.data.batch
        m = b["response_mask"]
        log_prob, entropy = compute_response_log_probs(
            module,
            b["input_ids"],
            b["attention_mask"],
            b["position_ids"],
            response_len=mb.response_len,
            temperature=TEMPERATURE,
            chunk_size=3,
            calculate_entropy=True,
        )
        old, adv = b["old_log_probs"], b["advantages"]
        ratio = torch.exp(torch.clamp(log_prob - old, -20.0, 20.0))
        surrogate = torch.maximum(
            -adv * ratio, -adv * torch.clamp(ratio, 1.0 - CLIP_LOW, 1.0 + CLIP_HIGH)
        )
        per_token = torch.where(adv < 0, torch.minimum(surrogate, -adv * CLIP_C), surrogate)
        is_ratio = torch.exp(torch.clamp(old - b["rollout_log_probs"], -20.0, 20.0))
        per_token = per_token * torch.where(m != 0, torch.clamp(is_ratio, max=IS_THRESHOLD), 0.0)
        pg_loss = _agg(per_token, m, mode, scale_factor)
        entropy_loss = _agg(entropy, m, mode, scale_factor)
        neg_log_ratio = torch.clamp(b["ref_log_probs"] - log_prob, -20.0, 20.0)
        kl = torch.clamp(torch.exp(neg_log_ratio) - neg_log_ratio - 1.0, -10.0, 10.0)
        kl_loss = _agg(kl, m, mode, scale_factor)
        loss = pg_loss - ENTROPY_COEFF * entropy_loss + KL_COEF * kl_loss
        (loss * share).backward()
    return [p.grad.detach().clone() for p in module.parameters()]


def _reference_critic_grads(module: torch.nn.Module, micro: list, mode: str) -> list[torch.Tensor]:
    module.train()
    module.zero_grad(set_to_none=True)
    assert len(micro) >= 2
    for mb, share in zip(micro, _shares(micro, mode, True)):
        b = mb.data.batch
        r = mb.response_len
        values = module(
            input_ids=b["input_ids"],
            attention_mask=b["attention_mask"],
            position_ids=b["position_ids"],
        )
        vpreds = values[:, -r - 1 : -1].float()
        old, returns = b["values"], b["returns"]
        clipped = old + torch.clamp(vpreds - old, -CLIPRANGE_VALUE, CLIPRANGE_VALUE)
        per_token = torch.maximum((vpreds - returns) ** 2, (clipped - returns) ** 2)
        vf_loss = 0.5 * _agg(per_token, b["response_mask"], mode, R)  # max_response_length
        (vf_loss * VALUE_LOSS_COEF * share).backward()
    return [p.grad.detach().clone() for p in module.parameters()]


# ---- the workers ------------------------------------------------------------------------


def _actor_module() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_tiny_model()


def _run_actor(cfg, module: torch.nn.Module, data: DataProto) -> tuple[list, dict]:
    worker = ActorRolloutRefWorker(
        actor_rollout_ref_spec(cfg, role="actor_rollout"),
        module=module,
        tokenizer=build_tiny_tokenizer(),
    )
    worker.init_model(total_steps=1)
    captured = _capture_step_grads(worker.engine)
    metrics = worker.update_actor(data)
    assert len(captured) == 1, "one mini-batch, one epoch: one optimizer step"
    return captured[0], metrics


def _run_critic(cfg, module: torch.nn.Module, data: DataProto) -> tuple[list, dict]:
    worker = CriticWorker(critic_spec(cfg), module=module, tokenizer=build_tiny_tokenizer())
    worker.init_model(total_steps=1)
    captured = _capture_step_grads(worker.engine)
    metrics = worker.update_critic(data)
    assert len(captured) == 1
    return captured[0], metrics


def _assert_grads_equal(got: list, want: list) -> None:
    assert len(got) == len(want)
    worst = max(float((g - w).abs().max()) for g, w in zip(got, want))
    assert worst <= TOL, f"gradients differ from the reference by {worst:.3g} > {TOL}"
    assert any(float(w.abs().max()) > 1e-3 for w in want), "the reference gradient is ~0"


@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed", "token-budget"])
@pytest.mark.parametrize("mode", MODES)
def test_actor_update_gradients_equal_the_reference(model_dir, mode, dynamic):
    module = _actor_module()
    reference_module = copy.deepcopy(module)
    data = _actor_batch(module)
    grads, metrics = _run_actor(_config(model_dir, mode, dynamic), module, data)
    want = _reference_actor_grads(reference_module, _split(data, dynamic), mode)
    _assert_grads_equal(grads, want)
    for key in ("pg_loss", "clipfrac", "approx_kl", "entropy_loss", "kl_loss", "grad_norm"):
        assert f"actor/{key}" in metrics, key
    assert 0 < metrics["actor/clipfrac"] < 1
    assert 0 < metrics["actor/rollout_is_clipfrac"] < 1


@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed", "token-budget"])
@pytest.mark.parametrize("mode", MODES)
def test_critic_update_gradients_equal_the_reference(model_dir, mode, dynamic):
    torch.manual_seed(0)
    module = CausalLMWithValueHead(build_tiny_model())
    reference_module = copy.deepcopy(module)
    data = _critic_batch()
    grads, metrics = _run_critic(_config(model_dir, mode, dynamic), module, data)
    want = _reference_critic_grads(reference_module, _split(data, dynamic, packed=True), mode)
    _assert_grads_equal(grads, want)
    assert 0 < metrics["critic/vf_clipfrac"] < 1
    assert {"critic/vf_loss", "critic/vpred_mean", "critic/grad_norm"} <= set(metrics)


def test_the_tolerance_catches_a_dropped_micro_batch_weight():
    module = _actor_module()
    data = _actor_batch(module)
    micro = _split(data, dynamic=False)
    want = _reference_actor_grads(copy.deepcopy(module), micro, "token-mean")
    unweighted = _reference_actor_grads(copy.deepcopy(module), micro, "token-mean", weighted=False)
    worst = max(float((u - w).abs().max()) for u, w in zip(unweighted, want))
    assert worst > 1000 * TOL, worst


def test_updates_run_the_engine_loop_and_sync_gradients_on_the_last_micro_batch(model_dir):
    cfg = _config(model_dir, "token-mean", False)
    cfg.actor_rollout_ref.actor.ppo_epochs = 2
    cfg.critic.ppo_epochs = 2
    module = _actor_module()
    data = _actor_batch(module)
    actor = ActorRolloutRefWorker(
        actor_rollout_ref_spec(cfg, role="actor_rollout"),
        module=module,
        tokenizer=build_tiny_tokenizer(),
    )
    actor.init_model(total_steps=2)
    torch.manual_seed(0)
    critic = CriticWorker(
        critic_spec(cfg),
        module=CausalLMWithValueHead(build_tiny_model()),
        tokenizer=build_tiny_tokenizer(),
    )
    critic.init_model(total_steps=2)
    for worker, update in ((actor, actor.update_actor), (critic, critic.update_critic)):
        engine = worker.engine
        flags, calls = [], []
        context, loop = engine._backward_context, engine.forward_backward

        def spy_context(is_last_micro_batch, _context=context, _flags=flags):
            _flags.append(is_last_micro_batch)
            return _context(is_last_micro_batch)

        def spy_loop(*args, _loop=loop, _calls=calls, **kwargs):
            _calls.append(len(args[0]))
            return _loop(*args, **kwargs)

        engine._backward_context, engine.forward_backward = spy_context, spy_loop
        metrics = update(_critic_batch().union(data) if worker is critic else data)
        # two epochs of one mini-batch, three micro-batches of two rows each
        assert calls == [3, 3]
        assert flags == [False, False, True] * 2
        assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed", "token-budget"])
def test_null_loss_scale_factor_means_max_response_length_whatever_the_split(model_dir, dynamic):
    """``seq-mean-token-sum-norm`` divides by one constant, not by each micro-batch's
    trimmed response width (that would make the gradient depend on the split)."""
    mode = "seq-mean-token-sum-norm"
    module = _actor_module()
    reference_module = copy.deepcopy(module)
    data = _actor_batch(module)
    cfg = _config(model_dir, mode, dynamic, scale_factor=None)
    assert cfg.data.max_response_length == R
    grads, _ = _run_actor(cfg, module, data)
    want = _reference_actor_grads(reference_module, _split(data, dynamic), mode, scale_factor=R)
    _assert_grads_equal(grads, want)


SPLITS = {
    "default": (),  # the token budget: all six rows in one micro-batch
    "rows=1": ("ppo_micro_batch_size_per_device=1",),
    "rows=3": ("ppo_micro_batch_size_per_device=3",),
    "budget=22": (f"ppo_max_token_len_per_device={TOKEN_BUDGET}",),
}


@pytest.mark.parametrize("mode", MODES)
def test_the_gradient_does_not_depend_on_the_micro_batch_split(model_dir, mode):
    """The loss is aggregated over the mini-batch, not per micro-batch: the default split
    (one micro-batch here), single rows, row pairs and a small token budget hand the
    optimizer the same gradient, for the actor and the critic."""
    module = _actor_module()
    data = _actor_batch(module)
    torch.manual_seed(0)
    critic_module = CausalLMWithValueHead(build_tiny_model())
    critic_data = _critic_batch()
    actor_grads, critic_grads, counts = {}, {}, {}
    for name, micro in SPLITS.items():
        cfg = _config(model_dir, mode, dynamic=False, micro=micro)
        counts[name] = len(micro_batches(data, R, None, cfg.actor_rollout_ref.actor))
        actor_grads[name], _ = _run_actor(cfg, copy.deepcopy(module), data)
        critic_grads[name], _ = _run_critic(cfg, copy.deepcopy(critic_module), critic_data)
    assert counts["default"] == 1 and counts["rows=1"] == ROWS and counts["rows=3"] == 2
    assert counts["budget=22"] >= 2
    for name in SPLITS:
        _assert_grads_equal(actor_grads[name], actor_grads["rows=1"])
        _assert_grads_equal(critic_grads[name], critic_grads["rows=1"])


# ---- two FSDP2 ranks ----------------------------------------------------------------------

WORLD = 2
FSDP2_CASES = [("token-mean", False), ("seq-mean-token-mean", True)]


def _rank_chunks(data: DataProto) -> list[DataProto]:
    """The rows each data-parallel rank updates (``DP_COMPUTE`` splits contiguously)."""
    per_rank = ROWS // WORLD
    return [data[r * per_rank : (r + 1) * per_rank] for r in range(WORLD)]


def _split_over_ranks(data: DataProto, dynamic: bool) -> list:
    """All ranks' micro-batches, as the workers cut them (the same count on every rank)."""
    chunks = _rank_chunks(data)
    if not dynamic:
        return [mb for c in chunks for mb in split_micro_batches(c, R, micro_batch_size=2)]
    count = max(len(split_micro_batches(c, R, max_token_len=TOKEN_BUDGET)) for c in chunks)
    return [
        mb
        for c in chunks
        for mb in split_micro_batches(c, R, max_token_len=TOKEN_BUDGET, agree=lambda _: count)
    ]


def _fsdp2_rank(rank: int, port: int, out_dir: str, model_dir: str) -> None:
    """One FSDP2 rank: update its share of the batch, record the full gradients."""
    torch.set_num_threads(1)
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from verl.utils.distributed import init_distributed

    init_distributed(rank, WORLD, "127.0.0.1", port, device_type="cpu", timeout_s=120)
    fsdp2 = ("actor_rollout_ref.actor.strategy=fsdp2", "critic.strategy=fsdp2")
    res = {}

    def full_grads(engine, sink):
        step = engine.optimizer_step

        def recording_step():
            grads = [p.grad for p in engine.module.parameters()]
            sink.append([g.full_tensor() if isinstance(g, DTensor) else g.clone() for g in grads])
            return step()

        engine.optimizer_step = recording_step

    for mode, dynamic in FSDP2_CASES:
        cfg = _config(model_dir, mode, dynamic, extra=fsdp2)
        module = _actor_module()
        data = _actor_batch(module)
        worker = ActorRolloutRefWorker(
            actor_rollout_ref_spec(cfg, role="actor_rollout"),
            module=module,
            tokenizer=build_tiny_tokenizer(),
            rank=rank,
            world_size=WORLD,
        )
        worker.init_model(total_steps=1)
        captured = []
        full_grads(worker.engine, captured)
        worker.update_actor(_rank_chunks(data)[rank])
        res[("actor", mode, dynamic)] = captured
        res.setdefault("engines", set()).add(type(worker.engine).__name__)
    cfg = _config(model_dir, "token-mean", False, extra=fsdp2)
    torch.manual_seed(0)
    critic = CriticWorker(
        critic_spec(cfg),
        module=CausalLMWithValueHead(build_tiny_model()),
        tokenizer=build_tiny_tokenizer(),
        rank=rank,
        world_size=WORLD,
    )
    critic.init_model(total_steps=1)
    captured = []
    full_grads(critic.engine, captured)
    critic.update_critic(_rank_chunks(_critic_batch())[rank])
    res[("critic", "token-mean", False)] = captured
    res["engines"].add(type(critic.engine).__name__)
    torch.save(res, f"{out_dir}/rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def fsdp2_grads(model_dir, tmp_path_factory, request) -> list[dict]:
    from verl.utils.distributed import find_free_port

    out = tmp_path_factory.mktemp("fsdp2_update")
    run_ranks(_fsdp2_rank, (find_free_port(), str(out), str(model_dir)), WORLD, request)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


@pytest.mark.parametrize("mode, dynamic", FSDP2_CASES)
def test_two_fsdp2_ranks_give_the_reference_actor_gradient(fsdp2_grads, mode, dynamic):
    module = _actor_module()
    data = _actor_batch(module)
    micro = _split_over_ranks(data, dynamic)
    want = _reference_actor_grads(copy.deepcopy(module), micro, mode)
    for rank_res in fsdp2_grads:
        assert rank_res["engines"] == {"FSDP2Engine"}
        (grads,) = rank_res[("actor", mode, dynamic)]
        _assert_grads_equal(grads, want)


def test_two_fsdp2_ranks_give_the_reference_critic_gradient(fsdp2_grads):
    torch.manual_seed(0)
    module = CausalLMWithValueHead(build_tiny_model())
    micro = _split_over_ranks(_critic_batch(), dynamic=False)
    want = _reference_critic_grads(module, micro, "token-mean")
    for rank_res in fsdp2_grads:
        (grads,) = rank_res[("critic", "token-mean", False)]
        _assert_grads_equal(grads, want)
