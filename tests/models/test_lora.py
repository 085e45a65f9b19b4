"""verl.models.lora: the one LoRA scaling, and merged weights computing what the adapters do."""

from __future__ import annotations

import json

import pytest
import torch

from verl.models import build_tiny_model
from verl.models.lora import (
    LoraSpec,
    adapter_scaling,
    apply_lora,
    lora_scaling,
    merged_state_dict,
    write_adapter,
)


def test_lora_scaling_is_alpha_over_rank_from_the_model_and_its_written_config(tmp_path):
    torch.manual_seed(0)
    model = apply_lora(build_tiny_model(), LoraSpec(rank=4, alpha=6.0))
    assert lora_scaling(model) == 1.5
    write_adapter(model, model.state_dict(), tmp_path)
    assert json.loads((tmp_path / "adapter_config.json").read_text())["r"] == 4
    assert adapter_scaling(tmp_path) == lora_scaling(model) == 1.5
    assert adapter_scaling(tmp_path / "missing") is None
    with pytest.raises(ValueError, match="Linear has no LoRA adapters"):
        lora_scaling(torch.nn.Linear(2, 2))


def test_merged_weights_with_lora_scaling_compute_what_the_adapters_do():
    torch.manual_seed(0)
    model = apply_lora(build_tiny_model(), LoraSpec(rank=2, alpha=8.0)).eval()
    with torch.no_grad():  # non-zero adapters (lora_B starts at 0)
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.normal_(std=0.05)
    ids = torch.randint(0, model.config.vocab_size, (2, 7))
    with torch.no_grad():
        want = model(input_ids=ids).logits
        plain = build_tiny_model().eval()
        plain.load_state_dict(merged_state_dict(model.state_dict(), lora_scaling(model)))
        got = plain(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)


def test_seeded_adapters_do_not_depend_on_the_global_generator():
    """Each rank of a sharded run seeds its global generator per rank; adapters drawn with
    ``seed`` are the same on every rank (and leave the global stream alone)."""
    from verl.models import build_tiny_model
    from verl.models.lora import LoraSpec, apply_lora

    spec = LoraSpec(rank=4, alpha=8, target_modules="all-linear")
    adapters = []
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)
        before = torch.get_rng_state()
        wrapped = apply_lora(build_tiny_model(), spec, seed=42)
        assert torch.equal(torch.get_rng_state(), before)
        adapters.append({k: v for k, v in wrapped.state_dict().items() if "lora_A" in k})
    assert adapters[0] and adapters[0].keys() == adapters[1].keys()
    assert all(torch.equal(adapters[0][k], adapters[1][k]) for k in adapters[0])
    torch.manual_seed(1)
    unseeded = apply_lora(build_tiny_model(), spec)
    key = next(iter(adapters[0]))
    assert not torch.equal(unseeded.state_dict()[key], adapters[0][key])
