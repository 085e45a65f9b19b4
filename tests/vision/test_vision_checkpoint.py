"""An image run's checkpoint and export (slow: three short RL runs of the tiny Qwen2-VL).

The default config (native rollout, sequence packing on) saves at step 1; a
run stopped in step 2 and a new trainer resuming it from its checkpoint end bit for bit
where an uninterrupted run ends (checkpoint tensors, exported weights, metrics). The export
and the checkpoint's HF metadata hold the processor: ``load_vision_processor`` of the
export gives the original's inputs, ``AutoModelForImageTextToText`` its model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer.varied_reward import assert_updates_moved, even_token_reward
from verl.config import load_config
from verl.data.vision import process_prompt, read_vision_rows
from verl.models.vision_processor import load_vision_processor
from verl.testing import assert_bitwise, assert_same_metrics, checkpoint_tensors
from verl.trainer.lifecycle.checkpoint import complete_checkpoints
from verl.trainer.rl.trainer import RLTrainer

pytestmark = pytest.mark.slow


class _Crash(Exception):
    """Stands for a crash of the run in the middle of a step."""


def _config(vl, out: Path):
    return load_config(
        overrides=[
            f"actor_rollout_ref.model.path={vl.model_dir}",
            f"data.train_files={vl.train}",
            f"data.val_files={vl.train.parent / 'test.parquet'}",
            "algorithm.adv_estimator=grpo",
            "data.train_batch_size=4",
            "data.max_prompt_length=64",
            "data.max_response_length=6",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.optim.lr=1e-2",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "trainer.total_training_steps=2",
            "trainer.save_freq=1",
            "trainer.val_before_train=false",
            "trainer.logger=[]",
            f"trainer.default_local_dir={out}",
            f"trainer.log_dir={out}",
        ]
    )


def test_image_run_resumes_bit_for_bit_and_exports_its_processor(vl, tmp_path):
    straight_dir = tmp_path / "straight"
    straight = RLTrainer(_config(vl, straight_dir), reward_fn=even_token_reward)
    assert straight.config.actor_rollout_ref.rollout.name == "native"  # images on native
    assert straight.config.actor_rollout_ref.actor.pack_sequences
    straight.fit()
    # the default reward is 0 on the random model: without a reward that differs within
    # groups every update is a no-op and the resumed run would match whatever it restored
    assert_updates_moved(straight.history)

    run_dir = tmp_path / "resumed"
    first = RLTrainer(_config(vl, run_dir), reward_fn=even_token_reward)
    real = first.train_step

    def train_step(*args: Any, **kwargs: Any) -> dict[str, Any]:
        if first.global_step >= 2:
            raise _Crash("crash in step 2")
        return real(*args, **kwargs)

    first.train_step = train_step
    with pytest.raises(_Crash):
        first.fit()
    assert [p.name for _, p in complete_checkpoints(run_dir)] == ["global_step_1"]
    second = RLTrainer(_config(vl, run_dir), reward_fn=even_token_reward)
    second.fit()
    assert second.resumed_from == run_dir / "global_step_1"

    assert_same_metrics(first.history + second.history, straight.history)
    assert_bitwise(
        checkpoint_tensors(run_dir / "global_step_2"),
        checkpoint_tensors(straight_dir / "global_step_2"),
    )
    exported = load_file(run_dir / "huggingface" / "model.safetensors")
    assert_bitwise(exported, load_file(straight_dir / "huggingface" / "model.safetensors"))
    before = load_file(vl.model_dir / "model.safetensors")
    assert any(not torch.equal(before[k], exported[k]) for k in before if "visual" in k)

    # the export and the checkpoint's HF metadata hold the processor
    from transformers import AutoModelForImageTextToText

    for where in (run_dir / "huggingface", run_dir / "global_step_2" / "actor" / "huggingface"):
        assert (where / "processor_config.json").is_file(), sorted(p.name for p in where.iterdir())
    export = run_dir / "huggingface"
    processor = load_vision_processor(export)
    row = read_vision_rows(vl.train)[0]
    want = process_prompt(vl.processor, row.data["prompt"], row.load_images())
    got = process_prompt(processor, row.data["prompt"], row.load_images())
    assert want.keys() == got.keys()
    for key in want:
        assert torch.equal(want[key], got[key]), key
    model = AutoModelForImageTextToText.from_pretrained(export, local_files_only=True)
    assert type(model).__name__ == "Qwen2VLForConditionalGeneration"
    (embed,) = [k for k in exported if k.endswith("embed_tokens.weight")]
    assert torch.equal(model.get_input_embeddings().weight, exported[embed])  # the trained one
