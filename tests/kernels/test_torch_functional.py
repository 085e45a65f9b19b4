"""Tests for verl.kernels.torch_functional: chunked log-probs / entropy and response scoring."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import verl.kernels.packed_model as pm
from verl.kernels.logprob_kernels import LogProbEntropy, entropy_from_logits, logprobs_from_logits
from verl.kernels.torch_functional import compute_response_log_probs

VOCAB = 97


def _reference_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), -1).gather(-1, labels[..., None]).squeeze(-1)


def _reference_entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits.float(), -1)
    return -(logp.exp() * logp).sum(-1)


def test_hand_computed_two_token_vocab():
    # softmax([0, ln 3]) = [1/4, 3/4]
    logits = torch.tensor([[0.0, math.log(3.0)]])
    assert logprobs_from_logits(logits, torch.tensor([1])).item() == pytest.approx(
        math.log(0.75), abs=1e-6
    )
    assert logprobs_from_logits(logits, torch.tensor([0])).item() == pytest.approx(
        math.log(0.25), abs=1e-6
    )
    expected_h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert entropy_from_logits(logits).item() == pytest.approx(expected_h, abs=1e-6)


def test_banned_tokens_with_minus_inf_logits():
    logits = torch.tensor([[0.0, 0.0, -math.inf], [1.0, -math.inf, 0.0]], requires_grad=True)
    entropy = entropy_from_logits(logits)
    log_probs = logprobs_from_logits(logits, torch.tensor([0, 1]))
    assert log_probs[0].item() == pytest.approx(-math.log(2.0))
    assert log_probs[1].item() == -math.inf
    entropy.sum().backward()

    # Reference: the same distributions with the banned column removed.
    live = torch.tensor([[0.0, 0.0], [1.0, 0.0]], requires_grad=True)
    ref = _reference_entropy(live)
    ref.sum().backward()
    assert entropy[0].item() == pytest.approx(math.log(2.0))
    torch.testing.assert_close(entropy, ref)
    torch.testing.assert_close(logits.grad[0, [0, 2]], live.grad[0])
    torch.testing.assert_close(logits.grad[1, [0, 2]], live.grad[1])
    assert logits.grad[0, 2].item() == logits.grad[1, 1].item() == 0.0


@pytest.mark.parametrize("chunk_size", [1, 4, 5, 1000])  # 15 rows: 5 divides, 4 does not
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs_and_entropy_match_log_softmax(chunk_size, dtype):
    torch.manual_seed(0)
    logits = (torch.randn(3, 5, VOCAB) * 4).to(dtype).requires_grad_()
    labels = torch.randint(0, VOCAB, (3, 5))
    weights = torch.randn(3, 5)

    log_probs = logprobs_from_logits(logits, labels, chunk_size=chunk_size)
    entropy = entropy_from_logits(logits, chunk_size=chunk_size)
    assert log_probs.dtype == entropy.dtype == torch.float32
    assert log_probs.shape == entropy.shape == (3, 5)
    torch.testing.assert_close(log_probs, _reference_logprobs(logits, labels), rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, _reference_entropy(logits), rtol=0, atol=1e-5)

    (grad,) = torch.autograd.grad(((log_probs + entropy) * weights).sum(), logits)
    ref = _reference_logprobs(logits, labels) + _reference_entropy(logits)
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), logits)
    assert grad.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(grad.float(), ref_grad.float(), rtol=0, atol=tol)


def test_logprobs_shape_mismatch_raises():
    with pytest.raises(ValueError, match="does not match labels shape"):
        logprobs_from_logits(torch.zeros(2, 3, VOCAB), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk_size=0"):
        logprobs_from_logits(torch.zeros(2, VOCAB), torch.zeros(2, dtype=torch.long), 0)


def _tiny_lm(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    if kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common))
    return LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=True))


def _batch(prompt_len=6, response_len=5):
    """3 sequences: prompts left-padded by 3, 1 and 0 tokens, responses right-padded."""
    torch.manual_seed(1)
    seq = prompt_len + response_len
    input_ids = torch.randint(1, VOCAB, (3, seq))
    attention_mask = torch.ones(3, seq, dtype=torch.long)
    attention_mask[0, :3] = 0
    attention_mask[1, :1] = 0
    attention_mask[2, -2:] = 0  # response padding
    input_ids[attention_mask == 0] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def _naive(model, input_ids, attention_mask, position_ids, response_len, temperature):
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
    ).logits
    logits = logits[:, -response_len - 1 : -1].float() / temperature
    labels = input_ids[:, -response_len:]
    return _reference_logprobs(logits, labels), _reference_entropy(logits)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_response_log_probs_match_full_forward(kind, temperature):
    model = _tiny_lm(kind).eval()
    ids, mask, pos = _batch()
    response_len = 5
    seen_rows = []
    model.lm_head.register_forward_hook(lambda m, inp, out: seen_rows.append(inp[0].shape[0]))

    with torch.no_grad():
        log_probs, entropy = compute_response_log_probs(
            model, ids, mask, pos, response_len, temperature, chunk_size=4, calculate_entropy=True
        )
        seen = list(seen_rows)
        ref_lp, ref_ent = _naive(model, ids, mask, pos, response_len, temperature)

    # The head only saw the 3 * 5 response-predicting positions, in chunks of 4.
    assert seen == [4, 4, 4, 3]
    assert log_probs.shape == entropy.shape == (3, response_len)
    torch.testing.assert_close(log_probs, ref_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, ref_ent, rtol=0, atol=1e-5)


def test_response_log_probs_no_entropy_and_no_grad():
    model = _tiny_lm("qwen2").eval()
    ids, mask, pos = _batch()
    with torch.no_grad():
        log_probs, entropy = compute_response_log_probs(model, ids, mask, pos, 5)
    assert entropy is None
    assert not log_probs.requires_grad


@pytest.mark.parametrize("fallback", [False, True])
def test_response_log_probs_gradients_match_full_forward(fallback, monkeypatch):
    if fallback:  # force the generic model(..., logits_to_keep=...) path
        monkeypatch.setattr(pm, "PLAIN_HEAD_MODEL_TYPES", frozenset())
    model = _tiny_lm("llama").train()
    ids, mask, pos = _batch()
    response_len, temperature = 5, 0.8
    weights = torch.randn(3, response_len)

    log_probs, entropy = compute_response_log_probs(
        model, ids, mask, pos, response_len, temperature, chunk_size=4, calculate_entropy=True
    )
    ((log_probs + 0.1 * entropy) * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    ref_lp, ref_ent = _naive(model, ids, mask, pos, response_len, temperature)
    ((ref_lp + 0.1 * ref_ent) * weights).sum().backward()
    torch.testing.assert_close(log_probs, ref_lp, rtol=0, atol=1e-5)
    for name, param in model.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_response_log_probs_bf16_autocast_close_to_fp32():
    model = _tiny_lm("qwen2").eval()
    ids, mask, pos = _batch()
    with torch.no_grad():
        ref, _ = compute_response_log_probs(model, ids, mask, pos, 5)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low, _ = compute_response_log_probs(model, ids, mask, pos, 5)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, ref, rtol=0, atol=0.1)


def test_response_log_probs_bad_args():
    model = _tiny_lm("qwen2")
    ids, mask, pos = _batch()
    with pytest.raises(ValueError, match="response_len=11"):
        compute_response_log_probs(model, ids, mask, pos, 11)
    with pytest.raises(ValueError, match="temperature=0"):
        compute_response_log_probs(model, ids, mask, pos, 5, temperature=0.0)


def test_shape_multiple_only_for_reduced_precision_on_cpu():
    model = _tiny_lm("qwen2")
    assert pm.shape_multiple(model) == 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert pm.shape_multiple(model) == pm.CPU_REDUCED_PRECISION_SHAPE_MULTIPLE == 64
    assert pm.shape_multiple(model.to(torch.bfloat16)) == 64
    assert pm.shape_multiple(torch.nn.Identity()) == 1  # no weights: nothing to round for


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("share_prefix", [False, True])
def test_shape_rounding_changes_no_value_and_bounds_the_shapes(pack, share_prefix, monkeypatch):
    """Packed widths and the head's chunks rounded up to a multiple (as in a bf16 pass on a
    CPU, forced here in fp32 so the comparison is exact): the same log-probs, entropies and
    gradients, and every matmul sees a token dimension that is a multiple."""
    model = _tiny_lm("qwen2").train()
    ids, mask, pos = _batch()
    mask[1] = mask[0]  # rows 0 and 1 share a prompt (same padding and ids)
    ids[1, :6] = ids[0, :6]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    weights = torch.randn(3, 5)

    def run():
        lp, ent = compute_response_log_probs(
            model, ids, mask, pos, 5, 0.9, chunk_size=4, calculate_entropy=True,
            pack=pack, share_prefix=share_prefix,
        )  # fmt: skip
        ((lp + 0.1 * ent) * weights * mask[:, -5:]).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        return lp, ent, grads

    ref_lp, ref_ent, ref_grads = run()
    monkeypatch.setattr(pm, "shape_multiple", lambda module: 8)
    rows_seen = []
    for layer in (model.lm_head, model.model.layers[0].mlp.up_proj):
        layer.register_forward_hook(lambda m, inp, out: rows_seen.append(inp[0].shape[:-1]))
    lp, ent, grads = run()
    valid = mask[:, -5:].bool()
    torch.testing.assert_close(lp[valid], ref_lp[valid], rtol=0, atol=1e-6)
    torch.testing.assert_close(ent[valid], ref_ent[valid], rtol=0, atol=1e-6)
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-5, atol=1e-7, msg=name)
    head_rows = [s[0] for s in rows_seen if len(s) == 1]
    assert head_rows and all(n % 8 == 0 for n in head_rows)  # chunks of 4 padded to 8
    if pack:  # the packed width (the transformer's token dimension) is rounded too
        widths = [s[-1] for s in rows_seen if len(s) == 2]
        assert widths and all(w % 8 == 0 for w in widths)


@pytest.mark.parametrize("disposable", [False, True])
@pytest.mark.parametrize("uses", ["log_probs", "both", "entropy_metric_only"])
def test_fused_log_prob_entropy_matches_autograd(uses, disposable):
    """_LogProbEntropy (the LM head's scoring: one log-sum-exp and one probability tensor
    for both outputs) against autograd through log_softmax, with -inf logits in one row;
    with ``disposable`` backward writes its gradient into the logits it was given."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 11, generator=gen) * 3
    logits[2, [0, 7]] = float("-inf")  # banned tokens
    labels = torch.tensor([1, 3, 5, 10, 0, 2])
    w_lp = torch.randn(6, generator=gen)
    w_ent = torch.randn(6, generator=gen)

    def loss(lp, ent):
        total = (lp * w_lp).sum()
        return total + (ent * w_ent).sum() if uses == "both" else total

    x_ref = logits.clone().requires_grad_()
    logp = torch.log_softmax(x_ref, -1)
    lp_ref = logp.gather(-1, labels[:, None]).squeeze(-1)
    ent_ref = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)
    (g_ref,) = torch.autograd.grad(loss(lp_ref, ent_ref), x_ref)

    x = logits.clone().requires_grad_()
    given = x * 1.0  # a non-leaf the function may overwrite
    lp, ent = LogProbEntropy.apply(given, labels, uses != "log_probs", disposable)
    if uses == "log_probs":
        assert ent is None
    else:
        assert torch.allclose(ent, ent_ref.detach(), atol=1e-5)
    (g,) = torch.autograd.grad(loss(lp, ent), x)
    assert torch.allclose(lp, lp_ref.detach(), atol=1e-5)
    assert torch.isfinite(g).all()
    assert float((g - g_ref).abs().max()) <= 1e-5
    overwritten = not torch.equal(given.detach(), logits)
    assert overwritten == (disposable and uses == "both")
