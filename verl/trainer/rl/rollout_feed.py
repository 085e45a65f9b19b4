"""Continuous batching across the rollouter's generation calls: the prompt feed of one call.

The rollouter (:class:`~verl.trainer.rl.async_rollout.AsyncRollout`) generates its queue of
prompt batches one call per batch, one call at a time, on its rollout thread. On the native
engine with ``decode_slots`` set, each streaming call runs inside
:func:`verl.rollout.continuous.feed_prompts` with a :class:`QueueFeed`: when the call's
prompts all have a slot and slots are free (its long tail decoding), the engine asks the feed
for the next queued batch and starts its prompts in those slots. The batch is then
*claimed*: its own call, when the rollout thread reaches it, continues the engine's loop
instead of starting one (``verl/rollout/continuous.py``, "Across calls"), and returns its
whole output as soon as its last group has stopped.

Which batch may join: the first queued after the ones the running loop holds, when

- the copy holds its weights now. Without partial rollouts a batch queued with another
  policy version than the batch before it carries a weight load (``_InFlight.load``), which
  happens between two calls only: such a batch is never offered, and the loop ends with the
  running call's rows; with partial rollouts (a ``WeightMailbox``) every batch may join (its
  tokens record the version that sampled them; its version starts at the loop's);
- its ``meta_info`` (what the worker builds the call's sampling from) is the running
  batch's but for the seed: its sampling is the running call's with its own seed;
- the engine accepts its prompts (they fit the loop's KV cache).

Its prompts go to the engine exactly as its call will pass them (seeded for its index), with
its group sink, so its samples, groups and whole output are those of a call of its own.

A copy in a Ray actor (``trainer.backend=ray``): the engine runs in the actor, the queue
here. While a streaming call runs, :class:`RayFeed` *offers* the queued batches that may
join (the same conditions, :func:`next_joining`; the engine's own check happens there) to
the copy (``offer_batch``, answered beside the call: those queued already before the call
starts, later ones every ``POLL_INTERVAL_S``), and takes the groups the copy finished of
the offered batches into their sinks. The copy's loop takes offers in queue order
(``verl/workers/copy_feed.py``); which it took, only the copy knows: each batch's own call
names its batch (``meta_info["feed_key"]``, :func:`call_names`) and continues the loop that
took it, or generates it afresh. An offer never taken is simply never used, so nothing
offered is lost; a batch's item is marked ``offered`` (offered once), never ``claimed``.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

from verl.protocol import DataProto

logger = logging.getLogger(__name__)

__all__ = ["QueueFeed", "RayFeed", "call_names", "next_joining", "same_sampling"]


class QueueFeed:
    """The :class:`~verl.rollout.continuous.PromptFeed` of ``pipeline``'s call on its
    queued batch ``item`` (module docstring)."""

    def __init__(self, pipeline: Any, item: Any) -> None:
        self.pipeline = pipeline
        self.key = pipeline._call_key(item)
        self.last = item  # the newest batch the running loop holds

    def next_batch(self, accept: Callable[[DataProto], bool]) -> Any:
        from verl.rollout.continuous import FedBatch

        pipe = self.pipeline
        item = next_joining(pipe, self.last)
        if item is None:
            return None
        prompts = pipe._call_prompts(item)
        if not accept(prompts):
            return None
        item.claimed = True
        if pipe.mailbox is not None:  # its first tokens: the weights the loop holds
            item.version = max(item.version, int(pipe.mailbox.held))
        self.last = item
        return FedBatch(pipe._call_key(item), prompts, pipe._sink_for(item, prompts))


def next_joining(pipe: Any, last: Any) -> Any:
    """The queued batch after ``last`` (the newest the running loop holds or was offered)
    when it may join that loop (module docstring), else None."""
    queue = list(pipe._queue)  # the trainer's thread appends and pops meanwhile
    at = next((k for k, i in enumerate(queue) if i is last), None)
    if at is None:
        return None
    # batches an earlier call of the same loop took are held already
    item = next((i for i in queue[at + 1 :] if not i.claimed), None)
    if item is None or item.gen is not None or item.result is None or item.result.done():
        return None  # none, a checkpoint's, or cancelled with the queue
    if pipe.mailbox is None and item.load is not None:
        return None  # newer weights: loaded between two calls only
    if not same_sampling(item.prompts, last.prompts):
        return None
    return item


# copy groups whose engine takes no offered batch (vLLM, no decode_slots)
_NOT_FEEDING: weakref.WeakSet = weakref.WeakSet()


class RayFeed:
    """Continuous batching across calls with the copy in a Ray actor (module docstring):
    while ``pipeline``'s call on ``item`` runs (:meth:`running`), every queued batch that
    may join is offered to the copy, in queue order, and the groups of the offered
    batches are taken as the copy finishes them (those a loop took)."""

    def __init__(self, pipeline: Any, item: Any) -> None:
        self.pipeline = pipeline
        self.last = item  # the newest batch offered (or the running one)
        # the running call's queue (dropped queues so far): a drop counts it up before it
        # cancels the queued batches, and an offer then would name an old batch with the
        # new queue's key (the copy keeps a key once: a new batch of that index would get
        # the old prompts' groups)
        self.epoch = call_names(pipeline, item)[0][0]
        self.offered: list[tuple[str, Callable[..., None]]] = []  # (token, group sink)
        # the copy's engine takes offers (a native loop with slots; a fake copy has none)
        group = pipeline.group
        self.feeds = hasattr(group, "offer_batch") and group not in _NOT_FEEDING

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """The block runs the call: the batches queued already are offered before it
        starts, later ones and the offered batches' groups every ``POLL_INTERVAL_S``; the
        thread has stopped when the block ends. A failed offer or poll stops it (the
        offered batches' own calls generate them)."""
        from verl.trainer.rl.ray_copy_link import repeating

        def tick() -> bool:
            try:
                self.offer_ready()
                self.take_offered_groups()
            except Exception as e:  # the call itself reports a dead copy
                logger.warning("offering queued batches to the rollout copy failed: %s", e)
                return False
            return self.feeds

        if not tick():
            yield
            return
        with repeating(tick, "verl-rollout-offers"):
            yield

    def offer_ready(self) -> None:
        """Offer every queued batch after the last offered that may join, in order; none
        once the running call's queue is being dropped."""
        pipe = self.pipeline
        while self.feeds:
            item = next_joining(pipe, self.last)
            if item is None:
                return
            key, token = call_names(pipe, item)
            if key[0] != self.epoch:
                return  # the queue is being dropped: its batches are cancelled
            prompts = pipe._call_prompts(item)
            if not item.offered:  # an earlier call's feed may have offered it already
                answer = pipe.group.offer_batch(prompts, key, token)
                item.offered = True
                self.feeds = bool(answer["feeds"])
                if not self.feeds:  # its engine never takes one: no more offers to it
                    _NOT_FEEDING.add(pipe.group)
            self.offered.append((token, pipe._sink_for(item, prompts)))
            self.last = item

    def take_offered_groups(self) -> None:
        """Hand the groups the copy finished of the offered batches to their sinks."""
        from verl.trainer.rl.ray_copy_link import take_groups

        for token, sink in self.offered:
            for prompt, rows, temperature in take_groups(self.pipeline.group, token):
                # the sink reads the call's params for their logprob_temperature only
                sink(prompt, rows, SimpleNamespace(logprob_temperature=temperature))


def call_names(pipe: Any, item: Any) -> tuple[list[int], str]:
    """The ``meta_info`` key and the stream token of ``item``'s call on a copy in a Ray
    actor: ``[dropped queues, batch index]`` and ``"<dropped queues>-<batch index>"``."""
    _, epoch, index = pipe._call_key(item)
    return [epoch, index], f"{epoch}-{index}"


def same_sampling(a: DataProto, b: DataProto) -> bool:
    """Whether two batches' ``meta_info`` (what the worker builds a call's sampling from)
    agree but for the seed."""
    keys = set(a.meta_info) | set(b.meta_info)
    keys.discard("seed")
    try:
        return all(bool(a.meta_info.get(k) == b.meta_info.get(k)) for k in keys)
    except (TypeError, ValueError, RuntimeError):  # arrays: not compared, not joined
        return False
