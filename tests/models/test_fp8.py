"""Weight-only fp8: layer math, accuracy against fp32/bf16, memory, and refusals."""

from __future__ import annotations

import copy

import pytest
import torch

from verl.models import build_tiny_model, build_tiny_tokenizer
from verl.models.fp8 import Fp8Linear, is_fp8_model, quantize_model_fp8_

# Max |log-prob difference| to fp32 over a 4 x 24 batch of the tiny model (measured:
# bf16 storage 0.005, fp8 0.023; e4m3 keeps 3 mantissa bits, bf16 7).
FP8_LOGPROB_TOL = 0.05


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def _log_probs(model, ids):
    with torch.no_grad():
        return torch.log_softmax(model(ids).logits.float(), dim=-1)


def _nbytes(module):
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


def test_layer_dequantizes_per_output_channel():
    linear = torch.nn.Linear(16, 3, bias=True)
    with torch.no_grad():
        linear.weight[1] *= 1000.0  # one row far larger: per-row scales keep the others exact
    layer = Fp8Linear.from_linear(linear.requires_grad_(False))
    assert layer.qweight.dtype == torch.float8_e4m3fn and layer.scale.shape == (3,)
    assert layer.qweight.float().abs().amax(dim=1).tolist() == [448.0, 448.0, 448.0]
    rel = (layer.dequantized_weight() - linear.weight).abs() / linear.weight.abs().amax(1, True)
    assert float(rel.max()) <= 2**-4  # half an e4m3 ulp at the top binade, relative to the row max
    x = torch.randn(5, 16)
    expected = x @ layer.dequantized_weight().T + linear.bias
    torch.testing.assert_close(layer(x), expected)
    assert layer(x.bfloat16()).dtype == torch.bfloat16


def test_fp8_model_matches_fp32_and_bf16_within_tolerance(tok):
    model = build_tiny_model(tokenizer=tok, hidden_size=64, num_layers=2).requires_grad_(False)
    ids = torch.randint(0, len(tok), (4, 24), generator=torch.Generator().manual_seed(0))
    ref = _log_probs(model, ids)
    bf16 = _log_probs(copy.deepcopy(model).to(torch.bfloat16), ids)
    fp8_model = quantize_model_fp8_(copy.deepcopy(model))
    fp8 = _log_probs(fp8_model, ids)
    assert float((fp8 - ref).abs().max()) < FP8_LOGPROB_TOL
    assert float((fp8 - bf16).abs().max()) < FP8_LOGPROB_TOL
    assert float((fp8 - ref).abs().max()) > 0  # really quantized
    assert is_fp8_model(fp8_model) and not is_fp8_model(model)


def test_linear_weights_shrink_about_four_times(tok):
    model = build_tiny_model(tokenizer=tok, hidden_size=64, num_layers=2).requires_grad_(False)
    linears = [m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    head = model.lm_head.weight
    fp32_linear = sum(m.weight.numel() * 4 for m in linears if m.weight is not head)
    before = _nbytes(model)
    quantize_model_fp8_(model)
    saved = before - _nbytes(model)
    # fp32 -> 1 byte per weight plus one fp32 scale per row: saved is just under 3/4
    assert 0.70 * fp32_linear < saved < 0.75 * fp32_linear
    assert model.lm_head.weight is head and head.dtype == torch.float32


def test_reward_head_is_kept(tok):
    rm = build_tiny_model(tokenizer=tok, hidden_size=32, num_layers=1, reward_head=True)
    quantize_model_fp8_(rm.requires_grad_(False))
    assert isinstance(rm.score, torch.nn.Linear) and is_fp8_model(rm)


def test_trainable_model_is_refused(tok):
    model = build_tiny_model(tokenizer=tok, hidden_size=32, num_layers=1)
    with pytest.raises(ValueError, match=r"frozen inference models.*requires_grad_\(False\)"):
        quantize_model_fp8_(model)
