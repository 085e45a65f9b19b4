"""The rollout copy's side of continuous batching across calls (``verl/workers/copy_feed.py``):
offers are taken in queue order, never past one that does not fit; a call's start forgets
the offers and taken batches up to its key (a dropped queue's included) and tells whether
its batch was taken; a weight load forgets the taken batches; a pool rank takes only
batches of its running share's length."""

from __future__ import annotations

import torch

from verl.protocol import DataProto
from verl.workers.copy_feed import CopyFeed


def _batch(rows: int, seed: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"input_ids": torch.full((rows, 3), seed)}, meta_info={"seed": seed}
    )


def _feed_of(feed: CopyFeed, key, rows: int = 2, same_rows: bool = False, held=7):
    return feed.prompt_feed(
        key, _batch(rows, 0), lambda offer: offer.token, lambda: held, same_rows
    )


def test_offers_are_taken_in_queue_order_and_continued_by_their_calls():
    feed = CopyFeed()
    feed.offer(_batch(2, 12), [0, 2], "0-2")  # arrives before the batch ahead of it
    feed.offer(_batch(2, 11), [0, 1], "0-1")
    feed.offer(_batch(2, 11), [0, 1], "0-1")  # offered again by the next call: kept once
    assert feed.start_call([0, 0]) is None
    running = _feed_of(feed, [0, 0])
    fits = {11: False, 12: True}
    accept = lambda prompts: fits[prompts.meta_info["seed"]]  # noqa: E731
    assert running.next_batch(accept) is None  # 0-1 does not fit: 0-2 never passes it
    fits[11] = True
    fed = running.next_batch(accept)
    assert fed.key == (0, 1) and fed.sink == "0-1" and fed.prompts.meta_info["seed"] == 11
    assert running.next_batch(accept).key == (0, 2)
    assert running.next_batch(accept) is None
    assert feed.live_tokens() == {"0-1", "0-2"}
    feed.end_call([0, 0])
    taken = feed.start_call([0, 1])  # the batch's own call: it continues the loop
    assert taken is not None and taken.version == 7 and taken.token == "0-1"
    assert feed.live_tokens() == {"0-1", "0-2"}
    feed.end_call([0, 1])
    assert feed.live_tokens() == {"0-2"}
    assert feed.stats == {"offered": 2, "taken": 2, "continued": 1, "fed_batches": 0.0}


def test_a_call_start_forgets_older_offers_and_a_load_the_taken_batches():
    feed = CopyFeed()
    for index in (1, 2, 3):
        feed.offer(_batch(2, index), [0, index], f"0-{index}")
    assert feed.start_call([0, 2]) is None  # batch 2 runs afresh: offers 1 and 2 go
    running = _feed_of(feed, [0, 2])
    assert running.next_batch(lambda p: True).key == (0, 3)
    feed.end_call([0, 2])
    feed.drop_taken()  # a weight load dropped the loop's rows
    assert feed.live_tokens() == set()
    assert feed.start_call([0, 3]) is None  # generated afresh
    feed.offer(_batch(2, 5), [0, 5], "0-5")
    assert feed.start_call([1, 0]) is None  # a dropped queue: its offers are older
    assert _feed_of(feed, [1, 0]).next_batch(lambda p: True) is None


def test_a_pool_rank_takes_only_its_running_shares_length():
    feed = CopyFeed()
    feed.offer(_batch(3, 1), [0, 1], "0-1")
    shifted = _feed_of(feed, [0, 0], rows=2, same_rows=True)
    assert shifted.next_batch(lambda p: True) is None
    assert _feed_of(feed, [0, 0], rows=2).next_batch(lambda p: True).key == (0, 1)
