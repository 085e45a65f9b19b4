"""Sequence packing of image batches (verl.kernels.vision_packing): packed log-probs,
entropies and gradients equal the padded pass's within 1e-5 (fp32), rows keep their images
and rope index whole, and rows without images pack with rows that have them."""

from __future__ import annotations

import pytest
import torch

from verl.kernels.torch_functional import compute_response_log_probs
from verl.kernels.vision_packing import pack_image_batch, row_image_counts
from verl.rollout import SamplingParams, build_rollout
from verl.workers.vision_inputs import forward_inputs

RESPONSE = 6


@pytest.fixture(scope="module")
def rollout_batch(vl):
    _, batch = vl.prompts(rows=4)
    rollout = build_rollout("hf", vl.model, vl.processor.tokenizer)
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=RESPONSE, seed=5)
    gen = rollout.generate(batch, params)
    # responses of different lengths (a random model rarely samples its eos), so that the
    # bins reorder the rows: row i keeps RESPONSE - i % 4 tokens, right-padded
    b = gen.batch
    for i in range(len(gen)):
        cut = i % 4
        if cut:
            b["input_ids"][i, -cut:] = vl.processor.tokenizer.pad_token_id
            b["attention_mask"][i, -cut:] = 0
            b["response_mask"][i, -cut:] = 0
    return gen


def _log_probs(model, data, pack, grad=False):
    position_ids, inputs = forward_inputs(data)
    b = data.batch
    with torch.set_grad_enabled(grad):
        return compute_response_log_probs(
            model,
            b["input_ids"],
            b["attention_mask"],
            position_ids,
            response_len=RESPONSE,
            calculate_entropy=True,
            pack=pack,
            model_inputs=inputs,
        )


def test_packed_log_probs_and_entropy_equal_padded(vl, rollout_batch):
    gen = rollout_batch
    mask = gen.batch["response_mask"].bool()
    lengths = mask.sum(-1)
    assert len(set(lengths.tolist())) > 1, lengths  # the rows differ in length
    padded_lp, padded_ent = _log_probs(vl.model, gen, pack=False)
    packed_lp, packed_ent = _log_probs(vl.model, gen, pack=True)
    assert (packed_lp - padded_lp)[mask].abs().max().item() < 1e-5
    assert (packed_ent - padded_ent)[mask].abs().max().item() < 1e-5
    # the rollout's own log-probs: the same bound as the padded pass (docs/vision.md)
    assert (packed_lp - gen.batch["rollout_log_probs"])[mask].abs().max().item() < 1e-4


def test_packed_gradients_equal_padded(vl, rollout_batch):
    gen = rollout_batch
    mask = gen.batch["response_mask"]
    model = vl.model
    grads = []
    for pack in (False, True):
        model.zero_grad(set_to_none=True)
        lp, ent = _log_probs(model, gen, pack=pack, grad=True)
        ((lp + 0.1 * ent) * mask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    model.zero_grad(set_to_none=True)
    padded, packed = grads
    assert padded.keys() == packed.keys()
    assert any("visual" in n for n in padded)  # the vision tower is in the graph
    worst = max((padded[n] - packed[n]).abs().max().item() for n in padded)
    assert worst < 1e-5, worst


def test_rows_stay_whole_with_their_rope_index(vl, rollout_batch):
    gen = rollout_batch
    position_ids, inputs = forward_inputs(gen)
    b = gen.batch
    packed, positions, order = pack_image_batch(
        b["input_ids"], b["attention_mask"], position_ids, RESPONSE
    )
    assert sorted(order) == list(range(len(gen)))
    assert order != list(range(len(gen)))  # first-fit decreasing reordered the rows
    flat_ids = packed.input_ids.reshape(-1)
    flat_pos = positions.reshape(4, -1)
    mask = b["attention_mask"].bool()
    width = packed.input_ids.shape[1]
    for i, (start, length, _, _) in zip(order, sorted(packed.blocks), strict=True):
        assert start // width == (start + length - 1) // width  # one bin
        assert torch.equal(flat_ids[start : start + length], b["input_ids"][i][mask[i]])
        assert torch.equal(flat_pos[:, start : start + length], position_ids[:, i, mask[i]])
    config = vl.model.config
    counts = row_image_counts(
        b["input_ids"], b["attention_mask"], inputs["image_grid_thw"], config.image_token_id, 2
    )
    assert counts == [1] * len(gen)
    with pytest.raises(ValueError, match="do not match its rows"):
        row_image_counts(
            b["input_ids"],
            b["attention_mask"],
            inputs["image_grid_thw"][:-1],
            config.image_token_id,
            2,
        )


def test_rows_without_images_pack_with_rows_that_have_them(vl, rollout_batch):
    gen = rollout_batch
    # drop the images of rows 1 and 4: their image tokens become plain text tokens
    data = gen.select(batch_keys=list(gen.batch.keys()))
    rows = list(data.non_tensor_batch["multi_modal_inputs"])
    ids = data.batch["input_ids"].clone()
    text_id = vl.processor.tokenizer.convert_tokens_to_ids("<|vision_start|>")
    image_id = vl.model.config.image_token_id
    for i in (1, 4):
        rows[i] = {}
        ids[i][ids[i] == image_id] = text_id
    data.batch["input_ids"] = ids
    data.non_tensor_batch["multi_modal_inputs"] = type(data.non_tensor_batch["multi_modal_inputs"])(
        len(rows), dtype=object
    )
    for i, r in enumerate(rows):
        data.non_tensor_batch["multi_modal_inputs"][i] = r
    mask = data.batch["response_mask"].bool()
    padded_lp, _ = _log_probs(vl.model, data, pack=False)
    packed_lp, _ = _log_probs(vl.model, data, pack=True)
    assert (packed_lp - padded_lp)[mask].abs().max().item() < 1e-5
