"""sample_next_tokens: greedy, temperature, top-k, top-p, log-probs and sampling frequencies."""

import math

import pytest
import torch

from verl.rollout.sampling import sample_next_tokens

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def _frequencies(logits: torch.Tensor, rows: int, seed: int = 0, **kwargs) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    uniforms = torch.rand(rows, generator=gen)
    tokens, _ = sample_next_tokens(
        logits.expand(rows, -1), greedy=False, uniforms=uniforms, **kwargs
    )
    return torch.bincount(tokens, minlength=logits.numel()).double() / rows


def _chi_square(freq: torch.Tensor, probs: torch.Tensor, rows: int) -> float:
    keep = probs > 0
    expected = probs[keep].double() * rows
    observed = freq[keep] * rows
    return float(((observed - expected) ** 2 / expected).sum())


def test_greedy_is_argmax_with_tempered_logprob():
    logits = torch.randn(5, 11, generator=torch.Generator().manual_seed(0))
    tokens, logp = sample_next_tokens(logits, greedy=True, temperature=0.5)
    assert torch.equal(tokens, logits.argmax(-1))
    expected = (logits / 0.5).log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    torch.testing.assert_close(logp, expected)
    # temperature 0 reports untempered log-probs
    _, logp0 = sample_next_tokens(logits, greedy=True, temperature=0.0)
    torch.testing.assert_close(
        logp0, logits.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)
    )


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_frequencies_match_softmax(temperature):
    rows = 40_000
    probs = (LOGITS / temperature).softmax(-1)
    freq = _frequencies(LOGITS, rows, temperature=temperature)
    # 5 degrees of freedom: P(chi2 > 20.5) = 0.001; the draw is seeded, so no flakiness.
    assert _chi_square(freq, probs, rows) < 20.5
    assert torch.allclose(freq, probs.double(), atol=0.01)


def test_top_k_renormalises_over_k_largest():
    rows = 20_000
    freq = _frequencies(LOGITS, rows, top_k=2)
    top2 = LOGITS[:2].softmax(-1)
    assert freq[2:].sum() == 0
    assert _chi_square(freq, torch.cat([top2, torch.zeros(4)]), rows) < 10.8  # df=1, p=0.001


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    rows = 20_000
    # top_p=0.75: mass before token 1 is 0.5 < 0.75 (kept), before token 2 is 0.8 (dropped)
    freq = _frequencies(logits, rows, top_p=0.75)
    assert freq[2:].sum() == 0
    assert abs(float(freq[0]) - 0.5 / 0.8) < 0.015
    # top_p=0.9 keeps three tokens, renormalised by 0.95
    freq = _frequencies(logits, rows, top_p=0.9)
    assert freq[3] == 0
    assert abs(float(freq[2]) - 0.15 / 0.95) < 0.01
    # top_k and top_p together: k first, then p over the renormalised k
    freq = _frequencies(logits, rows, top_k=3, top_p=0.6)  # 0.5/0.95 < 0.6 -> keeps 2
    assert freq[2:].sum() == 0


def test_logprobs_are_before_truncation():
    logits = LOGITS.expand(64, -1)
    uniforms = torch.rand(64, generator=torch.Generator().manual_seed(3))
    tokens, logp = sample_next_tokens(
        logits, greedy=False, temperature=0.8, top_k=2, top_p=0.9, uniforms=uniforms
    )
    full = (LOGITS / 0.8).log_softmax(-1)
    torch.testing.assert_close(logp, full[tokens])


def test_top_k_one_is_greedy_and_zero_probability_tokens_never_drawn():
    logits = torch.randn(8, 30, generator=torch.Generator().manual_seed(1))
    uniforms = torch.tensor([0.0, 0.999999, 0.5, 0.25, 0.75, 0.1, 0.9, 0.3])
    tokens, _ = sample_next_tokens(logits, greedy=False, top_k=1, uniforms=uniforms)
    assert torch.equal(tokens, logits.argmax(-1))
    masked = logits.clone()
    masked[:, 0] = -math.inf  # first and last vocab entries impossible
    masked[:, -1] = -math.inf
    for u in (0.0, 1.0 - 2**-24):
        tokens, logp = sample_next_tokens(masked, greedy=False, uniforms=torch.full((8,), u))
        assert bool(((tokens > 0) & (tokens < 29)).all())
        assert bool(torch.isfinite(logp).all())


def test_sampling_needs_uniforms():
    with pytest.raises(ValueError, match="uniforms"):
        sample_next_tokens(LOGITS[None], greedy=False)
