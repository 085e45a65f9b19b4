"""Image prompts through one training path: dataset + collate, the hf rollout, the log-prob
and update passes, and (slow) two GRPO steps from the CLI entry with the tiny Qwen2-VL
through the native rollout."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verl.kernels.torch_functional import compute_response_log_probs
from verl.rollout import SamplingParams, build_rollout
from verl.rollout.base import validate_prompts
from verl.workers.micro_batching import gather_response_outputs, split_micro_batches
from verl.workers.vision_inputs import check_image_batching, forward_inputs

ROOT = Path(__file__).resolve().parents[2]


def _prompts(vl, rows=4):
    return vl.prompts(rows)


def test_collate_pads_positions_and_keeps_images_per_row(vl):
    _, batch = _prompts(vl)
    b = batch.batch
    rows, width = b["input_ids"].shape
    assert b["mm_token_type_ids"].shape == (rows, width)
    assert b["multimodal_position_ids"].shape == (rows, width, 4)
    # row 0 of the rope index is the text position; padding is 0 everywhere
    assert torch.equal(b["multimodal_position_ids"][..., 0], b["position_ids"])
    pad = b["attention_mask"] == 0
    assert int(b["multimodal_position_ids"][pad].abs().sum()) == 0
    images = batch.non_tensor_batch["multi_modal_inputs"]
    for i in range(rows):
        grid = images[i]["image_grid_thw"]
        assert images[i]["pixel_values"].shape[0] == int(grid.prod(-1).sum())
        # one image token per merged 2x2 patch group
        assert int(b["mm_token_type_ids"][i].sum()) == int(grid.prod(-1).sum()) // 4


def test_hf_rollout_log_probs_match_the_trainers_recomputation(vl):
    _, batch = _prompts(vl)
    model = vl[3]
    rollout = build_rollout("hf", model, vl[2].tokenizer)
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=6, stop_token_ids=[], seed=3)
    gen = rollout.generate(batch, params)
    rows, seq = gen.batch["input_ids"].shape
    assert rows == 8 and gen.batch["multimodal_position_ids"].shape == (rows, seq, 4)
    assert len(gen.non_tensor_batch["multi_modal_inputs"]) == rows
    position_ids, inputs = forward_inputs(gen)
    with torch.no_grad():
        lp, _ = compute_response_log_probs(
            model,
            gen.batch["input_ids"],
            gen.batch["attention_mask"],
            position_ids,
            response_len=6,
            model_inputs=inputs,
        )
    mask = gen.batch["response_mask"].bool()
    diff = (lp - gen.batch["rollout_log_probs"])[mask].abs().max().item()
    assert diff < 1e-4, diff  # fp32: the rollout's incremental decode vs one forward
    # a micro-batch split (images cut by each row's patch count) equals the whole batch
    parts = []
    with torch.no_grad():
        for mb in split_micro_batches(gen, 6, micro_batch_size=3):
            pos, inp = forward_inputs(mb.data)
            x = mb.data.batch
            part, _ = compute_response_log_probs(
                model, x["input_ids"], x["attention_mask"], pos, mb.response_len, model_inputs=inp
            )
            parts.append((mb, part))
    split = gather_response_outputs(parts, rows, 6)
    assert (split - lp)[mask].abs().max().item() < 1e-5


def test_text_backends_and_sequence_parallelism_refuse_image_batches(vl):
    _, batch = _prompts(vl, rows=2)
    with pytest.raises(ValueError, match=r"rollout\.name=hf or native"):
        validate_prompts(batch)  # the check of the text-only backends (vLLM, SGLang)

    class Packed:
        pack_sequences = True

    check_image_batching(batch, Packed())  # packing takes images (test_vision_packing)
    with pytest.raises(ValueError, match="ulysses_sequence_parallel_size=1"):
        check_image_batching(batch, Packed(), sequence_parallel_size=2)
    with pytest.raises(KeyError, match="multimodal_position_ids"):
        check_image_batching(batch.select(batch_keys=["input_ids"]), Packed())


@pytest.mark.slow
def test_two_grpo_steps_from_the_cli(vl, tmp_path):
    model_dir, train, _, _ = vl
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        f"data.train_files={train}",
        f"data.val_files={train.parent / 'test.parquet'}",
        f"actor_rollout_ref.model.path={model_dir}",
        # the defaults otherwise: packing on
        "actor_rollout_ref.rollout.name=native",
        "algorithm.adv_estimator=grpo",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=8",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=2",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "trainer.total_training_steps=2",
        "trainer.logger=[jsonl]",
        "trainer.mixed_precision=none",
        "trainer.val_before_train=false",
        f"trainer.default_local_dir={out}",
        f"trainer.log_dir={out}",
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "actor_rollout_ref.rollout.name=native" not in done.stderr  # no adjustment to hf
    assert "native rollout: image prompts (qwen2_vl)" in done.stderr
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train_steps = [s for s in steps if "actor/pg_loss" in s]
    assert [s["step"] for s in train_steps] == [1, 2]
    for s in train_steps:
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss"):
            assert math.isfinite(s[key]), (key, s[key])
        # the native rollout's log-probs against the old-policy pass (fp32)
        assert s["rollout/logprob_abs_diff_max"] < 1e-4, s["rollout/logprob_abs_diff_max"]
    from safetensors.torch import load_file

    before = load_file(model_dir / "model.safetensors")
    after = load_file(out / "huggingface" / "model.safetensors")
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "no weight changed in two GRPO steps"
    assert any("visual" in k for k in changed)  # gradients reach the vision tower
