"""Decode-step attention (verl.kernels.decode_attention): in fp32 it equals transformers' sdpa
attention (which repeats the key heads) for every mask form; under bf16 autocast it equals
the training pass's small-block attention on the same tokens; a float32 cache of rounded
values gives the same result as converting a bf16 one; fp32 calls and calls it does not
implement are left to transformers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from verl.kernels import block_attention as ba
from verl.kernels.decode_attention import applies, decode_attention

ROWS, HEADS, LENGTH, DIM = 5, 4, 11, 8


def _inputs(kv_heads: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(ROWS, HEADS, 1, DIM, generator=gen)
    k = torch.randn(ROWS, kv_heads, LENGTH, DIM, generator=gen)
    v = torch.randn(ROWS, kv_heads, LENGTH, DIM, generator=gen)
    allowed = torch.rand(ROWS, 1, 1, LENGTH, generator=gen) > 0.3
    allowed[..., -1] = True  # the row's own new token
    return q, k, v, allowed


def _masks(allowed: torch.Tensor):
    additive = torch.zeros(allowed.shape).masked_fill_(~allowed, torch.finfo(torch.float32).min)
    per_head = allowed.expand(ROWS, HEADS, 1, LENGTH).clone()
    per_head[:, 1, 0, 0] = False  # heads differ
    per_head[:, 1, 0, -1] = True
    return {"bool": allowed, "none": None, "additive": additive, "per_head": per_head}


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
@pytest.mark.parametrize("mask_kind", ["bool", "none", "additive", "per_head"])
def test_fp32_equals_transformers_sdpa(kv_heads, mask_kind):
    q, k, v, allowed = _inputs(kv_heads)
    mask = _masks(allowed)[mask_kind]
    module = SimpleNamespace(num_key_value_groups=HEADS // kv_heads, is_causal=True)
    expected, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.3)
    got = decode_attention(q, k, v, mask, scaling=0.3)
    assert got.shape == expected.shape == (ROWS, 1, HEADS, DIM)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_bf16_autocast_equals_the_training_block_attention(kv_heads):
    """What the update's block attention (_SmallAttention, bf16 on a CPU) computes for the
    same query against the same keys, to one bf16 rounding of the output."""
    q, k, v, allowed = _inputs(kv_heads, seed=1)
    group = HEADS // kv_heads
    low = torch.bfloat16
    expected = ba._SmallAttention.apply(
        q.to(low).reshape(ROWS, kv_heads, group, DIM),
        k.to(low),
        v.to(low),
        allowed.expand(ROWS, kv_heads, group, LENGTH),
        DIM**-0.5,
        low,
    ).reshape(ROWS, 1, HEADS, DIM)
    with torch.autocast("cpu", dtype=low):
        got = decode_attention(q, k, v, allowed)
    assert got.dtype == low
    # one bf16 step at the outputs' magnitude (|v| ~ 1): the matmuls sum in another order
    torch.testing.assert_close(got.float(), expected.float(), atol=2**-8, rtol=2**-7)
    # and bf16 SDPA (what transformers computes under autocast) is as close to fp32 as it
    exact = decode_attention(q, k, v, allowed)
    with torch.autocast("cpu", dtype=low):
        module = SimpleNamespace(num_key_value_groups=group, is_causal=True)
        sdpa, _ = sdpa_attention_forward(module, q, k, v, allowed)
    ours = (got.float() - exact).abs().max()
    theirs = (sdpa.float() - exact).abs().max()
    assert ours <= 2 * theirs


def test_float32_cache_of_rounded_values_equals_a_bf16_cache():
    q, k, v, allowed = _inputs(2, seed=2)
    low = torch.bfloat16
    with torch.autocast("cpu", dtype=low):
        from_low = decode_attention(q, k.to(low), v.to(low), allowed)
        from_rounded = decode_attention(q, k.to(low).float(), v.to(low).float(), allowed)
    assert torch.equal(from_low, from_rounded)


def test_applies_only_to_what_it_implements():
    q, k, _, allowed = _inputs(2)
    ok = {"dropout": 0.0, "scaling": None}
    assert not applies(q, k, allowed, ok)  # fp32: transformers' function keeps the call
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert applies(q, k, allowed, ok)
        assert not applies(q.expand(ROWS, HEADS, 2, DIM), k, allowed, ok)  # two query positions
        assert not applies(q, k, allowed, {"dropout": 0.1})
        for name in ("sliding_window", "softcap", "position_bias"):
            assert not applies(q, k, allowed, {name: 4})
        assert not applies(q, k, allowed[..., :-1], ok)  # mask width != keys
        assert not applies(q, k[:, :1].expand(ROWS, 3, LENGTH, DIM), allowed, ok)  # 4 % 3
        assert not applies(q.to("meta"), k.to("meta"), None, ok)  # not a CPU tensor


def test_registered_sdpa_routes_decode_calls_only_when_asked(monkeypatch):
    """The "sdpa" wrapper computes decode attention for calls that carry the flag and
    that it applies to; other calls reach transformers' function unchanged."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from verl.kernels import decode_attention as da

    ba.install()
    calls = []
    real = da.decode_attention
    monkeypatch.setattr(da, "decode_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    q, k, v, allowed = _inputs(2)
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True)
    fp32_flagged, _ = sdpa(module, q, k, v, allowed, dropout=0.0, verl_decode_attention=True)
    assert not calls  # fp32 stays on transformers' function, bit for bit
    assert torch.equal(fp32_flagged, sdpa_attention_forward(module, q, k, v, allowed)[0])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain, _ = sdpa(module, q, k, v, allowed, dropout=0.0)
        flagged, _ = sdpa(module, q, k, v, allowed, dropout=0.0, verl_decode_attention=True)
        assert len(calls) == 1
        sdpa(module, q, k, v, allowed, dropout=0.0, sliding_window=3, verl_decode_attention=True)
        assert len(calls) == 1
    torch.testing.assert_close(plain.float(), flagged.float(), atol=2e-2, rtol=0)
