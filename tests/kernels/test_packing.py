"""Packed sequences: the layout is right, and packed log-prob / entropy passes and their
gradients equal the padded ones within 1e-5 (sdpa and eager attention)."""

from __future__ import annotations

import pytest
import torch

from verl.kernels.packing import first_fit_decreasing, pack_sequences, plan_bins
from verl.kernels.torch_functional import compute_response_log_probs
from verl.models.tiny import build_tiny_model
from verl.protocol import DataProto
from verl.workers.micro_batching import split_micro_batches

P, R = 6, 5
PROMPT_LENS = [6, 2, 4, 3, 5, 1, 2]
RESPONSE_LENS = [5, 3, 1, 0, 4, 2, 5]
TOL = 1e-5


def _padded(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    rows = len(PROMPT_LENS)
    ids = torch.randint(3, 200, (rows, P + R), generator=gen)
    mask = torch.zeros(rows, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS, strict=True)):
        mask[i, P - p : P + r] = 1
    ids = ids * mask
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
        "response_mask": mask[:, P:].float(),
    }


def test_first_fit_decreasing_fills_bins_within_capacity():
    lengths = [7, 3, 5, 2, 4, 1]
    bins = first_fit_decreasing(lengths, capacity=8)
    assert sorted(i for b in bins for i in b) == list(range(6))
    assert all(sum(lengths[i] for i in b) <= 8 for b in bins)
    assert len(bins) == 3  # 22 tokens need at least 3 bins of 8
    with pytest.raises(ValueError, match="exceeds capacity=6"):
        first_fit_decreasing(lengths, capacity=6)


def test_default_bins_leave_little_filler():
    def widths(lengths):
        return [sum(lengths[i] for i in b) for b in plan_bins(lengths)]

    assert widths([85, 90, 80, 94]) == [349]  # one bin, not 256 + 93
    assert widths([300, 10]) == [310]
    lengths = [90, 85, 80, 94, 70, 88, 91, 60] * 2  # 1316 tokens
    used = widths(lengths)
    assert len(used) == 1316 // 256  # five bins
    assert max(used) * len(used) < 1.1 * sum(lengths)  # under 10% filler
    # long, alike sequences (shared-prompt units of a GRPO group): two do not fit in the
    # evenly spread capacity, so the even plan would leave most bins half filler
    lengths = [277, 270, 265, 260, 255, 250, 245, 240] * 4
    used = widths(lengths)
    assert max(used) * len(used) < 1.1 * sum(lengths)


def test_pack_lays_real_tokens_end_to_end_with_restarting_positions():
    t = _padded()
    packed = pack_sequences(t["input_ids"], t["attention_mask"], R, capacity=11)
    lengths = [p + r for p, r in zip(PROMPT_LENS, RESPONSE_LENS, strict=True)]
    bins = packed.input_ids.shape[0]
    assert packed.input_ids.shape[1] <= 11  # the fullest bin's length
    assert 43 / 11 <= bins < len(lengths)  # 43 real tokens share bins of 11
    # every real token appears once, and positions count 0.. within each sequence
    real = t["input_ids"][t["attention_mask"].bool()]
    assert sorted(packed.input_ids[packed.input_ids != 0].tolist()) == sorted(real.tolist())
    starts = (packed.position_ids == 0).sum()
    assert starts >= len(lengths)  # one start per sequence (plus bin fillers)
    # each valid response token is predicted by the token before it in its sequence
    flat_ids = packed.input_ids.reshape(-1)
    want = t["input_ids"][:, P:][t["response_mask"].bool()]
    assert torch.equal(packed.labels, want)
    assert torch.equal(flat_ids[packed.response_index + 1], want)
    with pytest.raises(ValueError, match="no prompt token"):
        mask = t["attention_mask"].clone()
        mask[0, :P] = 0
        pack_sequences(t["input_ids"], mask, R)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_log_probs_entropy_and_grads_equal_padded(attn):
    torch.manual_seed(0)
    model = build_tiny_model()
    model.config._attn_implementation = attn
    t = _padded()
    m = t["response_mask"]
    results = {}
    for pack in (False, True):
        model.zero_grad(set_to_none=True)
        lp, ent = compute_response_log_probs(
            model,
            t["input_ids"],
            t["attention_mask"],
            t["position_ids"],
            response_len=R,
            temperature=0.7,
            chunk_size=3,
            calculate_entropy=True,
            pack=pack,
        )
        ((lp * m).sum() + 0.1 * (ent * m).sum()).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        results[pack] = (lp.detach() * m, ent.detach() * m, grads)
    (lp0, e0, g0), (lp1, e1, g1) = results[False], results[True]
    assert float((lp0 - lp1).abs().max()) <= TOL
    assert float((e0 - e1).abs().max()) <= TOL
    assert max(float((a - b).abs().max()) for a, b in zip(g0, g1)) <= TOL
    assert max(float(a.abs().max()) for a in g0) > 1e-2  # a gradient to compare
    # each sequence's hidden states in the packed bins equal those of the sequence run alone
    packed = pack_sequences(t["input_ids"], t["attention_mask"], R)
    assert packed.input_ids.shape[0] == 1  # all seven sequences share one bin
    with torch.no_grad():
        hidden = model.model(
            input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False
        ).last_hidden_state[0]
        offset = 0
        for i in sorted(
            range(len(PROMPT_LENS)), key=lambda k: -(PROMPT_LENS[k] + RESPONSE_LENS[k])
        ):
            ids = t["input_ids"][i][t["attention_mask"][i].bool()][None]
            alone = model.model(input_ids=ids, use_cache=False).last_hidden_state[0]
            n = ids.shape[1]
            assert float((hidden[offset : offset + n] - alone).abs().max()) <= TOL, i
            offset += n


def test_packed_token_budget_counts_real_tokens():
    data = DataProto.from_dict(tensors=_padded())
    lengths = [p + r for p, r in zip(PROMPT_LENS, RESPONSE_LENS, strict=True)]
    micro = split_micro_batches(data, R, max_token_len=16, packed=True)
    assert sorted(int(i) for mb in micro for i in mb.index) == list(range(len(lengths)))
    for mb in micro:
        assert sum(lengths[int(i)] for i in mb.index) <= 16 or len(mb.index) == 1
    padded = split_micro_batches(data, R, max_token_len=16)
    assert len(micro) < len(padded)  # padding no longer counts against the budget


def test_width_multiple_rounds_the_packed_width_with_filler():
    t = _padded()
    plain = pack_sequences(t["input_ids"], t["attention_mask"], R, capacity=11)
    rounded = pack_sequences(t["input_ids"], t["attention_mask"], R, capacity=11, width_multiple=8)
    bins, width = plain.input_ids.shape
    assert rounded.input_ids.shape == (bins, 16) and width <= 11  # 11 or less -> 16
    # the same tokens at the same places of each bin, filler after them
    assert torch.equal(rounded.input_ids[:, :width], plain.input_ids)
    assert not rounded.input_ids[:, width:].any()
    assert torch.equal(rounded.labels, plain.labels)
    # response_index is flat: row b of the rounded layout starts at b * 16
    b, c = plain.response_index // width, plain.response_index % width
    assert torch.equal(rounded.response_index, b * 16 + c)
    with pytest.raises(ValueError, match="width_multiple=0"):
        pack_sequences(t["input_ids"], t["attention_mask"], R, width_multiple=0)
