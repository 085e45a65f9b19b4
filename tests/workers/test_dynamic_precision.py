"""Dynamic precision: fp8 under memory pressure, original weights back when memory allows."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from verl.config import TrainerConfig
from verl.models import build_tiny_model, build_tiny_tokenizer, save_tiny_model_dir
from verl.models.fp8 import is_fp8_model
from verl.workers.dynamic_precision import DynamicPrecision, GiB, free_memory_bytes
from verl.workers.specs import reward_model_spec


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


class FakeMemory:
    def __init__(self, gib: float) -> None:
        self.gib = gib

    def __call__(self, device: torch.device) -> int:
        return int(self.gib * GiB)


def test_switches_to_fp8_below_threshold_and_back_with_the_exact_weights(tok, caplog):
    model = build_tiny_model(tokenizer=tok, hidden_size=32, num_layers=1).requires_grad_(False)
    original = copy.deepcopy(model.state_dict())
    ids = torch.randint(0, len(tok), (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids).logits
    memory = FakeMemory(10.0)
    dyn = DynamicPrecision("reference", model, torch.device("cpu"), 2.0, probe=memory)
    dyn.before_phase()
    assert not dyn.in_fp8 and dyn.switches == 0  # plenty of memory: nothing happens

    memory.gib = 1.0
    with caplog.at_level(logging.WARNING, logger="verl.workers.dynamic_precision"):
        dyn.before_phase()
    assert dyn.in_fp8 and dyn.switches == 1
    assert "reference switched to fp8 (1.00 GiB free" in caplog.text
    with torch.no_grad():
        assert not torch.equal(model(ids).logits, before)

    memory.gib = 2.0  # at the threshold but without room for the full weights: stays fp8
    dyn.before_phase()
    assert dyn.in_fp8 and dyn.switches == 1

    memory.gib = 3.0
    dyn.before_phase()
    assert not dyn.in_fp8 and dyn.switches == 2
    for key, value in model.state_dict().items():
        assert torch.equal(value, original[key]), key
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


def test_reward_worker_reloads_from_its_path(tok, tmp_path, monkeypatch):
    from verl.workers.reward_model import RewardModelWorker

    path = save_tiny_model_dir(tmp_path / "rm", tokenizer=tok, num_layers=1, reward_head=True)
    cfg = TrainerConfig(dynamic_precision=True)
    cfg.trainer.device = "cpu"
    cfg.reward_model.enable = True
    cfg.reward_model.model.path = str(path)
    worker = RewardModelWorker(reward_model_spec(cfg), actor_tokenizer=tok)
    worker.init_model()
    memory = FakeMemory(0.5)
    worker.dynamic.probe = memory
    original = copy.deepcopy(worker.module.state_dict())
    worker.dynamic.before_phase()
    assert is_fp8_model(worker.module)
    memory.gib = 64.0
    worker.dynamic.before_phase()
    assert not is_fp8_model(worker.module)
    for key, value in worker.module.state_dict().items():
        assert torch.equal(value, original[key]), key


def test_off_by_default_and_never_for_an_fp8_role(tmp_path, tok):
    from verl.workers.role_options import dynamic_precision_threshold

    assert dynamic_precision_threshold(TrainerConfig(), "reference") is None
    cfg = TrainerConfig(dynamic_precision=True, model_precision_map={"reference": "fp8"})
    assert dynamic_precision_threshold(cfg, "reference") is None


def test_free_memory_probe_reads_the_host():
    free = free_memory_bytes(torch.device("cpu"))
    assert 0 < free < 1 << 50
