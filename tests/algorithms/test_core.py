"""Masked statistics and entropy, against hand-computed values."""

import math

import pytest
import torch

from verl.algorithms.core import (
    entropy_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

INF = float("inf")


def test_masked_mean_ignores_padding_even_inf_and_nan():
    x = torch.tensor([[1.0, 2.0], [3.0, INF]])
    mask = torch.tensor([[1, 1], [1, 0]])
    assert masked_mean(x, mask).item() == pytest.approx(2.0)  # (1 + 2 + 3) / 3
    torch.testing.assert_close(masked_mean(x, mask, dim=-1), torch.tensor([1.5, 3.0]))
    x_nan = torch.tensor([[1.0, float("nan")]])
    assert masked_mean(x_nan, torch.tensor([[1, 0]])).item() == pytest.approx(1.0)


def test_masked_mean_with_no_valid_element_is_zero_not_nan():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert masked_mean(x, torch.zeros(2, 2)).item() == 0.0
    row = masked_mean(x, torch.tensor([[1, 1], [0, 0]]), dim=-1)
    torch.testing.assert_close(row, torch.tensor([1.5, 0.0]))


def test_masked_mean_accepts_bool_and_float_masks_and_flows_gradient():
    x = torch.tensor([1.0, 2.0, 10.0], requires_grad=True)
    m = masked_mean(x, torch.tensor([True, True, False]))
    m.backward()
    torch.testing.assert_close(x.grad, torch.tensor([0.5, 0.5, 0.0]))
    # a float mask acts as weights: (1*1 + 2*3) / (1 + 3)
    assert masked_mean(x.detach(), torch.tensor([1.0, 3.0, 0.0])).item() == pytest.approx(1.75)
    assert masked_sum(x.detach(), torch.tensor([1, 0, 1])).item() == pytest.approx(11.0)


def test_masked_var_unbiased_and_biased():
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    mask = torch.tensor([1, 1, 1, 0])
    # mean 2, squared deviations 1 + 0 + 1 = 2 -> unbiased 2/2 = 1, biased 2/3
    assert masked_var(x, mask).item() == pytest.approx(1.0)
    assert masked_var(x, mask, unbiased=False).item() == pytest.approx(2 / 3)
    ref = torch.var(x[:3]).item()
    assert masked_var(x, mask).item() == pytest.approx(ref)


def test_masked_var_single_or_no_element_is_zero():
    x = torch.tensor([5.0, 7.0])
    assert masked_var(x, torch.tensor([1, 0])).item() == 0.0
    assert masked_var(x, torch.tensor([0, 0])).item() == 0.0


def test_masked_whiten():
    x = torch.tensor([[2.0, 4.0], [6.0, -50.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    # mean 4, unbiased var (4 + 0 + 4) / 2 = 4, std 2 -> (-1, 0, 1); masked position -> 0
    out = masked_whiten(x, mask)
    torch.testing.assert_close(out, torch.tensor([[-1.0, 0.0], [1.0, 0.0]]), atol=1e-6, rtol=0)
    out = masked_whiten(x, mask, shift_mean=False)
    torch.testing.assert_close(out, torch.tensor([[3.0, 4.0], [5.0, 0.0]]), atol=1e-6, rtol=0)


def test_masked_whiten_constant_input_is_zero():
    x = torch.full((2, 3), 7.0)
    out = masked_whiten(x, torch.ones(2, 3))
    assert torch.all(out == 0)


def _entropy_ref(row):
    m = max(row)
    z = sum(math.exp(v - m) for v in row)
    probs = [math.exp(v - m) / z for v in row]
    return -sum(p * math.log(p) for p in probs if p > 0)


def test_entropy_from_logits_matches_reference():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 7) * 3
    out = entropy_from_logits(logits)
    assert out.shape == (2, 3)
    for b in range(2):
        for t in range(3):
            assert out[b, t].item() == pytest.approx(_entropy_ref(logits[b, t].tolist()), abs=1e-5)


def test_entropy_special_cases():
    assert entropy_from_logits(torch.zeros(4)).item() == pytest.approx(math.log(4))
    # huge logits do not overflow
    assert entropy_from_logits(torch.tensor([1000.0, 1000.0])).item() == pytest.approx(math.log(2))
    # a banned token (-inf) contributes nothing; one allowed token -> 0 entropy
    assert entropy_from_logits(torch.tensor([3.0, -INF])).item() == pytest.approx(0.0, abs=1e-7)
    bf16 = entropy_from_logits(torch.zeros(8, dtype=torch.bfloat16))
    assert bf16.dtype == torch.float32
    assert bf16.item() == pytest.approx(math.log(8), abs=1e-5)


def test_entropy_gradient_matches_autograd_of_reference():
    logits = torch.tensor([0.3, -1.2, 2.0], requires_grad=True)
    entropy_from_logits(logits).backward()
    ref_logits = logits.detach().clone().requires_grad_(True)
    p = torch.softmax(ref_logits, -1)
    (-(p * torch.log(p)).sum()).backward()
    torch.testing.assert_close(logits.grad, ref_logits.grad)
