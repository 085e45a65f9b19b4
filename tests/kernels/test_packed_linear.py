"""Linear layers over oneDNN-packed bf16 weights (verl.kernels.packed_linear): outputs equal
autocast's, the swap is undone, packed copies are reused until a weight changes."""

from __future__ import annotations

import pytest
import torch

from verl.kernels.packed_linear import available, packed_linears
from verl.models.tiny import build_tiny_model, build_tiny_tokenizer

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="needs oneDNN bf16 kernels (an AVX-512 bf16 / AMX CPU)",
)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    # Qwen2: biased q/k/v projections, a tied LM head
    return build_tiny_model(tokenizer=build_tiny_tokenizer(), hidden_size=64, num_layers=2).eval()


def _linears(model) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


def test_available_only_under_cpu_bf16_autocast():
    cpu = torch.device("cpu")
    assert not available(cpu)
    with torch.autocast("cpu", dtype=torch.float16):
        assert not available(cpu)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert available(cpu)
        assert not available(torch.device("meta"))


def test_outputs_equal_autocast_and_the_swap_is_undone(model):
    ids = torch.randint(3, 200, (3, 9))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(ids).logits
        with packed_linears(model, batch_hint=3) as swapped:
            assert all("forward" in m.__dict__ for m in _linears(model))
            got = model(ids).logits
            one_row = model(ids[:1, :1]).logits  # another row count than the hint
        want_one = model(ids[:1, :1]).logits
    assert swapped == len(_linears(model))
    assert got.dtype == want.dtype == torch.bfloat16
    assert torch.equal(got, want)
    assert torch.equal(one_row, want_one)
    assert not any("forward" in m.__dict__ for m in _linears(model))


def test_a_block_without_autocast_computes_in_fp32():
    layer = torch.nn.Linear(16, 8)
    x = torch.randn(3, 16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), packed_linears(layer):
        assert layer(x).dtype == torch.bfloat16
        with torch.autocast("cpu", enabled=False):
            got = layer(x)
    assert got.dtype == torch.float32
    assert torch.equal(got, torch.nn.functional.linear(x, layer.weight, layer.bias))


def test_swap_undone_when_the_body_raises(model):
    with pytest.raises(RuntimeError, match="boom"), packed_linears(model):
        raise RuntimeError("boom")
    assert not any("forward" in m.__dict__ for m in _linears(model))


def test_each_call_packs_the_weights_as_they_are_then():
    """A weight changed between two calls by fused AdamW (which updates parameters in place
    without bumping their version counter) or through ``.data`` is what the next call
    computes with: nothing packed is kept from the earlier call."""
    torch.manual_seed(1)
    layer = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.Linear(48, 16, bias=False))
    x = torch.randn(2, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), packed_linears(layer):
        first = layer(x)
    versions = [p._version for p in layer.parameters()]
    opt = torch.optim.AdamW(layer.parameters(), lr=0.1, fused=True)
    for p in layer.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    assert [p._version for p in layer.parameters()] == versions  # the counter did not move
    with torch.no_grad():
        layer[1].weight.data.mul_(2.0)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        with packed_linears(layer):
            second = layer(x)
        want = layer(x)  # autocast over the updated weights
    assert torch.equal(second, want)
    assert not torch.equal(second, first)
