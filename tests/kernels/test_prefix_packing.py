"""Shared-prompt packing: each group's prompt is laid out once, and the log-probs,
entropies and actor-loss gradients equal the padded / plainly packed passes (sdpa and
eager attention, fp32)."""

from __future__ import annotations

import logging

import pytest
import torch

import verl.kernels.packed_model as pm
import verl.kernels.torch_functional as tf
from verl.algorithms.losses import actor_loss
from verl.kernels.packing import pack_sequences
from verl.kernels.prefix_packing import has_shared_prompts, pack_shared_prefix, prompt_groups
from verl.models.tiny import build_tiny_model
from verl.registry import POLICY_LOSSES

P, R = 7, 5
TOL = 1e-5
# (prompt, response length) per row: groups of 4, 1, 2 and 3 rows, interleaved; responses
# of length 0 and 1; prompts left-padded to different lengths
ROWS = [(0, 5), (1, 3), (0, 0), (2, 4), (0, 1), (3, 5), (2, 2), (0, 5), (3, 0), (3, 3)]
PROMPT_LENS = [5, 7, 2, 4]


def _batch(rows=ROWS, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 200, (p,), generator=gen) for p in PROMPT_LENS]
    ids = torch.zeros(len(rows), P + R, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (g, r) in enumerate(rows):
        p = PROMPT_LENS[g]
        ids[i, P - p : P] = prompts[g]
        ids[i, P : P + r] = torch.randint(3, 200, (r,), generator=gen)
        mask[i, P - p : P + r] = 1
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
        "response_mask": mask[:, P:].float(),
    }


def test_groups_are_found_by_prompt_ids():
    t = _batch()
    assert prompt_groups(t["input_ids"], t["attention_mask"], R) == [
        [0, 2, 4, 7],
        [1],
        [3, 6],
        [5, 8, 9],
    ]
    assert has_shared_prompts(t["input_ids"], t["attention_mask"], R)
    distinct = _batch(rows=[(0, 3), (1, 2), (2, 5)])
    assert not has_shared_prompts(distinct["input_ids"], distinct["attention_mask"], R)
    # same ids left-padded differently are one prompt; one differing token is another
    ids, mask = t["input_ids"].clone(), t["attention_mask"].clone()
    ids[4, P - 1] += 1
    assert prompt_groups(ids, mask, R)[0] == [0, 2, 7]


def test_layout_has_each_prompt_once_and_responses_continue_its_positions():
    t = _batch()
    packed = pack_shared_prefix(t["input_ids"], t["attention_mask"], R)
    real = sum(PROMPT_LENS) + sum(r for _, r in ROWS)
    assert int((packed.input_ids != 0).sum()) == real  # 18 prompt + 28 response tokens
    flat_ids = packed.input_ids.reshape(-1)
    flat_pos = packed.position_ids.reshape(-1)
    want = t["input_ids"][:, P:][t["response_mask"].bool()]
    assert torch.equal(packed.labels, want)
    # response token j of row i sits at position p_i + j; its predictor at p_i + j - 1
    prompt_lens = [PROMPT_LENS[g] for g, _ in ROWS]
    want_pos = torch.cat([torch.arange(p, p + r) for p, (_, r) in zip(prompt_lens, ROWS)])
    assert torch.equal(flat_pos[packed.response_index], want_pos - 1)
    later = want_pos > torch.tensor([p for p, (_, r) in zip(prompt_lens, ROWS) for _ in range(r)])
    assert torch.equal(flat_ids[packed.response_index[later] + 1], want[later])
    # the first token of every response of a group is predicted by one shared prompt state
    starts = torch.cumsum(torch.tensor([0] + [r for _, r in ROWS[:-1]]), 0)
    predictor = {}
    for (g, r), start in zip(ROWS, starts.tolist(), strict=True):
        if r:
            predictor.setdefault(g, set()).add(int(packed.response_index[start]))
    assert all(len(v) == 1 for v in predictor.values()) and len(predictor) == 4
    mask = packed.attention_mask
    bins, width = packed.input_ids.shape
    assert mask.shape == (bins, width, width)
    assert bool(mask.diagonal(dim1=1, dim2=2).all())  # every token sees itself
    assert not bool(mask.triu(1).any())  # causal
    with pytest.raises(ValueError, match="no prompt token"):
        bad = t["attention_mask"].clone()
        bad[0, :P] = 0
        pack_shared_prefix(t["input_ids"], bad, R)


def _passes(model, t, modes, loss_mask=None, **pack_kwargs):
    """log-probs, entropies and actor-loss gradients per mode (pad, pack, share)."""
    m = t["response_mask"] if loss_mask is None else loss_mask
    adv = torch.linspace(-1.0, 1.0, m.numel()).view(m.shape)
    vanilla = POLICY_LOSSES.entry("vanilla").target
    out = {}
    for mode in modes:
        model.zero_grad(set_to_none=True)
        lp, ent = tf.compute_response_log_probs(
            model,
            t["input_ids"],
            t["attention_mask"],
            t["position_ids"],
            response_len=R,
            temperature=0.7,
            chunk_size=3,
            calculate_entropy=True,
            pack=mode != "pad",
            share_prefix=mode == "share",
        )
        loss, _ = actor_loss(
            lp,
            lp.detach() - 0.05,
            adv,
            m,
            policy_loss_fn=vanilla,
            entropy=ent,
            entropy_coeff=0.01,
        )
        loss.backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        out[mode] = (lp.detach() * m, ent.detach() * m, grads)
    return out


def _assert_same(a, b):
    (lp0, e0, g0), (lp1, e1, g1) = a, b
    assert float((lp0 - lp1).abs().max()) <= TOL
    assert float((e0 - e1).abs().max()) <= TOL
    assert float(g0.abs().max()) > 1e-3  # a gradient to compare
    assert float((g0 - g1).abs().max() / g0.abs().max()) <= TOL


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_shared_equals_padded_and_packed(attn):
    torch.manual_seed(0)
    model = build_tiny_model()
    model.config._attn_implementation = attn
    out = _passes(model, _batch(), ("pad", "pack", "share"))
    _assert_same(out["pad"], out["share"])
    _assert_same(out["pack"], out["share"])


def test_multi_turn_masked_tokens_inside_responses():
    """Tool output inside a response: real tokens (attended) whose loss mask is 0."""
    torch.manual_seed(1)
    model = build_tiny_model()
    t = _batch()
    loss_mask = t["response_mask"].clone()
    loss_mask[0, 1:3] = 0
    loss_mask[7, 2] = 0
    loss_mask[9, 0] = 0
    out = _passes(model, t, ("pad", "share"), loss_mask=loss_mask)
    _assert_same(out["pad"], out["share"])


def test_no_repeated_prompts_and_cut_groups(monkeypatch):
    torch.manual_seed(2)
    model = build_tiny_model()
    distinct = _batch(rows=[(0, 3), (1, 0), (2, 5), (3, 1)])
    out = _passes(model, distinct, ("pad", "share"))
    _assert_same(out["pad"], out["share"])
    # groups cut into several units (each with its own prompt copy) still agree
    t = _batch()
    packed = pack_shared_prefix(t["input_ids"], t["attention_mask"], R, max_unit=9)
    assert int((packed.input_ids != 0).sum()) > sum(PROMPT_LENS) + sum(r for _, r in ROWS)
    real_pack = pm.pack_shared_prefix
    monkeypatch.setattr(
        pm, "pack_shared_prefix", lambda *a, **k: real_pack(*a, **k, max_unit=9, capacity=20)
    )
    out = _passes(model, t, ("pad", "share"))
    _assert_same(out["pad"], out["share"])


def test_attention_without_4d_masks_falls_back_to_plain_packing(monkeypatch, caplog):
    torch.manual_seed(3)
    model = build_tiny_model()
    t = _batch()
    monkeypatch.setattr(pm, "_MASK_KINDS", {"eager": "additive"})  # sdpa "rejects" 4D masks
    monkeypatch.setattr(pm, "_fallback_logged", set())
    calls = []
    monkeypatch.setattr(
        pm, "pack_sequences", lambda *a, **k: calls.append(1) or pack_sequences(*a, **k)
    )
    with caplog.at_level(logging.WARNING, logger=pm.__name__):
        out = _passes(model, t, ("pad", "share", "share"))
    assert len(calls) == 2  # both shared passes packed plainly
    warnings = [r for r in caplog.records if "takes no custom 4D attention mask" in r.message]
    assert len(warnings) == 1  # logged once
    _assert_same(out["pad"], out["share"])


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_critic_values_and_gradients_equal_padded(attn):
    from types import SimpleNamespace

    from verl.models import CausalLMWithValueHead
    from verl.protocol import DataProto
    from verl.workers.critic import _response_values

    torch.manual_seed(4)
    backbone = build_tiny_model()
    backbone.config._attn_implementation = attn
    critic = CausalLMWithValueHead(backbone, init_seed=1)
    with torch.no_grad():
        critic.value_head.weight.normal_()  # values that differ by position
    t = _batch()
    mb = DataProto.from_dict(tensors=t)
    m = t["response_mask"]
    out = {}
    for pack, share in ((False, False), (True, False), (True, True)):
        critic.zero_grad(set_to_none=True)
        cfg = SimpleNamespace(pack_sequences=pack, share_prompt_prefix=share)
        values = _response_values(critic, mb, R, cfg) * m
        (values * torch.linspace(-1, 1, m.numel()).view(m.shape)).sum().backward()
        grads = torch.cat([p.grad.reshape(-1) for p in critic.parameters()])
        out[(pack, share)] = (values.detach(), grads)
    (v0, g0) = out[(False, False)]
    assert float(v0.abs().max()) > 1e-2
    for key in ((True, False), (True, True)):
        v, g = out[key]
        assert float((v - v0).abs().max()) <= TOL, key
        assert float((g - g0).abs().max() / g0.abs().max()) <= TOL, key
