"""Each row of an image batch meets its own image in the actor update's micro-batches.

The update shuffles the rows (``iter_ppo_mini_batches``), cuts mini-batches, and micro-batches
by a token budget (which sorts rows by cost) with packing (which reorders rows into bins);
the images live in ``non_tensor_batch`` beside the tensors. Every row's log-probs computed
in those micro-batches must equal its log-probs in the whole batch (fp32, 1e-5): a row
paired with another row's image of the same size would run silently with wrong numbers
(the control below shows such a swap moves the log-probs by far more than the bound).
"""

from __future__ import annotations

import pytest
import torch

from verl.kernels.torch_functional import compute_response_log_probs
from verl.rollout import SamplingParams, build_rollout
from verl.workers.common import iter_ppo_mini_batches, micro_batches
from verl.workers.specs import BatchingSpec
from verl.workers.vision_inputs import forward_inputs

RESPONSE = 4


@pytest.fixture(scope="module")
def batch(vl):
    _, prompts = vl.prompts(rows=6)
    rollout = build_rollout("hf", vl.model, vl.processor.tokenizer)
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=RESPONSE, seed=3)
    gen = rollout.generate(prompts, params)
    gen.batch["row_index"] = torch.arange(len(gen))
    return gen


def _log_probs(model, data, pack, response_len=RESPONSE):
    position_ids, inputs = forward_inputs(data)
    b = data.batch
    with torch.no_grad():
        lp, _ = compute_response_log_probs(
            model,
            b["input_ids"],
            b["attention_mask"],
            position_ids,
            response_len=response_len,
            pack=pack,
            model_inputs=inputs,
        )
    return lp


def test_update_micro_batches_keep_each_row_with_its_image(vl, batch):
    images = batch.non_tensor_batch["multi_modal_inputs"]
    grids = {tuple(r["image_grid_thw"].flatten().tolist()) for r in images}
    assert len(grids) == 1  # one image size: a wrong pairing would not fail by shape
    distinct = {r["pixel_values"].numpy().tobytes() for r in images}
    assert len(distinct) == len(batch) // 2  # one image per prompt, shared by its 2 samples
    whole = _log_probs(vl.model, batch, pack=False)
    mask = batch.batch["response_mask"].bool()
    spec = BatchingSpec(
        use_dynamic_bsz=True,
        ppo_micro_batch_size_per_device=None,
        ppo_max_token_len_per_device=3 * (batch.batch["input_ids"].shape[1]),
        ppo_mini_batch_size=3,
        rollout_n=2,
        ppo_epochs=2,
        shuffle=True,
        loss_agg_mode="token-mean",
        pack_sequences=True,
    )
    seen = torch.zeros(len(batch), dtype=torch.long)
    orders = []
    for mini in iter_ppo_mini_batches(batch, 5, epochs=2, shuffle=True, seed=7):
        orders.append(mini.batch["row_index"].tolist())
        for mb in micro_batches(mini, RESPONSE, None, spec):
            lp = _log_probs(vl.model, mb.data, pack=True, response_len=mb.response_len)
            rows = mb.data.batch["row_index"]
            want = whole[rows, : mb.response_len]
            m = mask[rows, : mb.response_len]
            assert (lp - want)[m].abs().max().item() < 1e-5, rows.tolist()
            seen[rows] += 1
    assert seen.tolist() == [2] * len(batch)  # every row, once per epoch
    assert orders[0] != sorted(orders[0])  # the rows were shuffled


def test_a_row_given_another_rows_image_moves_its_log_probs(vl, batch):
    """The control: the bound above tells a swapped image from the right one."""
    whole = _log_probs(vl.model, batch, pack=False)
    swapped = batch.select()
    images = swapped.non_tensor_batch["multi_modal_inputs"].copy()
    images[0], images[2] = images[2], images[0]  # rows 0 and 2: different prompts' images
    swapped.non_tensor_batch["multi_modal_inputs"] = images
    moved = _log_probs(vl.model, swapped, pack=False)
    mask = batch.batch["response_mask"].bool()
    assert (moved - whole)[0][mask[0]].abs().max().item() > 1e-3
