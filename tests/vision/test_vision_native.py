"""Image prompts through the native rollout (verl.rollout.native with verl.rollout.images):
greedy tokens equal the hf rollout's (transformers' generate) on rows of different image
sizes and prompt lengths, left-padded, in one lock-step batch, in waves, with continuous
batching and with the static-cache decode of compile_decode; sampled log-probs equal the
trainer's recomputation within the text prompts' bound, continuous batching's samples the
lock-step batch's; what it does not take with images is refused by its key."""

from __future__ import annotations

import pytest
import torch

from verl.data.vision_dataset import VisionRLHFDataset, collate_vision_fn
from verl.kernels.torch_functional import compute_response_log_probs
from verl.models.tiny_vision import tiny_vision_model
from verl.rollout import SamplingParams, build_rollout
from verl.rollout.base import validate_prompts
from verl.rollout.continuous import stream_groups
from verl.rollout.native import NativeRollout
from verl.workers.vision_inputs import forward_inputs

IMAGE_SIZES = (56, 84, 112)  # pixels per side: 4x4, 6x6 and 8x8 patch grids


@pytest.fixture(scope="module")
def sharp(vl):
    """The tiny Qwen2-VL (seed 2) with its language model's matrices scaled by 4: sharper
    logits, so greedy tokens differ by row and step instead of repeating one token."""
    model = tiny_vision_model(vl.processor, seed=2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "visual" not in name and p.ndim == 2:
                p.mul_(4.0)
    return model


@pytest.fixture(scope="module")
def mixed(vl, tmp_path_factory):
    """Six image prompts, two per image size (three patch grids, prompt lengths 32-44),
    left-padded into one batch."""
    from verl.data.visual_tasks import main as tasks_main

    base = tmp_path_factory.mktemp("vl_sizes")
    items = []
    for size in IMAGE_SIZES:
        out = base / str(size)
        args = ["--out", str(out), "--train-size", "2", "--val-size", "1", "--seed", str(size)]
        tasks_main([*args, "--format", "parquet", "--image-size", str(size)])
        ds = VisionRLHFDataset(
            out / "train.parquet", vl.processor, vl.model.config, max_prompt_length=128
        )
        items += [ds[0], ds[1]]
    return collate_vision_fn(items, ds.pad_token_id)


def test_the_batch_mixes_image_sizes_and_prompt_lengths(mixed):
    grids = {
        tuple(r["image_grid_thw"][0].tolist()) for r in mixed.non_tensor_batch["multi_modal_inputs"]
    }
    assert len(grids) == 3, grids
    lengths = mixed.batch["attention_mask"].sum(1)
    assert len(set(lengths.tolist())) >= 3 and bool((lengths < lengths.max()).any())
    # the rope axes are not the text positions (a text-position decode would be caught)
    pos = mixed.batch["multimodal_position_ids"]
    assert bool((pos[..., 1] != pos[..., 0]).any())


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"max_num_seqs": 2, "continuous_batching": False},
        {"max_num_seqs": 4},  # continuous batching: 4 slots refilled as rows end
        {"compile_decode": True, "compile_backend": "eager"},  # the static-cache decode
    ],
    ids=["one_batch", "waves_of_2", "continuous_4_slots", "static_cache"],
)
def test_native_greedy_tokens_equal_hf_generate(vl, sharp, mixed, options):
    params = SamplingParams(n=1, do_sample=False, max_new_tokens=10, stop_token_ids=[])
    ref = build_rollout("hf", sharp, vl.processor.tokenizer).generate(mixed, params)
    native = NativeRollout(sharp, vl.processor.tokenizer, **options)
    out = native.generate(mixed, params)
    assert torch.equal(out.batch["responses"], ref.batch["responses"])
    assert len({tuple(r) for r in ref.batch["responses"].tolist()}) >= 3  # not one repeated row
    for key in ("response_mask", "multimodal_position_ids", "mm_token_type_ids", "input_ids"):
        assert torch.equal(out.batch[key], ref.batch[key]), key
    diff = (out.batch["rollout_log_probs"] - ref.batch["rollout_log_probs"]).abs().max()
    assert diff.item() < 1e-4, diff
    slots = options.get("max_num_seqs", 6)
    assert native.last_stats["slots"] == slots
    assert native.last_stats["continuous"] == float(options.get("continuous_batching", slots < 6))


def test_native_sampled_log_probs_match_the_trainers_recomputation(vl, sharp, mixed):
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, stop_token_ids=[], seed=5)
    gen = build_rollout("native", sharp, vl.processor.tokenizer).generate(mixed, params)
    rows = gen.batch["input_ids"].shape[0]
    assert rows == 12 and len(gen.non_tensor_batch["multi_modal_inputs"]) == rows
    position_ids, inputs = forward_inputs(gen)
    with torch.no_grad():
        lp, _ = compute_response_log_probs(
            sharp,
            gen.batch["input_ids"],
            gen.batch["attention_mask"],
            position_ids,
            response_len=8,
            model_inputs=inputs,
        )
    mask = gen.batch["response_mask"].bool()
    diff = (lp - gen.batch["rollout_log_probs"])[mask].abs().max().item()
    assert diff < 1e-4, diff  # fp32: the bound of the native engine's text-prompt tests
    # the two samples of a prompt differ somewhere (sampled, not greedy)
    assert not torch.equal(gen.batch["responses"][0::2], gen.batch["responses"][1::2])
    # continuous batching (4 slots for 12 rows) samples the same tokens (per-sample seeding)
    slotted = NativeRollout(sharp, vl.processor.tokenizer, max_num_seqs=4).generate(mixed, params)
    assert torch.equal(slotted.batch["responses"], gen.batch["responses"])
    diff = (slotted.batch["rollout_log_probs"] - gen.batch["rollout_log_probs"]).abs().max()
    assert diff.item() < 1e-5, diff


def test_native_refuses_what_it_does_not_take_with_images(vl, mixed, monkeypatch):
    tokenizer = vl.processor.tokenizer
    params = SamplingParams(n=2, max_new_tokens=2)
    with stream_groups(lambda *group: None), pytest.raises(ValueError, match="streaming"):
        build_rollout("native", vl.model, tokenizer).generate(mixed, params)
    monkeypatch.setattr(vl.model.config, "model_type", "qwen2_5_vl")
    with pytest.raises(ValueError, match=r"model_type='qwen2_5_vl'.*rollout\.name=hf"):
        build_rollout("native", vl.model, tokenizer).generate(mixed, params)
    monkeypatch.undo()
    # text-only backends (vLLM, SGLang) name the two that take images
    with pytest.raises(ValueError, match=r"rollout\.name=hf or native"):
        validate_prompts(mixed)
