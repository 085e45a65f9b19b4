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
