"""Block attention (verl.kernels.block_attention): a packed batch attended block by block
equals the same batch under its full (bins, width, width) mask, in fp32 to 1e-5 and under
bf16 autocast within bf16 rounding; a model whose attention bypasses the plan is caught."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import verl.kernels.packed_model as pm
import verl.kernels.torch_functional as tf
from verl.kernels import block_attention as ba
from verl.models.tiny import build_tiny_model

# two bins of width 40: a shared-prompt unit (prompt 7, responses 5, 9 and 1), a plain
# sequence of 12, two plain sequences of 6 (a uniform causal group); filler after each
BINS, WIDTH = 2, 40
BLOCKS = [
    (0, 7, 0, 0),
    (7, 5, 0, 7),
    (12, 9, 0, 7),
    (21, 1, 0, 7),
    (22, 12, 0, 0),
    (40, 6, 0, 0),
    (46, 6, 0, 0),
    (52, 3, 0, 0),
]


def _full_mask(blocks, bins, width):
    """(bins, width, width) True where a query may attend a key; filler attends itself."""
    allowed = torch.zeros(bins * width, bins * width, dtype=torch.bool)
    covered = torch.zeros(bins * width, dtype=torch.bool)
    for q0, lq, p0, lp in blocks:
        for i in range(lq):
            allowed[q0 + i, q0 : q0 + i + 1] = True
            allowed[q0 + i, p0 : p0 + lp] = True
        covered[q0 : q0 + lq] = True
    for j in (~covered).nonzero().flatten().tolist():
        allowed[j, j] = True
    per_bin = [
        allowed[b * width : (b + 1) * width, b * width : (b + 1) * width] for b in range(bins)
    ]
    return torch.stack(per_bin), covered.view(bins, width)


def _qkv(heads=4, kv_heads=2, dim=16, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    shapes = [(BINS, heads, WIDTH, dim), (BINS, kv_heads, WIDTH, dim), (BINS, kv_heads, WIDTH, dim)]
    return [torch.randn(s, generator=gen, dtype=dtype).requires_grad_() for s in shapes]


def _masked(q, k, v, mask, scale):
    rep = q.shape[1] // k.shape[1]
    out = F.scaled_dot_product_attention(
        q,
        k.repeat_interleave(rep, 1),
        v.repeat_interleave(rep, 1),
        attn_mask=mask[:, None],
        scale=scale,
    )
    return out.transpose(1, 2)  # (bins, width, heads, dim)


def _grads(out, covered, q, k, v):
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(out.shape, generator=gen) * covered[:, :, None, None]
    for t in (q, k, v):
        t.grad = None
    (out.float() * weight).sum().backward()
    return [t.grad.clone() for t in (q, k, v)]


def test_plan_groups_cover_every_query_once():
    plan = ba.plan_block_attention(BLOCKS, BINS * WIDTH)
    dest = torch.cat([g.dest for g in plan.groups])
    expected = sorted(q0 + i for q0, lq, _, _ in BLOCKS for i in range(lq))
    assert sorted(dest.tolist()) == expected
    assert plan.pairs < BINS * WIDTH * WIDTH
    # plain sequences of one length: one group, SDPA's own causal mask, no padding
    (group,) = ba.plan_block_attention([(0, 6, 0, 0), (6, 6, 0, 0), (40, 6, 0, 0)], 80).groups
    assert group.mask is None and group.shape == (3, 6, 6)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_fp32_equals_full_mask(kv_heads):
    q, k, v = _qkv(kv_heads=kv_heads)
    mask, covered = _full_mask(BLOCKS, BINS, WIDTH)
    plan = ba.plan_block_attention(BLOCKS, BINS * WIDTH)
    ref = _masked(q, k, v, mask, 0.3)
    out = ba.block_attention(q, k, v, plan, scaling=0.3)
    real = covered[:, :, None, None]
    assert float(((out - ref) * real).detach().abs().max()) <= 1e-5
    assert float((out * ~real).detach().abs().max()) == 0.0  # filler outputs are zero
    g_ref = _grads(ref, covered, q, k, v)
    g_out = _grads(out, covered, q, k, v)
    for a, b in zip(g_ref, g_out, strict=True):
        assert float(a.abs().max()) > 1e-3
        assert float((a - b).abs().max()) <= 1e-5
    assert plan.calls == 1


def test_bf16_autocast_matches_fp32_within_bf16_rounding():
    """Small bf16 groups run _SmallAttention (fp32 scores, bf16 matmuls): its error against
    the fp32 result is of the order of SDPA's own in bf16."""
    q, k, v = _qkv(dim=32, seed=1)
    mask, covered = _full_mask(BLOCKS, BINS, WIDTH)
    plan = ba.plan_block_attention(BLOCKS, BINS * WIDTH)
    ref = _masked(q, k, v, mask, None)
    g_ref = _grads(ref, covered, q, k, v)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = ba.block_attention(q, k, v, plan)
        sdpa_bf16 = _masked(q, k, v, mask, None)
    assert out.dtype == torch.bfloat16
    g_out = _grads(out, covered, q, k, v)
    real = covered[:, :, None, None]
    err = float(((out.float() - ref) * real).detach().abs().max())
    sdpa_err = float(((sdpa_bf16.float() - ref) * real).detach().abs().max())
    assert err <= 2 * sdpa_err + 1e-3, (err, sdpa_err)
    for a, b in zip(g_ref, g_out, strict=True):
        assert float((a - b).abs().max() / a.abs().max()) <= 2e-2


def test_small_attention_gradients_are_exact_in_fp32():
    """_SmallAttention's hand-written backward (probabilities recomputed from the saved
    log-sum-exp, key heads shared by stacked query heads), run in fp32, against autograd
    through SDPA."""
    gen = torch.Generator().manual_seed(2)
    b, kv_heads, rep, lq, lk, dim = 3, 2, 3, 5, 9, 8
    q = torch.randn(b, kv_heads * rep, lq, dim, generator=gen, requires_grad=True)
    k = torch.randn(b, kv_heads, lk, dim, generator=gen, requires_grad=True)
    v = torch.randn(b, kv_heads, lk, dim, generator=gen, requires_grad=True)
    mask = torch.rand(b, 1, lq, lk, generator=gen) < 0.6
    mask[..., 0] = True  # every query sees a key
    weight = torch.randn(b, kv_heads * rep, lq, dim, generator=gen)
    ref = _masked(q, k, v, mask[:, 0], 0.4).transpose(1, 2)
    g_ref = torch.autograd.grad((ref * weight).sum(), (q, k, v))
    stacked = q.reshape(b, kv_heads, rep * lq, dim)
    out = ba._SmallAttention.apply(
        stacked, k, v, mask.repeat(1, 1, rep, 1), 0.4, torch.float32
    ).view(b, kv_heads * rep, lq, dim)
    g_out = torch.autograd.grad((out * weight).sum(), (q, k, v))
    assert float((out - ref).detach().abs().max()) <= 1e-5
    for a, c in zip(g_ref, g_out, strict=True):
        assert float((a - c).abs().max()) <= 1e-5


def test_bad_blocks_are_refused():
    with pytest.raises(ValueError, match="outside"):
        ba.plan_block_attention([(30, 20, 0, 0)], 40)
    with pytest.raises(ValueError, match="prefix must end before"):
        ba.plan_block_attention([(5, 3, 4, 4)], 40)


@torch.no_grad()  # gradients: tests/kernels/test_prefix_packing.py (sdpa packs by blocks)
def _logprobs(model, t, share):
    return tf.compute_response_log_probs(
        model,
        t["input_ids"],
        t["attention_mask"],
        t["position_ids"],
        response_len=t["response_len"],
        calculate_entropy=True,
        pack=True,
        share_prefix=share,
    )


def _grouped_batch():
    gen = torch.Generator().manual_seed(3)
    rows, prompt, response = 8, 6, 7
    ids = torch.randint(3, 200, (rows, prompt + response), generator=gen)
    ids[:, :prompt] = ids[::4, :prompt].repeat_interleave(4, 0)  # two groups of 4 rows
    mask = torch.ones_like(ids)
    mask[1, prompt + 3 :] = 0
    mask[6, prompt + 1 :] = 0
    mask[4:, :2] = 0  # the second group's prompt is shorter (left padding)
    return {
        "input_ids": ids * mask,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
        "response_len": response,
    }


@pytest.mark.parametrize("share", [False, True])
def test_model_passes_use_the_plan_and_match_masked(monkeypatch, share):
    torch.manual_seed(0)
    model = build_tiny_model()
    model.config._attn_implementation = "sdpa"
    t = _grouped_batch()
    plans = []
    real_plan = ba.plan_block_attention
    monkeypatch.setattr(
        ba, "plan_block_attention", lambda *a, **k: plans.append(real_plan(*a, **k)) or plans[-1]
    )
    lp_block, ent_block = _logprobs(model, t, share)
    assert len(plans) == 1 and plans[0].calls == model.config.num_hidden_layers
    monkeypatch.setattr(pm, "block_attention_layers", lambda model: 0)
    lp_mask, ent_mask = _logprobs(model, t, share)
    assert len(plans) == 1  # the masked pass built no plan
    assert float((lp_block - lp_mask).abs().max()) <= 1e-5
    assert float((ent_block - ent_mask).abs().max()) <= 1e-5


def test_attention_that_bypasses_the_plan_is_caught(monkeypatch):
    from transformers.modeling_utils import AttentionInterface

    torch.manual_seed(0)
    model = build_tiny_model()
    model.config._attn_implementation = "sdpa"
    ba.install()
    original = ba._installed["sdpa"]
    monkeypatch.setitem(AttentionInterface._global_mapping, "sdpa", original)
    with pytest.raises(RuntimeError, match="used the packed batch's block plan"):
        _logprobs(model, _grouped_batch(), share=True)


def test_models_without_block_attention_use_the_mask():
    model = build_tiny_model()
    model.config._attn_implementation = "eager"
    assert pm.block_attention_layers(model) == 0
    model.config._attn_implementation = "sdpa"
    assert pm.block_attention_layers(model) == model.config.num_hidden_layers
    model.config.sliding_window = 16
    model.config.use_sliding_window = True
    assert pm.block_attention_layers(model) == 0
