"""Continuous batching across calls with the rollout copy in a Ray actor
(``verl/workers/copy_feed.py``, driver side ``RayFeed`` in ``verl/trainer/rl/rollout_feed.py``).

The driver offers each queued batch that may join to the copy beside its running call; the
copy's native loop takes it into the free decode slots of the call's tail, keeps its groups
under its own stream token, and the batch's own call continues that loop. Against a copy
whose sampling steps are slowed (a call outlasts many polls; the samples do not change):

- an :class:`AsyncRollout` over the Ray copy (greedy, seeded, a pool of two copies; slow)
  returns, batch by batch and group by group, the samples of separate calls on a copy in
  the driver process (tokens equal, log-probs within 1e-5), and the copy's engine really
  took offered batches (its ``fed_batches`` > 0, each taken batch's call continued its
  loop);
- through ``fit`` with ``max_staleness=0`` (slow): the synchronous run's samples, losses and
  gradient norms (``even_token_reward``: real gradients);
- through ``fit`` with ``max_staleness=1``, where batches join (slow): a run saved after
  step 2 and resumed trains each group once, on the samples of the uninterrupted run (the
  policy's weights fixed, ``lr=0``, so a group's samples depend on its batch only); with
  partial rollouts (``continue``) batches join too and every sample's version is its
  oldest token's, within the bound.

Against a fake copy (fast): each queued batch is offered once, in queue order, with its
call's key, stream token and seed; a fed batch's group kept during an earlier call reaches
its sink once; a copy whose engine takes no offers is offered nothing more.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from verl.controller import Dispatch, register
from verl.protocol import DataProto
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl.async_rollout import AsyncRollout, build_async_rollout
from verl.trainer.rl.trainer import RLTrainer
from verl.workers.rollout_copy import RolloutCopyWorker

from .varied_reward import assert_updates_moved, even_token_reward

SLOW_STEP_S = 0.05  # each sampling step of the slowed copy
TEXTS = ["1+2=", "what is 3 and 4?", "hello", "a", "the cat has", "bb cc dd", "x y", "zz"]
TEXTS += ["7*6=", "one two three", "q", "sum of 9 and 1 is"]
PER_BATCH = 4  # 4 prompts x 2 samples in 6 slots: the 4th prompt runs with 4 slots free
FEED = ("actor_rollout_ref.rollout.decode_slots=6",)
FEED_WARNING = "does not bring the prompts"


class SlowCopy(RolloutCopyWorker):
    """The rollout copy with every sampling step of its native engine slowed by
    :data:`SLOW_STEP_S` (the samples do not change)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        super().init_model(total_steps)
        plain = self.rollout._sample

        def slow(*args, **kwargs):
            time.sleep(SLOW_STEP_S)
            return plain(*args, **kwargs)

        self.rollout._sample = slow


def _prompts(tokenizer, batch: int, greedy: bool) -> DataProto:
    texts = TEXTS[batch * PER_BATCH : (batch + 1) * PER_BATCH]
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding="max_length", max_length=12)
    mask = enc["attention_mask"]
    return DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        },
        meta_info={"do_sample": False} if greedy else {},
    )


def _pipeline(config, tokenizer, weights):
    """The rollout copy of ``config``'s backend and the pipeline over it (its group: the
    placement's only pool)."""
    placement = SimpleNamespace(pools=[])
    actor = SimpleNamespace(state_dict_for_save=lambda: [weights])
    pipe = build_async_rollout(
        config,
        tokenizer,
        None,
        lambda group, prompts: group.generate_sequences(prompts),
        actor,
        placement,
    )
    return pipe, placement.pools[0]


def _generate_all(pipe: AsyncRollout, tokenizer, greedy: bool, stream: bool):
    """Queue three batches with version 0 at once and collect their groups as
    ``{(batch, prompt): its n rows}`` (streamed, or cut from the whole outputs)."""
    pipe.stream_groups = stream
    batches = iter(range(3))
    pipe.fill(lambda: _prompts(tokenizer, next(batches), greedy), 0, limit=3)
    groups: dict[tuple[int, int], DataProto] = {}
    deadline = time.monotonic() + 300
    while pipe._queue and time.monotonic() < deadline:
        pipe.wait_progress(0.05)
        got, _ = pipe.take_groups()
        for group, _, where in got:
            assert where not in groups, where  # each group once
            groups[where] = group
    return groups


@pytest.mark.slow
@pytest.mark.parametrize(
    ("greedy", "copies"), [(True, 1), (False, 1), (False, 2)], ids=["greedy", "seeded", "pool"]
)
def test_ray_feed_equals_separate_calls(
    rl_config, ray_session, monkeypatch, caplog, greedy, copies
):
    from transformers import AutoModelForCausalLM

    import verl.workers.rollout_copy as rollout_copy
    from verl.trainer.rl.build import build_tokenizer

    base = rl_config(*FEED, "trainer.async_rollout=true", "trainer.rollout_mode=streaming")
    tokenizer = build_tokenizer(base)
    model = AutoModelForCausalLM.from_pretrained(base.actor_rollout_ref.model.path)
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}

    # the reference: separate calls (no stream, no feed) on a copy in this process
    local, local_group = _pipeline(base, tokenizer, weights)
    try:
        want = _generate_all(local, tokenizer, greedy, stream=False)
    finally:
        local.close()
        local_group.shutdown()

    monkeypatch.setattr(rollout_copy, "RolloutCopyWorker", SlowCopy)
    ray_config = rl_config(
        *FEED,
        "trainer.async_rollout=true",
        "trainer.rollout_mode=streaming",
        "trainer.backend=ray",
        f"trainer.rollout_copies={copies}",
    )
    streamed: list[tuple[int, int]] = []  # (batch, prompt) of each group the sink had
    plain_sink_for = AsyncRollout._sink_for

    def recording_sink_for(self, item, prompts):
        sink = plain_sink_for(self, item, prompts)

        def recorded(prompt, rows, params):
            streamed.append((item.index, prompt))
            sink(prompt, rows, params)

        return recorded

    monkeypatch.setattr(AsyncRollout, "_sink_for", recording_sink_for)
    pipe, group = _pipeline(ray_config, tokenizer, weights)
    try:
        assert type(group).__name__ == "RayWorkerGroup"
        with caplog.at_level(logging.WARNING):
            got = _generate_all(pipe, tokenizer, greedy, stream=True)
        stats = group.feed_stats()
    finally:
        pipe.close()
        group.shutdown()
    # groups came out of the copy through the polls (the running call's and the offered
    # batches'), a fed batch's too; those finished in a call's last poll interval come
    # with its whole output
    assert len(set(streamed)) >= 6 and 1 in {b for b, _ in streamed}, streamed
    assert FEED_WARNING not in caplog.text
    # batch 0's call took batch 1 into its tail, batch 1's (continued) took batch 2
    assert stats["fed_batches"] >= 1 and stats["taken"] >= 1, stats
    assert stats["continued"] == stats["taken"], stats
    assert sorted(got) == sorted(want) == [(b, p) for b in range(3) for p in range(PER_BATCH)]
    for where, group_out in want.items():
        keys = set(group_out.batch) & set(got[where].batch)
        assert {"responses", "response_mask", "input_ids"} <= keys, keys
        for key in keys - {"rollout_log_probs"}:  # the samples: bit-identical
            assert torch.equal(got[where].batch[key], group_out.batch[key]), (where, key)
        # float sums over another slot layout: the last bits only (test_continuous_feed)
        gap = got[where].batch["rollout_log_probs"] - group_out.batch["rollout_log_probs"]
        assert float(gap.abs().max()) < 1e-5, where
    assert not [t for t in threading.enumerate() if t.name.startswith("verl-rollout-")]


def _fit(config, on_trainer=None):
    """``fit`` with ``even_token_reward``; returns the trainer and each step's trained batch
    as ``(responses, uids)``."""
    trainer = RLTrainer(config, reward_fn=even_token_reward, tracker=Tracker([]))
    if on_trainer is not None:
        on_trainer(trainer)
    trained = []
    update = trainer.update_policy

    def recording_update(gen):
        trained.append((gen.batch["responses"].clone(), list(gen.non_tensor_batch["uid"])))
        return update(gen)

    trainer.update_policy = recording_update
    trainer.fit()  # on Ray, its worker groups are shut down at the end
    return trainer, trained


def _watch_feed(stats: list[dict[str, float]]):
    """An ``on_trainer`` hook: after each call of the Ray copy, its feed counters."""

    def on_trainer(trainer):
        group = trainer.async_rollout.group
        assert type(group).__name__ == "RayWorkerGroup"
        plain = group.generate_sequences

        def counted(prompts):
            out = plain(prompts)
            stats.append(group.feed_stats())
            return out

        group.generate_sequences = counted

    return on_trainer


RAY_STREAM = (
    *FEED,
    "actor_rollout_ref.rollout.seed=11",
    "trainer.total_training_steps=3",
    "trainer.backend=ray",
    "trainer.async_rollout=true",
    "trainer.rollout_mode=streaming",
)


@pytest.mark.slow
def test_max_staleness_0_on_ray_with_the_feed_trains_the_sync_samples(
    rl_config, ray_session, monkeypatch, caplog
):
    import verl.workers.rollout_copy as rollout_copy

    sync, sync_samples = _fit(
        rl_config(*FEED, "actor_rollout_ref.rollout.seed=11", "trainer.total_training_steps=3")
    )
    assert_updates_moved(sync.history)
    monkeypatch.setattr(rollout_copy, "RolloutCopyWorker", SlowCopy)
    stats: list[dict[str, float]] = []
    with caplog.at_level(logging.WARNING):
        streaming, samples = _fit(
            rl_config(*RAY_STREAM, "trainer.max_staleness=0"), _watch_feed(stats)
        )
    assert FEED_WARNING not in caplog.text
    assert len(stats) >= 3  # every call ran with its feed key
    assert len(samples) == len(sync_samples) == 3
    for (got, _), (want, _) in zip(samples, sync_samples):
        assert torch.equal(got, want)
    for got, want in zip(streaming.history, sync.history, strict=True):  # the same updates
        for key in ("actor/pg_loss", "actor/grad_norm"):
            assert abs(got[key] - want[key]) <= 1e-6 * max(1.0, abs(want[key])), key
    assert [m["async/staleness_max"] for m in streaming.history] == [0.0, 0.0, 0.0]


@pytest.mark.slow
def test_fed_batches_on_ray_resume_with_each_group_once(
    rl_config, ray_session, monkeypatch, caplog, tmp_path
):
    """max_staleness=1 (two batches queued together: the second joins the first's call),
    the weights fixed (lr=0) so a group's samples depend on its batch only: the straight
    run (saved after step 2) and its first two steps followed by a run resumed from that
    checkpoint each train every group once, and a group both train has the same samples."""
    import verl.workers.rollout_copy as rollout_copy

    monkeypatch.setattr(rollout_copy, "RolloutCopyWorker", SlowCopy)
    fixed = (*RAY_STREAM, "trainer.max_staleness=1", "actor_rollout_ref.actor.optim.lr=0")
    fixed += ("trainer.val_before_train=false", "trainer.save_freq=2")
    stats: list[dict[str, float]] = []
    straight_dir, run_dir = tmp_path / "straight", tmp_path / "resumed"
    with caplog.at_level(logging.WARNING):
        _, straight = _fit(
            rl_config(*fixed, f"trainer.default_local_dir={straight_dir}"), _watch_feed(stats)
        )
        shutil.copytree(straight_dir / "global_step_2", run_dir / "global_step_2")
        _, after = _fit(
            rl_config(*fixed, "trainer.resume_mode=auto", f"trainer.default_local_dir={run_dir}")
        )
    assert FEED_WARNING not in caplog.text
    assert stats[-1]["fed_batches"] >= 1 and stats[-1]["continued"] >= 1, stats
    before = straight[:2]
    assert len(straight) == 3 and len(after) == 1

    def by_uid(run):
        groups: dict[str, torch.Tensor] = {}
        for responses, uids in run:
            for uid in dict.fromkeys(uids):
                rows = [i for i, u in enumerate(uids) if u == uid]
                assert uid not in groups, uid  # each group trained once
                assert len(rows) == 2  # its n samples together
                groups[uid] = responses[rows]
        return groups

    want, got = by_uid(straight), by_uid(before + after)
    assert len(want) == len(got) == 12
    shared = set(want) & set(got)
    # the resumed step's groups are among those compared (the first two steps are shared)
    assert set(by_uid(after)) & shared, (sorted(want), sorted(got))
    for uid in shared:
        assert torch.equal(got[uid], want[uid]), uid


@pytest.mark.slow
def test_partial_rollouts_feed_batches_on_ray(rl_config, ray_session, monkeypatch, caplog):
    """Partial rollouts (``continue``) with the copy's own mailbox: a batch joins the
    running call whatever version it was queued with, its own call continues the loop
    without loading the mailbox's post first (the loop takes posts between decode steps),
    and every trained sample's version is its oldest token's, within the staleness bound."""
    import verl.workers.rollout_copy as rollout_copy

    from .taken_batches import assert_token_versions, fit_recording_batches

    monkeypatch.setattr(rollout_copy, "RolloutCopyWorker", SlowCopy)
    config = rl_config(
        *RAY_STREAM,
        "trainer.max_staleness=1",
        "trainer.partial_rollout=continue",
        "actor_rollout_ref.actor.rollout_is_threshold=2.0",
        "trainer.val_before_train=false",
    )
    trainer = RLTrainer(config, reward_fn=even_token_reward, tracker=Tracker([]))
    stats: list[dict[str, float]] = []
    _watch_feed(stats)(trainer)
    with caplog.at_level(logging.WARNING):
        taken = fit_recording_batches(trainer)
    assert FEED_WARNING not in caplog.text
    assert stats[-1]["fed_batches"] >= 1 and stats[-1]["continued"] >= 1, stats
    assert len(taken) == 3
    for step, gen in enumerate(taken):
        assert_token_versions(gen, step)
    assert_updates_moved(trainer.history)


class _FeedingCopy:
    """A copy group in another process, as the pipeline sees it: call 0 "takes" the offered
    batch 1 into its loop (a group of batch 1 kept under batch 1's token mid-call), later
    calls run their own batches; ``feeds``: what ``offer_batch`` answers."""

    def __init__(self, feeds: bool) -> None:
        self.feeds = feeds
        self.offers: list[tuple[list[int], str, int]] = []
        self.calls: list[tuple[str, list[int]]] = []
        self.kept: list[tuple[str, int, DataProto, float]] = []
        self.lock = threading.Lock()

    def load_policy_weights(self, state, version):
        return [{"async/weight_sync_seconds": 0.0}]

    def offer_batch(self, prompts, key, token):
        self.offers.append((key, token, int(prompts.meta_info["seed"])))
        return {"feeds": self.feeds}

    def take_streamed_groups(self, token):
        with self.lock:
            taken = [g for g in self.kept if g[0] == token]
            self.kept = [g for g in self.kept if g[0] != token]
        return [(p, g, t) for _, p, g, t in taken]

    def generate(self, _group, prompts: DataProto) -> DataProto:
        token, key = prompts.meta_info["stream_token"], prompts.meta_info["feed_key"]
        self.calls.append((token, key))
        rows = prompts.batch["x"].repeat_interleave(2)
        if token == "0-0":
            time.sleep(0.3)  # the offers arrive
            fed = DataProto.from_dict({"x": torch.tensor([10, 10]) + 100})
            with self.lock:
                self.kept.append(("0-1", 0, fed, 1.0))
            time.sleep(0.3)  # several polls
        return DataProto.from_dict({"x": rows})


@pytest.mark.parametrize("feeds", [True, False], ids=["feeding", "not_feeding"])
def test_queued_batches_are_offered_once_in_order(monkeypatch, feeds):
    """The driver's side against a fake copy: every queued batch that may join is offered
    with its call's key, stream token and seed, in queue order, once; a fed batch's group
    kept during an earlier call reaches its sink once (not again from its own output); a
    copy that takes no offers is offered nothing more."""
    monkeypatch.setattr(AsyncRollout, "_copy_in_other_process", lambda self: True)
    copy_group = _FeedingCopy(feeds)
    pipe = AsyncRollout(copy_group, copy_group.generate, lambda: {}, max_staleness=2, seed=0)
    pipe.stream_groups = True
    values = iter([torch.tensor([10, 20]), torch.tensor([30, 40]), torch.tensor([50, 60])])
    try:
        pipe.fill(lambda: DataProto.from_dict({"x": next(values)}), 0, limit=3)
        groups = []
        deadline = time.monotonic() + 30
        while pipe._queue and time.monotonic() < deadline:
            pipe.wait_progress(0.05)
            groups += pipe.take_groups()[0]
    finally:
        pipe.close()
    assert [c[0] for c in copy_group.calls] == ["0-0", "0-1", "0-2"]
    assert [c[1] for c in copy_group.calls] == [[0, 0], [0, 1], [0, 2]]
    if feeds:
        assert copy_group.offers == [([0, 1], "0-1", pipe.seed_for(1)), ([0, 2], "0-2", 2)]
    else:
        assert len(copy_group.offers) == 1  # the first answer stops the offers
    where = sorted(w for _, _, w in groups)
    assert where == [(b, p) for b in range(3) for p in range(2)]  # each group once
    fed = next(g for g, _, w in groups if w == (1, 0))
    assert fed.batch["x"].tolist() == ([110, 110] if feeds else [30, 30])
    assert not [t for t in threading.enumerate() if t.name.startswith("verl-rollout-")]


def test_no_offer_under_a_dropped_queues_key(monkeypatch):
    """A queue drop (a checkpoint load, ``close``) counts the dropped queues up before it
    cancels the queued batches: an offer made between the two must not name a queued batch
    of the old queue with the new queue's key (a new batch of that index would be deduped
    away by the copy and get the old prompts' groups under its token). The running call's
    feed offers under its own queue's key, and nothing once the queue is being dropped."""
    from concurrent.futures import Future

    from verl.trainer.rl.async_rollout import _InFlight
    from verl.trainer.rl.rollout_feed import RayFeed

    monkeypatch.setattr(AsyncRollout, "_copy_in_other_process", lambda self: True)
    copy_group = _FeedingCopy(feeds=True)
    pipe = AsyncRollout(copy_group, copy_group.generate, lambda: {}, max_staleness=2, seed=0)
    try:
        for index in range(3):
            item = _InFlight(DataProto.from_dict({"x": torch.tensor([index])}), 0, index)
            item.result = Future() if index < 2 else None  # batch 2: not queued yet
            pipe._queue.append(item)
        feed = RayFeed(pipe, pipe._queue[0])
        feed.offer_ready()
        assert [o[0] for o in copy_group.offers] == [[0, 1]]
        pipe._queue[2].result = Future()
        pipe._epoch += 1  # a drop has begun; its cancels have not reached the queue yet
        feed.offer_ready()
        assert [o[0] for o in copy_group.offers] == [[0, 1]]  # none with the new key
        assert [token for token, _ in feed.offered] == ["0-1"]
    finally:
        pipe._queue.clear()
        pipe.close()
