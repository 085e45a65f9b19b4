"""The native engine's lean forward in fp32 (``verl.rollout.lean_forward``; for a plain Llama
/ Qwen2 outside autocast, what precision ``auto`` runs on a CPU without bf16 instructions,
with ``NativeRollout(lean_fp32=True)``): the same greedy and seeded tokens as the HF eager forward and log-probs
within LOGP_ATOL, lock-step and continuous (rows at different positions), biases, the
current weights read at every call and again after a mid-call weight swap; the HF forward
where it does not apply. Runs on any CPU (oneDNN's fp32 kernels)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaForCausalLM

from verl.kernels import packed_linear
from verl.models.tiny import build_tiny_model
from verl.rollout import lean_forward
from verl.rollout.lean_forward import LeanForward, unsupported
from verl.rollout.native import NativeRollout
from verl.rollout.partial import WeightMailbox, weight_mailbox

from .lean_cases import GREEDY, SEEDED, assert_same_rollout
from .token_versions import varied

pytestmark = pytest.mark.skipif(
    not packed_linear.fp32_available(torch.device("cpu")), reason="needs oneDNN in this torch"
)

# fp32 matmuls over fused weights (F.linear, or oneDNN's over packed ones) vs F.linear over
# separate ones, and the inlined decode attention vs SDPA: the last bits of fp32. Measured
# on these models at most 6.7e-6 with either kind (log-probs of a few nats); the bound
# leaves room for other CPUs' kernels.
LOGP_ATOL = 5e-5


@pytest.fixture(scope="module")
def llama(tokenizer):
    return varied(build_tiny_model("llama", tokenizer=tokenizer, hidden_size=64, num_layers=2))


@pytest.fixture(params=["plain", "packed"])
def kind(request, monkeypatch):
    """The fp32 forward's matmuls: ``F.linear`` over the weights (few decode rows) or over
    weights packed for oneDNN (from ``FP32_PACK_ROWS`` rows on, here from 1)."""
    monkeypatch.setattr(lean_forward, "FP32_PACK_ROWS", 1 if request.param == "packed" else 10**6)
    return request.param


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("continuous", [False, True], ids=["lockstep", "continuous"])
def test_fp32_lean_equals_the_hf_forward(
    model, llama, tokenizer, batch, arch, params, continuous, kind, monkeypatch
):
    """Prompts of different lengths; with 2 * n slots for 4 * n rows the continuous loop
    decodes rows of two prompts at different positions in one step. Every decode step takes
    the inlined decode, in fp32 (no rounding to bf16: the cache holds fp32 keys)."""
    inlined = []
    real = LeanForward._decode
    monkeypatch.setattr(
        LeanForward, "_decode", lambda *a: inlined.append((a[0].dtype, a[0].plain)) or real(*a)
    )
    net = model if arch == "qwen2" else llama
    slots = 2 * params.n if continuous else None
    lean = NativeRollout(net, tokenizer, max_num_seqs=slots, lean_fp32=True)
    hf = NativeRollout(net, tokenizer, max_num_seqs=slots)  # the default: the HF forward
    a, b = lean.generate(batch, params), hf.generate(batch, params)
    assert (lean.last_stats["lean"], hf.last_stats["lean"]) == (1.0, 0.0)
    steps = int(lean.last_stats["decode_steps"])
    assert inlined == [(torch.float32, kind == "plain")] * steps and steps
    if slots:
        assert lean.last_stats["continuous"] == 1.0 and lean.last_stats["admissions"] > 1
    assert a.batch["rollout_log_probs"].dtype == torch.float32
    assert_same_rollout(a, b, LOGP_ATOL)
    # no packing at all: the HF forward too
    plain = NativeRollout(net, tokenizer, max_num_seqs=slots, pack_weights=False, lean_fp32=True)
    assert_same_rollout(a, plain.generate(batch, params), LOGP_ATOL)
    assert plain.last_stats["lean"] == 0.0


def test_fp32_biases_and_head_dim(llama, tokenizer, batch, kind):
    """Biased q/k/v/o and MLP projections, head_dim != hidden / heads (32 vs 16)."""
    config = type(llama.config).from_dict(llama.config.to_dict())
    config.attention_bias, config.mlp_bias, config.head_dim = True, True, 32
    torch.manual_seed(0)
    net = varied(LlamaForCausalLM(config))
    for slots in (None, 4):
        lean = NativeRollout(net, tokenizer, max_num_seqs=slots, lean_fp32=True)
        a = lean.generate(batch, GREEDY)
        assert lean.last_stats["lean"] == 1.0
        hf = NativeRollout(net, tokenizer, max_num_seqs=slots, lean_forward=False)
        assert_same_rollout(a, hf.generate(batch, GREEDY), LOGP_ATOL)


def test_fp32_every_call_reads_the_current_weights(model, tokenizer, batch, kind):
    """A weight changed between calls without a version bump (a write through ``.data``)
    is what the next call samples from; the packed weights are dropped after the call."""
    lean = NativeRollout(model, tokenizer, lean_fp32=True)
    hf = NativeRollout(model, tokenizer, lean_forward=False)
    first = lean.generate(batch, GREEDY)
    weight = model.model.layers[0].mlp.up_proj.weight
    before = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.data.mul_(-1.0)
        a = lean.generate(batch, GREEDY)
        assert_same_rollout(a, hf.generate(batch, GREEDY), LOGP_ATOL)
        assert lean.last_stats["lean"] == 1.0
        assert not torch.equal(a.batch["responses"], first.batch["responses"])
    finally:
        with torch.no_grad():
            weight.copy_(before)
    assert lean._lean is None


def _swapped_run(model, tokenizer, batch, lean: bool):
    """A greedy call through 4 slots whose scripted trainer posts new weights once a row
    samples its 5th token (the engine loads them in place between decode steps)."""
    module = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(9)
    new = {
        k: v + 0.2 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
        for k, v in model.state_dict().items()
    }
    mailbox = WeightMailbox("resume")
    mailbox.held = 0

    def trainer(logits, rows, steps):
        if mailbox.posted_version is None and int(steps.max()) >= 4:
            mailbox.post(new, 1)
        return logits

    engine = NativeRollout(
        module, tokenizer, max_num_seqs=4, logits_processor=trainer, lean_fp32=lean
    )
    with weight_mailbox(mailbox):
        out = engine.generate(batch, GREEDY)
    assert engine.last_stats["weight_swaps"] == 1.0
    return out, engine


def test_fp32_a_mid_call_weight_swap_packs_again(model, tokenizer, batch, kind, monkeypatch):
    """Weights loaded mid-call (partial rollouts): the next forward packs them again, so the
    tokens after the swap are those of the HF forward over the new weights."""
    packs = []
    real = LeanForward._pack
    monkeypatch.setattr(LeanForward, "_pack", lambda self: packs.append(1) or real(self))
    a, lean = _swapped_run(model, tokenizer, batch, lean=True)
    assert lean.last_stats["lean"] == 1.0 and len(packs) == 2
    b, hf = _swapped_run(model, tokenizer, batch, lean=False)
    assert hf.last_stats["lean"] == 0.0
    assert_same_rollout(a, b, LOGP_ATOL)


def test_fp32_what_it_does_not_cover(model, tokenizer, batch):
    """The default (``lean_fp32=False``), bf16 weights outside autocast, eager attention,
    ``lean_forward=False``: the HF forward."""
    engine = NativeRollout(model, tokenizer)
    engine.generate(batch, GREEDY)
    assert engine.last_stats["lean"] == 0.0
    engine = NativeRollout(model, tokenizer, lean_forward=False, lean_fp32=True)
    engine.generate(batch, GREEDY)
    assert engine.last_stats["lean"] == 0.0
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    assert unsupported(bf16) is None  # the bf16 autocast forward would take it
    assert "is torch.bfloat16" in unsupported(bf16, torch.float32)
    engine = NativeRollout(bf16, tokenizer, lean_fp32=True)
    engine.generate(batch, GREEDY)
    assert engine.last_stats["lean"] == 0.0
    eager = build_tiny_model("qwen2", tokenizer=tokenizer, hidden_size=64, num_layers=1)
    eager.config._attn_implementation = "eager"
    engine = NativeRollout(eager, tokenizer, lean_fp32=True)
    engine.generate(batch, GREEDY)
    assert engine.last_stats["lean"] == 0.0
