"""Upstream's merge command line on a LoRA run's checkpoint writes ``lora_adapter/``.

``python -m verl.model_merger merge --backend fsdp --local_dir CKPT/actor --target_dir OUT``
(upstream verl's whole command line) writes the merged model at ``OUT`` and the adapters
alone at ``OUT/lora_adapter``; peft loads those onto the base model and gives the merged
model's log-probs. The safety rules hold for such an export: ``--overwrite`` recognises it
as a previous export, and upstream's target inside the checkpoint is refused with the reason
and a suggested folder outside, which itself is accepted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from verl import cli
from verl.cli import export as model_merger
from verl.cli.export import EXPORT_MARKER
from verl.config import load_config
from verl.models.lora import LORA_ADAPTER_DIR

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lora_checkpoint(tmp_path_factory, tiny_model_dir) -> Path:
    """One LoRA step of the tiny model (an entropy bonus, so the adapters move even when
    every reward is equal), checkpointed with the default contents: ``.../global_step_1``."""
    from verl.trainer.rl.trainer import RLTrainer

    run_dir = tmp_path_factory.mktemp("lora_merge") / "run"
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "actor_rollout_ref.model.lora_rank=4",
            "actor_rollout_ref.model.lora_alpha=8",
            "actor_rollout_ref.actor.optim.lr=1e-2",
            "actor_rollout_ref.actor.entropy_coeff=0.1",
            "data.train_batch_size=2",
            "data.max_response_length=4",
            "data.arithmetic.train_size=4",
            "data.arithmetic.val_size=2",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=2",
            "trainer.total_training_steps=1",
            "trainer.save_freq=1",
            "trainer.val_before_train=false",
            "trainer.logger=[]",
            "trainer.mixed_precision=none",
            f"trainer.default_local_dir={run_dir}",
            f"trainer.log_dir={run_dir}",
        ]
    )
    RLTrainer(cfg).fit()
    return run_dir / "global_step_1"


def _upstream_merge(ckpt: Path, target: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp"]
    cmd += ["--local_dir", str(ckpt / "actor"), "--target_dir", str(target), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _logprobs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]


def test_upstream_merge_of_a_lora_checkpoint_writes_a_peft_adapter(
    lora_checkpoint, tiny_model_dir, tmp_path
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "merged"
    done = _upstream_merge(lora_checkpoint, out)
    assert done.returncode == 0, done.stderr
    adapter = out / LORA_ADAPTER_DIR
    assert sorted(p.name for p in adapter.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 4
    weights = load_file(adapter / "adapter_model.safetensors")
    lora_b = [v for k, v in weights.items() if ".lora_B." in k]
    assert lora_b and max(float(v.abs().max()) for v in lora_b) > 0  # the step moved them
    assert not any(".default." in k for k in weights)  # peft's saved names

    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 12))
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    base_lp = _logprobs(base, ids)
    peft_model = PeftModel.from_pretrained(base, str(adapter)).eval()
    merged_lp, peft_lp = _logprobs(merged, ids), _logprobs(peft_model, ids)
    gap = float((merged_lp - peft_lp).abs().max())
    print(f"max |merged - peft adapter| log-prob: {gap:.2e}")
    assert gap < 1e-5
    assert float((merged_lp - base_lp).abs().max()) > 1e-4  # the adapters change the model

    # a LoRA export (with its lora_adapter/ folder) is a previous export for --overwrite
    again = _upstream_merge(lora_checkpoint, out)
    assert again.returncode == 2 and "pass --overwrite to replace it" in again.stderr
    again = _upstream_merge(lora_checkpoint, out, "--overwrite")
    assert again.returncode == 0, again.stderr
    assert (adapter / "adapter_model.safetensors").is_file() and (out / EXPORT_MARKER).is_file()
    # ... but not with any other folder in it
    (adapter / "nested").mkdir()
    again = _upstream_merge(lora_checkpoint, out, "--overwrite")
    assert again.returncode == 2 and "not a previous export" in again.stderr


def test_upstream_target_inside_the_checkpoint_names_why_and_a_folder_outside(
    lora_checkpoint, capsys
):
    target = lora_checkpoint / "actor" / "huggingface"
    args = ["merge", "merge", "--backend", "fsdp", "--local_dir", str(lora_checkpoint / "actor")]
    assert cli.main([*args, "--target_dir", str(target)]) == 2
    err = capsys.readouterr().err
    assert "retention deletes it whole" in err
    suggested = model_merger.suggested_output(lora_checkpoint)
    assert f"e.g. --out {suggested}" in err
    assert not suggested.is_relative_to(lora_checkpoint.parent)  # outside the run
    assert cli.main([*args, "--target_dir", str(suggested)]) == 0
    assert (suggested / LORA_ADAPTER_DIR / "adapter_model.safetensors").is_file()
