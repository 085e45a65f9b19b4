"""Continuous batching in the native engine (``verl/rollout/continuous.py``): with fewer
slots than rows, every sample equals the lock-step engine's (greedy, seeded sampling, stop
tokens and strings, n > 1, bf16 autocast through the decode attention), slots are refilled
(fewer decode steps than lock-step waves on a long-tail mix), and per-sample seeding makes
samples independent of the batch they ran in."""

from __future__ import annotations

import pytest
import torch

from verl.protocol import DataProto
from verl.rollout import SamplingParams
from verl.rollout.continuous import current_group_sink, stream_groups
from verl.rollout.native import NativeRollout
from verl.rollout.sampling import row_uniforms

MORE_PROMPTS = [
    "1+2=",
    "what is the sum of 3 and 4? the answer is",
    "hello",
    "the cat has 5 apples and the dog has",
    "a",
    "bb cc dd",
    "x y z w v u",
]


@pytest.fixture
def batch(tokenizer):
    enc = tokenizer(MORE_PROMPTS, return_tensors="pt", padding=True)
    return DataProto.from_dict(
        tensors={"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    )


def _same(a, b) -> float:
    """Assert identical responses / masks; return the largest log-prob difference."""
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert torch.equal(a.batch["response_mask"], b.batch["response_mask"])
    return float((a.batch["rollout_log_probs"] - b.batch["rollout_log_probs"]).abs().max())


PARAMS = [
    SamplingParams(n=2, max_new_tokens=20, do_sample=False),
    SamplingParams(n=3, max_new_tokens=20, seed=7, temperature=1.0),
    SamplingParams(n=2, max_new_tokens=20, seed=1, top_p=0.9, stop_token_ids=[5, 9, 11]),
    SamplingParams(n=1, max_new_tokens=12, seed=2, temperature=0.7, top_k=20),
]


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "n3", "top_p_stops", "top_k"])
@pytest.mark.parametrize("slots", [3, 4, 5])
def test_continuous_equals_lockstep(model, tokenizer, batch, params, slots):
    if slots < params.n:
        pytest.skip("fewer slots than samples per prompt")
    reference = NativeRollout(model, tokenizer).generate(batch, params)
    engine = NativeRollout(model, tokenizer, max_num_seqs=slots)
    out = engine.generate(batch, params)
    assert engine.last_stats["continuous"] == 1.0
    assert engine.last_stats["admissions"] >= 2  # slots were refilled
    assert _same(out, reference) < 1e-4
    waves = NativeRollout(model, tokenizer, max_num_seqs=slots, continuous_batching=False)
    assert _same(waves.generate(batch, params), reference) < 1e-4
    assert waves.last_stats["continuous"] == 0.0


def test_stop_strings_and_bf16_autocast(model, tokenizer, batch):
    params = SamplingParams(n=2, max_new_tokens=16, seed=4, stop_strings=["e", "ab"])
    ref = NativeRollout(model, tokenizer).generate(batch, params)
    assert (
        _same(NativeRollout(model, tokenizer, max_num_seqs=4).generate(batch, params), ref) < 1e-4
    )
    # bf16 autocast: the decode attention reads per-row masks of the slot cache
    greedy = SamplingParams(n=2, max_new_tokens=16, do_sample=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = NativeRollout(model, tokenizer).generate(batch, greedy)
        out = NativeRollout(model, tokenizer, max_num_seqs=4).generate(batch, greedy)
    gap = (out.batch["rollout_log_probs"] - ref.batch["rollout_log_probs"]).abs()
    agree = (out.batch["responses"] == ref.batch["responses"]).float().mean()
    assert agree > 0.95 and float(gap.mean()) < 1e-2


def test_long_tail_refills_slots(model, tokenizer, batch):
    """A scripted long-tail mix: continuous batching takes far fewer decode steps than
    lock-step waves, and both generate the scripted lengths exactly."""
    n, max_new = 2, 64
    rows = len(MORE_PROMPTS) * n
    target = torch.tensor([4, 5, 60, 6, 3, 7, 5, 64, 4, 6, 5, 3, 62, 4])[:rows]

    def scripted_stop(logits, sample_rows, steps):
        logits = logits.clone()
        logits[:, 2] = torch.where(steps + 1 >= target[sample_rows], 1e4, -1e4)
        return logits

    params = SamplingParams(n=n, max_new_tokens=max_new, seed=0, stop_token_ids=[2])
    kwargs = {"max_num_seqs": 4, "logits_processor": scripted_stop}
    cont = NativeRollout(model, tokenizer, **kwargs)
    waves = NativeRollout(model, tokenizer, continuous_batching=False, **kwargs)
    out_c, out_w = cont.generate(batch, params), waves.generate(batch, params)
    assert out_c.batch["response_mask"].sum(-1).tolist() == target.tolist()
    assert _same(out_c, out_w) < 1e-4
    assert cont.last_stats["decode_steps"] < 0.7 * waves.last_stats["decode_steps"]


# per output row: prompts 0-6 x 2 samples; prompts 1, 3 and 6 have a long sample
TAIL = torch.tensor([4, 5, 60, 6, 3, 7, 5, 64, 4, 6, 5, 3, 62, 4])


def _scripted(target: torch.Tensor, calls: list[int] | None = None):
    def scripted_stop(logits, sample_rows, steps):
        if calls is not None:
            calls.append(int(steps.max()))
        logits = logits.clone()
        logits[:, 2] = torch.where(steps + 1 >= target[sample_rows], 1e4, -1e4)
        return logits

    return scripted_stop


@pytest.mark.parametrize("continuous", [True, False], ids=["continuous", "waves"])
def test_groups_stream_out_as_they_finish(model, tokenizer, batch, continuous):
    """Inside stream_groups every prompt's group reaches the sink once, equal to its rows of
    the call's output; with continuous batching the short groups arrive while the long tail
    still decodes (before the last sampling step), in the order they finished."""
    calls: list[int] = []
    engine = NativeRollout(
        model,
        tokenizer,
        max_num_seqs=4,
        continuous_batching=continuous,
        logits_processor=_scripted(TAIL, calls),
    )
    params = SamplingParams(n=2, max_new_tokens=64, seed=3, stop_token_ids=[2])
    seen: list[tuple[int, int]] = []  # (prompt, sampling calls so far)
    groups = {}

    def sink(prompt, group, got_params):
        assert got_params is params
        seen.append((prompt, len(calls)))
        groups[prompt] = group

    with stream_groups(sink):
        out = engine.generate(batch, params)
    assert current_group_sink() is None  # the block restores the context
    assert sorted(p for p, _ in seen) == list(range(len(MORE_PROMPTS)))
    for prompt, group in groups.items():
        rows = slice(2 * prompt, 2 * prompt + 2)
        assert group.batch.keys() == out.batch.keys()
        for key in out.batch:
            assert torch.equal(group.batch[key], out.batch[key][rows]), key
    if continuous:
        order = [p for p, _ in seen]
        # finish order: the short prompts first, the long ones (1, 3, 6) after them
        assert order[:4] == [0, 2, 4, 5] and sorted(order[4:]) == [1, 3, 6]
        # the first group is out long before the last sampling step of the call
        assert seen[0][1] < len(calls) // 4
    else:  # a wave's groups together, when the wave ends (2 prompts per wave)
        assert [p for p, _ in seen] == list(range(len(MORE_PROMPTS)))
        assert seen[0][1] == seen[1][1] < seen[2][1]


def test_too_few_slots_is_refused(model, tokenizer, batch):
    with pytest.raises(ValueError, match=r"decode_slots=2 < rollout.n=3"):
        NativeRollout(model, tokenizer, max_num_seqs=2).generate(
            batch, SamplingParams(n=3, max_new_tokens=2, seed=0)
        )
    with pytest.raises(ValueError, match="decode_slots=0"):
        NativeRollout(model, tokenizer, max_num_seqs=0)


def test_samples_do_not_depend_on_their_batch(model, tokenizer, batch):
    """Per-sample seeding: a prompt's samples are the same alone (at the same output rows,
    i.e. the same seed shifted) as inside the full batch."""
    params = SamplingParams(n=2, max_new_tokens=10, seed=5)
    full = NativeRollout(model, tokenizer).generate(batch, params)
    one = batch[0:1]
    alone = NativeRollout(model, tokenizer).generate(one, params)
    assert torch.equal(alone.batch["responses"], full.batch["responses"][:2])


def test_row_uniforms():
    rows = torch.arange(50_000)
    u = row_uniforms(123, rows, 3)
    assert u.dtype == torch.float32 and float(u.min()) >= 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.std()) - 12**-0.5) < 0.01
    # a function of (seed, row, step) only
    assert torch.equal(row_uniforms(123, rows[7:9], 3), u[7:9])
    assert torch.equal(row_uniforms(123, torch.tensor([9, 7]), torch.tensor([3, 3])), u[[9, 7]])
    assert not torch.equal(row_uniforms(124, rows[:8], 3), u[:8])
    assert not torch.equal(row_uniforms(123, rows[:8], 4), u[:8])
    lag = torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1]
    assert abs(float(lag)) < 0.02
