"""Continuous batching across generation calls (``verl/rollout/continuous.py``, "Across
calls"): inside ``feed_prompts`` a call's free slots take the next queued batch, whose own
call then continues the engine's loop. Every sample equals a call of its own (greedy,
seeded sampling, n > 1, stop tokens), the next batch starts while the earlier call's long
tail decodes, its groups stream to its own sink, and a call that does not bring the fed
batch (or a dropped session) generates afresh."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from verl.protocol import DataProto
from verl.rollout import SamplingParams
from verl.rollout.continuous import FedBatch, current_prompt_feed, feed_prompts
from verl.rollout.native import NativeRollout

PROMPTS_A = ["1+2=", "what is the sum of 3 and 4? the answer is", "hello", "a"]
PROMPTS_B = ["the cat has 5 apples and the dog has", "bb cc dd", "x y z w v u"]
PROMPTS_C = ["zz top", "what is 7 times 6?"]
SEEDS = {"A": 11, "B": 12, "C": 13}
# scripted lengths per output row: A's row 1 (prompt 0's second sample) is the long tail
LONG = torch.tensor([5, 60, 4, 6, 3, 7, 5, 4, 6, 5, 3, 6])
SHORT = torch.tensor([5, 7, 4, 6, 3, 7, 5, 4, 6, 5, 3, 6])


def _batch(tokenizer, texts, seed, width=16):
    enc = tokenizer(texts, return_tensors="pt", padding="max_length", max_length=width)
    return DataProto.from_dict(
        tensors={"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
        meta_info={"seed": seed},
    )


class _Feed:
    """A fixed queue of batches, offered in order to the call named ``key``."""

    def __init__(self, key, queue, sinks=None):
        self.key, self.queue, self.sinks = key, queue, sinks or {}
        self.asked = 0

    def next_batch(self, accept):
        self.asked += 1
        if not self.queue or not accept(self.queue[0][1]):
            return None
        key, prompts = self.queue.pop(0)
        return FedBatch(key, prompts, self.sinks.get(key))


class _Scripted(NativeRollout):
    """The stop token at each row's scripted length (``LONG`` for the call seeded
    ``SEEDS["A"]``, ``SHORT`` for the others); records (call seed, largest token index)
    of every sampling step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log: list[tuple[int | None, int]] = []

    def _sample(self, logits, rows, steps, params, seed):
        steps = torch.as_tensor(steps).expand_as(rows)
        self.log.append((params.seed, int(steps.max())))
        target = LONG if params.seed == SEEDS["A"] else SHORT
        logits = logits.clone()
        logits[:, 2] = torch.where(steps + 1 >= target[rows], 1e4, -1e4)
        return super()._sample(logits, rows, steps, params, seed)


def _same(a, b) -> None:
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert torch.equal(a.batch["response_mask"], b.batch["response_mask"])
    # fp32 log-probs of rows decoded beside other rows: the matmuls' rounding depends on the
    # batch's rows and the CPU's kernels (1.1e-5 seen with AVX2 only); a row mixed up with
    # another would be off by far more
    gap = float((a.batch["rollout_log_probs"] - b.batch["rollout_log_probs"]).abs().max())
    assert gap < 1e-4, gap


PARAMS = [
    SamplingParams(n=2, max_new_tokens=64, do_sample=False, stop_token_ids=[2]),
    SamplingParams(n=3, max_new_tokens=64, seed=0, temperature=1.0, stop_token_ids=[2]),
    SamplingParams(n=2, max_new_tokens=64, seed=0, top_p=0.9, stop_token_ids=[2, 5, 9]),
]


def _call_params(params, prompts):
    """What the worker builds for a call: the run's sampling, the batch's seed."""
    return dataclasses.replace(params, seed=prompts.meta_info["seed"])


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "n3", "top_p_stops"])
def test_fed_batches_equal_calls_of_their_own(model, tokenizer, params):
    batches = {
        key: _batch(tokenizer, texts, SEEDS[key])
        for key, texts in (("A", PROMPTS_A), ("B", PROMPTS_B), ("C", PROMPTS_C))
    }
    slots = 2 * params.n
    alone = _Scripted(model, tokenizer, max_num_seqs=slots)
    reference, alone_steps = {}, 0.0
    for key, b in batches.items():
        reference[key] = alone.generate(b, _call_params(params, b))
        assert alone.last_stats.get("resumed", 0.0) == 0.0
        alone_steps += alone.last_stats["decode_steps"]

    engine = _Scripted(model, tokenizer, max_num_seqs=slots)
    queue = [("B", batches["B"]), ("C", batches["C"])]
    outs, stats = {}, {}
    for key in "ABC":
        feed = _Feed(key, queue)
        with feed_prompts(feed):
            assert current_prompt_feed() is feed
            outs[key] = engine.generate(batches[key], _call_params(params, batches[key]))
        stats[key] = engine.last_stats
    assert current_prompt_feed() is None
    for key in "ABC":
        _same(outs[key], reference[key])
    # A's call took B and C into the slots its long row (60 tokens) left free
    assert stats["A"]["fed_batches"] == 2 and stats["A"]["resumed"] == 0
    assert stats["B"]["resumed"] == 1 and stats["C"]["resumed"] == 1
    assert engine._session is None  # nothing left in flight
    # B's and C's rows all stopped before A's longest row did: their calls had nothing left
    a_last = max(i for i, (seed, _) in enumerate(engine.log) if seed == SEEDS["A"])
    for key in "BC":
        mine = [i for i, (seed, _) in enumerate(engine.log) if seed == SEEDS[key]]
        assert mine and max(mine) < a_last
        assert stats[key]["decode_steps"] == 0
    assert stats["A"]["decode_steps"] < alone_steps - 10


def test_fed_groups_stream_to_their_own_sink(model, tokenizer):
    """B's groups reach B's sink during A's call (before A's long row stops), each equal to
    its rows of B's whole output."""
    params = SamplingParams(n=2, max_new_tokens=64, seed=0, stop_token_ids=[2])
    a, b = _batch(tokenizer, PROMPTS_A, SEEDS["A"]), _batch(tokenizer, PROMPTS_B, SEEDS["B"])
    engine = _Scripted(model, tokenizer, max_num_seqs=4)
    got: dict[int, tuple[DataProto, int]] = {}

    def sink_b(prompt, group, got_params):
        assert got_params.seed == SEEDS["B"]
        got[prompt] = (group, len(engine.log))

    with feed_prompts(_Feed("A", [("B", b)], sinks={"B": sink_b})):
        engine.generate(a, _call_params(params, a))
    a_steps = len(engine.log)
    assert sorted(got) == [0, 1, 2]  # every B group was out before A's call returned
    with feed_prompts(_Feed("B", [])):
        out_b = engine.generate(b, _call_params(params, b))
    assert engine.last_stats["resumed"] == 1
    for prompt, (group, at) in got.items():
        assert at <= a_steps
        for key in out_b.batch:
            assert torch.equal(group.batch[key], out_b.batch[key][2 * prompt : 2 * prompt + 2])


def test_a_call_without_its_batch_generates_afresh(model, tokenizer, caplog):
    params = SamplingParams(n=2, max_new_tokens=64, seed=0, stop_token_ids=[2])
    a, b = _batch(tokenizer, PROMPTS_A, SEEDS["A"]), _batch(tokenizer, PROMPTS_B, SEEDS["B"])
    other = _batch(tokenizer, PROMPTS_C, SEEDS["B"])
    ref = _Scripted(model, tokenizer, max_num_seqs=4)
    engine = _Scripted(model, tokenizer, max_num_seqs=4)
    # B's call brings other prompts under B's key: refused, generated afresh
    with feed_prompts(_Feed("A", [("B", b)])):
        engine.generate(a, _call_params(params, a))
    assert engine._session is not None
    with caplog.at_level(logging.WARNING), feed_prompts(_Feed("B", [])):
        out = engine.generate(other, _call_params(params, other))
    assert "does not bring the prompts" in caplog.text
    assert engine.last_stats["resumed"] == 0
    _same(out, ref.generate(other, _call_params(params, other)))
    # a weight load drops the waiting loop: B's call starts afresh, same samples
    with feed_prompts(_Feed("A", [("B", b)])):
        engine.generate(a, _call_params(params, a))
    engine.drop_session()
    with feed_prompts(_Feed("B", [])):
        out = engine.generate(b, _call_params(params, b))
    assert engine.last_stats["resumed"] == 0
    _same(out, ref.generate(b, _call_params(params, b)))
    # a call outside any feed drops it too
    with feed_prompts(_Feed("A", [("B", b)])):
        engine.generate(a, _call_params(params, a))
    engine.generate(other, _call_params(params, other))
    assert engine._session is None


def test_feed_is_not_used_without_decode_slots_or_for_wide_prompts(model, tokenizer):
    params = SamplingParams(n=2, max_new_tokens=8, seed=0, stop_token_ids=[2])
    a, b = _batch(tokenizer, PROMPTS_A, SEEDS["A"]), _batch(tokenizer, PROMPTS_B, SEEDS["B"])
    feed = _Feed("A", [("B", b)])
    with feed_prompts(feed):
        NativeRollout(model, tokenizer).generate(a, _call_params(params, a))
    assert feed.asked == 0 and feed.queue  # whole-batch engine: no slots to share
    long_text = "one two three four five six seven eight nine ten eleven twelve thirteen"
    wide = _batch(tokenizer, [long_text, "a"], SEEDS["B"], width=32)
    assert int(wide.batch["attention_mask"].sum(-1).max()) > 16  # A's prompts: 16 columns
    feed = _Feed("A", [("B", wide)])
    engine = _Scripted(model, tokenizer, max_num_seqs=4)
    with feed_prompts(feed):
        engine.generate(a, _call_params(params, a))
    assert feed.asked > 0 and feed.queue  # wider than A's cache: refused
    assert engine._session is None
