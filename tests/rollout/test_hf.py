"""The hf backend (transformers generate): same layout and conventions as native, and
token-for-token agreement with native under greedy decoding."""

from __future__ import annotations

import pytest
import torch

from verl.rollout import SamplingParams
from verl.rollout.hf import HFRollout
from verl.rollout.native import NativeRollout

from .test_native import naive_greedy, recomputed_log_probs, responses_as_lists


def test_greedy_native_equals_hf_equals_reference(model, tokenizer, batch):
    params = SamplingParams(do_sample=False, max_new_tokens=12)
    native = NativeRollout(model, tokenizer).generate(batch, params)
    hf = HFRollout(model, tokenizer).generate(batch, params)
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(native.batch[key], hf.batch[key]), key
    torch.testing.assert_close(
        native.batch["rollout_log_probs"], hf.batch["rollout_log_probs"], atol=1e-5, rtol=0
    )
    assert responses_as_lists(hf) == naive_greedy(model, batch, 12, [tokenizer.eos_token_id])


def test_hf_eos_masking_and_pad(model, tokenizer, batch):
    engine = HFRollout(model, tokenizer)
    free = engine.generate(
        batch, SamplingParams(do_sample=False, max_new_tokens=10, stop_token_ids=[])
    )
    assert free.batch["response_mask"].all()
    stop = int(free.batch["responses"][1, 3])
    out = engine.generate(
        batch, SamplingParams(do_sample=False, max_new_tokens=10, stop_token_ids=[stop])
    )
    for row_free, row, mask in zip(
        free.batch["responses"].tolist(),
        out.batch["responses"].tolist(),
        out.batch["response_mask"].tolist(),
    ):
        end = row_free.index(stop) + 1 if stop in row_free else 10
        assert mask == [1] * end + [0] * (10 - end)
        assert row == row_free[:end] + [tokenizer.pad_token_id] * (10 - end)


def test_hf_stop_strings_match_native(model, tokenizer, batch):
    probe = NativeRollout(model, tokenizer).generate(
        batch, SamplingParams(do_sample=False, max_new_tokens=10, stop_token_ids=[])
    )
    stop = tokenizer.decode(probe.batch["responses"][2, :5].tolist())[-2:]
    if not stop.strip():
        pytest.skip("tiny model produced whitespace")
    params = SamplingParams(do_sample=False, max_new_tokens=10, stop_strings=[stop])
    native = NativeRollout(model, tokenizer).generate(batch, params)
    hf = HFRollout(model, tokenizer).generate(batch, params)
    assert torch.equal(native.batch["response_mask"], hf.batch["response_mask"])
    assert torch.equal(native.batch["responses"], hf.batch["responses"])
    assert native.batch["response_mask"][2].sum() <= 5


@pytest.mark.parametrize("kwargs", [{"temperature": 0.8}, {"temperature": 0.8, "top_k": 10}])
def test_hf_sampling_log_probs_and_layout(model, tokenizer, batch, kwargs):
    params = SamplingParams(n=3, max_new_tokens=8, seed=1, **kwargs)
    engine = HFRollout(model, tokenizer)
    out = engine.generate(batch, params)
    rows = len(batch) * 3
    assert out.batch["responses"].shape == (rows, 8)
    assert list(out.non_tensor_batch["uid"]) == [
        u for u in batch.non_tensor_batch["uid"] for _ in range(3)
    ]
    expected = recomputed_log_probs(model, out, params.logprob_temperature)
    mask = out.batch["response_mask"].bool()
    assert torch.allclose(out.batch["rollout_log_probs"][mask], expected[mask], atol=1e-4)
    again = engine.generate(batch, params)
    assert torch.equal(out.batch["responses"], again.batch["responses"])
    assert not any(t.is_inference() for t in out.batch.values())


def test_hf_seed_leaves_global_rng_alone_and_none_follows_it(model, tokenizer, batch):
    engine = HFRollout(model, tokenizer)
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    engine.generate(batch, SamplingParams(max_new_tokens=3, seed=9))
    assert torch.equal(torch.rand(3), expected)
    unseeded = SamplingParams(max_new_tokens=6)
    torch.manual_seed(1)
    a, b = engine.generate(batch, unseeded), engine.generate(batch, unseeded)
    torch.manual_seed(1)
    c = engine.generate(batch, unseeded)
    assert not torch.equal(a.batch["responses"], b.batch["responses"])
    assert torch.equal(a.batch["responses"], c.batch["responses"])


def test_hf_needs_generate():
    with pytest.raises(TypeError, match="generate"):
        HFRollout(torch.nn.Linear(2, 2), eos_token_ids=[1], pad_token_id=0)


@pytest.mark.parametrize("engine_cls", [NativeRollout, HFRollout])
def test_default_stop_is_eos_and_empty_list_disables_it(model, tokenizer, batch, engine_cls):
    eos = tokenizer.eos_token_id

    def always_eos(module, args, logits):
        logits[..., eos] += 100.0
        return logits

    hook = model.lm_head.register_forward_hook(always_eos)
    try:
        engine = engine_cls(model, tokenizer)
        stopped = engine.generate(batch, SamplingParams(do_sample=False, max_new_tokens=5))
        free = engine.generate(
            batch, SamplingParams(do_sample=False, max_new_tokens=5, stop_token_ids=[])
        )
    finally:
        hook.remove()
    assert stopped.batch["response_mask"].sum(-1).tolist() == [1] * len(batch)
    assert bool((stopped.batch["responses"][:, 0] == eos).all())
    assert bool((stopped.batch["responses"][:, 1:] == tokenizer.pad_token_id).all())
    assert bool(free.batch["response_mask"].all())
    assert bool((free.batch["responses"] == eos).all())
