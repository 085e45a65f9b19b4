"""Weight-only int4: packing, layer math, accuracy against fp32 and fp8, memory, refusals."""

from __future__ import annotations

import copy

import pytest
import torch

from verl.models import build_tiny_model, build_tiny_tokenizer
from verl.models.fp8 import quantize_model_fp8_
from verl.models.int4 import Int4Linear, is_int4_model, quantize_model_int4_

# Max |log-prob difference| to fp32 over a 4 x 24 batch of the tiny random model (hidden 64,
# groups of 32). Measured: fp8 0.023, int4 0.077 (16 levels per group against e4m3's 3
# mantissa bits).
INT4_LOGPROB_TOL = 0.2
# Max |score difference| of the tiny random reward model over 8 sequences, relative to the
# spread of its scores. Measured: int4 0.074, fp8 0.010.
INT4_SCORE_TOL = 0.2


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def _log_probs(model, ids):
    with torch.no_grad():
        return torch.log_softmax(model(ids).logits.float(), dim=-1)


def _nbytes(module):
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


def test_packing_round_trips_every_level():
    # weights on the group's 16 levels (low = -4, step = 0.5) come back exactly
    q = torch.arange(16).repeat(2)[None].float()  # 0..15 twice: (1, 32)
    linear = torch.nn.Linear(32, 1, bias=False).requires_grad_(False)
    with torch.no_grad():
        linear.weight.copy_(q * 0.5 - 4.0)
    layer = Int4Linear.from_linear(linear, group_size=16)
    assert layer.packed.dtype == torch.uint8 and layer.packed.shape == (1, 16)
    assert layer.levels().tolist() == q.to(torch.uint8).tolist()
    assert layer.step.tolist() == [[0.5, 0.5]] and layer.low.tolist() == [[-4.0, -4.0]]
    assert torch.equal(layer.dequantized_weight(), linear.weight)


def test_layer_rounds_within_half_a_step_per_group():
    linear = torch.nn.Linear(64, 3, bias=True)
    with torch.no_grad():
        linear.weight[1, :32] *= 1000.0  # an outlier group: the row's other group keeps its step
    layer = Int4Linear.from_linear(linear.requires_grad_(False), group_size=32)
    assert layer.step.shape == (3, 2) and layer.step.dtype == torch.float16
    err = (layer.dequantized_weight() - linear.weight).abs().reshape(3, 2, 32)
    # half a step, plus the fp16 rounding of the group's minimum
    bound = layer.step.float()[..., None] / 2 + layer.low.float().abs()[..., None] * 2**-10
    assert bool((err <= bound).all())
    assert layer.step[1, 1] < layer.step[1, 0] / 100  # the group without the outlier
    x = torch.randn(5, 64)
    torch.testing.assert_close(layer(x), x @ layer.dequantized_weight().T + linear.bias)
    assert layer(x.bfloat16()).dtype == torch.bfloat16
    constant = torch.nn.Linear(32, 1, bias=False).requires_grad_(False)
    torch.nn.init.constant_(constant.weight, 0.25)  # max == min: no division by a zero step
    assert torch.equal(Int4Linear.from_linear(constant).dequantized_weight(), constant.weight)


def test_int4_model_log_probs_close_to_fp32(tok):
    model = build_tiny_model(tokenizer=tok, hidden_size=64, num_layers=2).requires_grad_(False)
    ids = torch.randint(0, len(tok), (4, 24), generator=torch.Generator().manual_seed(0))
    ref = _log_probs(model, ids)
    int4 = _log_probs(quantize_model_int4_(copy.deepcopy(model)), ids)
    fp8 = _log_probs(quantize_model_fp8_(copy.deepcopy(model)), ids)
    err_int4 = float((int4 - ref).abs().max())
    err_fp8 = float((fp8 - ref).abs().max())
    assert 0 < err_int4 < INT4_LOGPROB_TOL
    assert err_fp8 < err_int4  # fewer levels, larger error: int4 is the coarser format


def test_reward_model_scores_close_to_fp32(tok):
    rm = build_tiny_model(tokenizer=tok, hidden_size=64, num_layers=2, reward_head=True)
    rm.requires_grad_(False)
    ids = torch.randint(0, len(tok), (8, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = rm(ids).logits[:, -1].float()
        q = quantize_model_int4_(copy.deepcopy(rm))
        got = q(ids).logits[:, -1].float()
    spread = float(ref.max() - ref.min())
    assert float((got - ref).abs().max()) < INT4_SCORE_TOL * spread
    assert isinstance(q.score, torch.nn.Linear)  # the score head is kept in full precision


def test_linear_weights_shrink_about_six_times(tok):
    model = build_tiny_model(tokenizer=tok, hidden_size=64, num_layers=2).requires_grad_(False)
    head = model.lm_head.weight
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    fp32_linear = sum(m.weight.numel() * 4 for m in linears if m.weight is not head)
    before = _nbytes(model)
    quantize_model_int4_(model)
    saved = before - _nbytes(model)
    # 4 bytes -> 0.5 byte + 2 fp16 per 32 weights = 0.625 byte: 84.4% saved
    assert 0.84 * fp32_linear < saved < 0.845 * fp32_linear
    assert is_int4_model(model) and model.lm_head.weight is head


def test_refusals(tok):
    model = build_tiny_model(tokenizer=tok, hidden_size=32, num_layers=1)
    with pytest.raises(ValueError, match=r"int4 weight-only.*requires_grad_\(False\)"):
        quantize_model_int4_(model)
    with pytest.raises(ValueError, match="group_size must be an even number"):
        quantize_model_int4_(model.requires_grad_(False), group_size=3)
    with pytest.raises(ValueError, match="even in_features"):
        Int4Linear.from_linear(torch.nn.Linear(15, 2).requires_grad_(False))
