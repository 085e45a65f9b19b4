"""An engine with weights of its own (vLLM) on one rank starts with a LoRA actor's weights
folded: HF names, adapters merged, as every later push."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from verl.models.lora import LoraSpec, apply_lora, lora_scaling, merged_state_dict
from verl.models.tiny import build_tiny_model
from verl.workers.actor_rollout import rank_rollout


class _ServingEngine:
    """Records what it is given, like a serving engine's start-up push."""

    owns_weights = True

    def __init__(self, module, tokenizer, push_initial_weights: bool = True, **options):
        self.pushes: list[dict[str, torch.Tensor]] = []
        if push_initial_weights:
            self.update_weights(module.state_dict().items())

    def update_weights(self, named_tensors):
        self.pushes.append(dict(named_tensors))
        return {"seconds": 0.0}


def test_a_lora_actor_is_pushed_folded_on_one_rank():
    module = apply_lora(build_tiny_model(), LoraSpec(rank=4), seed=0)
    with torch.no_grad():  # adapters that change the weights once folded
        for name, param in module.named_parameters():
            if "lora_B" in name:
                param.fill_(0.01)
    spec = SimpleNamespace(options={})
    engine = rank_rollout(_ServingEngine, spec, module, None, rank=0, world_size=1)
    assert len(engine.pushes) == 1
    pushed = engine.pushes[0]
    want = merged_state_dict(module.state_dict(), lora_scaling(module))
    assert set(pushed) == set(want)
    assert not any("lora_" in k or k.startswith("base_model.") for k in pushed)
    assert all(torch.equal(pushed[k], want[k]) for k in want)


def test_a_plain_actor_is_pushed_by_the_engine_itself():
    module = build_tiny_model()
    engine = rank_rollout(_ServingEngine, SimpleNamespace(options={}), module, None, 0, 1)
    assert len(engine.pushes) == 1 and set(engine.pushes[0]) == set(module.state_dict())
