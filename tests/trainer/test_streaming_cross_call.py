"""Continuous batching across the rollouter's calls (``verl/trainer/rl/rollout_feed.py``):
an :class:`AsyncRollout` over a copy with a real native engine (tiny model, ``decode_slots``
4). Batches queued with the weights the copy holds join the running call's free slots (a
later batch starts before the earlier call's long row stops) and still come out, batch by
batch and group by group, equal to calls of their own; a batch queued with newer weights
is never mixed into a running call: it starts after the load, between two calls."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from verl.models.tiny import build_tiny_model, build_tiny_tokenizer
from verl.protocol import DataProto
from verl.rollout import SamplingParams
from verl.rollout.native import NativeRollout
from verl.trainer.rl.async_rollout import AsyncRollout

PARAMS = SamplingParams(n=2, max_new_tokens=48, seed=0, temperature=1.0, stop_token_ids=[2])
TEXTS = ["1+2=", "what is 3 and 4?", "hello", "a", "the cat has", "bb cc dd", "x y", "zz"]
PER_BATCH = 2  # prompts per generation batch
LONG_BATCH = 0  # its row 1 runs 40 tokens, every other row 3-6


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_tiny_tokenizer()
    tokenizer.padding_side = "left"
    model = build_tiny_model(tokenizer=tokenizer, hidden_size=64, num_layers=2, seed=0)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.25)
    return model.eval(), tokenizer


class _Scripted(NativeRollout):
    """Scripted lengths by the call's seed (the batch whose seed is ``long_seed`` has a
    long row 1); logs (seed, largest token index) of every sampling step."""

    long_seed: int | None = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log: list[tuple[int, int]] = []

    def _sample(self, logits, rows, steps, params, seed):
        steps = torch.as_tensor(steps).expand_as(rows)
        self.log.append((params.seed, int(steps.max())))
        target = 3 + (rows * 7 + params.seed) % 4
        if params.seed == self.long_seed:
            target = torch.where(rows == 1, 40, target)
        logits = logits.clone()
        logits[:, 2] = torch.where(steps + 1 >= target, 1e4, -1e4)
        return super()._sample(logits, rows, steps, params, seed)


class _EngineCopy:
    """A rollout copy group of one: the native engine on a module of its own."""

    def __init__(self, model, tokenizer, long_seed):
        self.module = copy.deepcopy(model)
        self.engine = _Scripted(self.module, tokenizer, max_num_seqs=4)
        self.engine.long_seed = long_seed
        self.loads: list[int] = []

    def load_policy_weights(self, state, version):
        self.engine.drop_session()  # as RolloutCopyWorker.load_policy_weights
        self.module.load_state_dict(state)
        self.loads.append(version)
        return [{"async/weight_sync_seconds": 0.0}]

    def generate(self, group, prompts: DataProto) -> DataProto:
        return self.engine.generate(prompts, _params(prompts))


def _params(prompts):
    return dataclasses.replace(PARAMS, seed=int(prompts.meta_info["seed"]))


def _draws(tokenizer):
    enc = tokenizer(TEXTS, return_tensors="pt", padding="max_length", max_length=12)
    batches = iter(range(0, len(TEXTS), PER_BATCH))

    def draw():
        i = next(batches)
        return DataProto.from_dict(
            tensors={
                "input_ids": enc["input_ids"][i : i + PER_BATCH],
                "attention_mask": enc["attention_mask"][i : i + PER_BATCH],
            }
        )

    return draw


def _weights(module, scale):
    return {
        k: v.clone() * (scale if "norm" not in k else 1.0) for k, v in module.state_dict().items()
    }


def _pipeline(tiny, versions):
    """Queue one batch per entry of ``versions`` (the trainer's weights at queue time: the
    model's scaled by 1 + version / 10)."""
    model, tokenizer = tiny
    seed_of = lambda index: 3 * 1_000_003 + index  # noqa: E731 (AsyncRollout's default)
    rollout_copy = _EngineCopy(model, tokenizer, long_seed=seed_of(LONG_BATCH))
    current = {"version": 0}
    pipe = AsyncRollout(
        rollout_copy,
        rollout_copy.generate,
        lambda: _weights(model, 1 + current["version"] / 10),
        max_staleness=len(versions),
        seed=3,
    )
    pipe.stream_groups = True  # streaming (the source sets it): groups out, calls fed
    draw, prompts = _draws(tokenizer), []
    for version in versions:
        current["version"] = version
        before = len(pipe)
        pipe.fill(lambda: prompts.append(draw()) or prompts[-1], version, limit=before + 1)
    return pipe, rollout_copy, prompts, seed_of


def _alone(tiny, prompts, seed, scale):
    """The batch generated by a call of its own, on weights ``scale``."""
    model, tokenizer = tiny
    module = copy.deepcopy(model)
    module.load_state_dict(_weights(model, scale))
    engine = _Scripted(module, tokenizer, max_num_seqs=4)
    engine.long_seed = 3 * 1_000_003 + LONG_BATCH
    seeded = DataProto.from_dict(tensors=dict(prompts.batch), meta_info={"seed": seed})
    return engine.generate(seeded, _params(seeded))


def _check_whole_batches(tiny, pipe, prompts, seed_of, scales):
    # the groups each call's sink received, fed batches' included
    groups = [(group, item.index, prompt) for item in pipe._queue for prompt, group in item.ready]
    assert len(groups) == PER_BATCH * len(scales)
    outs = []
    for index, scale in enumerate(scales):
        gen, _, _ = pipe.pop_any()
        ref = _alone(tiny, prompts[index], seed_of(index), scale)
        assert torch.equal(gen.batch["responses"], ref.batch["responses"]), index
        assert torch.equal(gen.batch["response_mask"], ref.batch["response_mask"]), index
        gap = (gen.batch["rollout_log_probs"] - ref.batch["rollout_log_probs"]).abs().max()
        assert float(gap) < 1e-5, (index, float(gap))
        outs.append(gen)
    # every streamed group is its rows of its batch's whole output
    for group, index, prompt in groups:
        rows = slice(PARAMS.n * prompt, PARAMS.n * prompt + PARAMS.n)
        assert torch.equal(group.batch["responses"], outs[index].batch["responses"][rows])
    return outs


def test_same_weights_batches_join_the_running_call(tiny):
    pipe, rollout_copy, prompts, seed_of = _pipeline(tiny, versions=[0, 0, 0])
    try:
        pipe._finish()
        log = rollout_copy.engine.log
        first = {i: min(k for k, (s, _) in enumerate(log) if s == seed_of(i)) for i in range(3)}
        last = {i: max(k for k, (s, _) in enumerate(log) if s == seed_of(i)) for i in range(3)}
        # batches 1 and 2 started (and ended) while batch 0's long row still decoded
        assert first[1] < last[0] and first[2] < last[0]
        assert last[1] < last[0] and last[2] < last[0]
        assert rollout_copy.loads == [0]  # one load, before the first call
        assert [i.claimed for i in pipe._queue] == [False, True, True]
        _check_whole_batches(tiny, pipe, prompts, seed_of, [1.0, 1.0, 1.0])
        assert rollout_copy.engine._session is None
    finally:
        pipe.close()


def test_newer_weights_wait_for_their_load(tiny):
    """Batch 1 is queued with version 1: it starts only after batch 0's call has ended and
    the copy loaded version 1; batch 2 (version 1 too) joins batch 1's call."""
    pipe, rollout_copy, prompts, seed_of = _pipeline(tiny, versions=[0, 1, 1])
    try:
        pipe._finish()
        log = rollout_copy.engine.log
        first = {i: min(k for k, (s, _) in enumerate(log) if s == seed_of(i)) for i in range(3)}
        last = {i: max(k for k, (s, _) in enumerate(log) if s == seed_of(i)) for i in range(3)}
        assert first[1] > last[0] and first[2] > last[0]  # never mixed into batch 0's call
        assert rollout_copy.loads == [0, 1]
        assert [i.claimed for i in pipe._queue] == [False, False, True]
        _check_whole_batches(tiny, pipe, prompts, seed_of, [1.0, 1.1, 1.1])
    finally:
        pipe.close()


def test_partial_rollouts_feed_batches_of_any_version(tiny):
    """With a weight mailbox every queued batch may join (its tokens record the version
    that sampled them): batch 1, queued with version 1 while the copy holds 0, is fed and
    its tokens say 0."""
    from verl.rollout.partial import TOKEN_VERSIONS, WeightMailbox

    model, tokenizer = tiny
    seed_of = lambda index: 3 * 1_000_003 + index  # noqa: E731
    rollout_copy = _EngineCopy(model, tokenizer, long_seed=seed_of(LONG_BATCH))
    pipe = AsyncRollout(
        rollout_copy,
        rollout_copy.generate,
        lambda: _weights(model, 1.0),
        max_staleness=2,
        seed=3,
        mailbox=WeightMailbox("continue"),
    )
    pipe.stream_groups = True
    draw, prompts = _draws(tokenizer), []
    try:
        for version in (0, 1):
            pipe.fill(lambda: prompts.append(draw()) or prompts[-1], version, limit=version + 1)
        pipe._finish()
        assert [i.claimed for i in pipe._queue] == [False, True]
        for index in range(2):
            gen, _, _ = pipe.pop_any()
            ref = _alone(tiny, prompts[index], seed_of(index), 1.0)
            assert torch.equal(gen.batch["responses"], ref.batch["responses"])
            versions = gen.batch[TOKEN_VERSIONS][gen.batch["response_mask"].bool()]
            assert versions.unique().tolist() == [0]
    finally:
        pipe.close()


@pytest.mark.slow
@pytest.mark.parametrize("partial", ["off", "continue"])
def test_a_streaming_run_continues_fed_batches_through_the_worker(
    rl_config, monkeypatch, caplog, partial
):
    """Through ``fit`` and the real rollout copy worker: the batches the initial fill queues
    together join the first call, and their own calls (the worker builds their sampling from
    the batch's seed) continue the loop instead of generating afresh."""
    import logging

    from verl.trainer.lifecycle.tracking import Tracker
    from verl.trainer.rl.trainer import RLTrainer

    calls: list[dict[str, float]] = []
    original = NativeRollout.generate

    def recording(self, prompts, params):
        out = original(self, prompts, params)
        calls.append(dict(self.last_stats))
        return out

    monkeypatch.setattr(NativeRollout, "generate", recording)
    config = rl_config(
        # 4 prompts x 2 samples, 6 slots: the 4th prompt runs alone, 4 slots free
        "actor_rollout_ref.rollout.decode_slots=6",
        "trainer.async_rollout=true",
        "trainer.rollout_mode=streaming",
        "trainer.max_staleness=1",
        f"trainer.partial_rollout={partial}",
        "actor_rollout_ref.actor.rollout_is_threshold=2.0",
        "trainer.total_training_steps=3",
    )
    with caplog.at_level(logging.WARNING):
        trainer = RLTrainer(config, tracker=Tracker([]))
        trainer.fit()
    assert len(trainer.history) == 3
    assert "does not bring the prompts" not in caplog.text
    fed = sum(c.get("fed_batches", 0.0) for c in calls)
    resumed = sum(c.get("resumed", 0.0) for c in calls)
    assert fed >= 1 and resumed >= 1, calls
