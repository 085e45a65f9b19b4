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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verl.protocol import DataProto

__all__ = ["QueueFeed", "same_sampling"]


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
        queue = list(pipe._queue)  # the trainer's thread appends and pops meanwhile
        at = next((k for k, i in enumerate(queue) if i is self.last), None)
        if at is None:
            return None
        # batches an earlier call of the same loop took are held already
        item = next((i for i in queue[at + 1 :] if not i.claimed), None)
        if item is None or item.gen is not None or item.result is None or item.result.done():
            return None  # none, a checkpoint's, or cancelled with the queue
        if pipe.mailbox is None and item.load is not None:
            return None  # newer weights: loaded between two calls only
        if not same_sampling(item.prompts, self.last.prompts):
            return None
        prompts = pipe._call_prompts(item)
        if not accept(prompts):
            return None
        item.claimed = True
        if pipe.mailbox is not None:  # its first tokens: the weights the loop holds
            item.version = max(item.version, int(pipe.mailbox.held))
        self.last = item
        return FedBatch(pipe._call_key(item), prompts, pipe._sink_for(item, prompts))


def same_sampling(a: DataProto, b: DataProto) -> bool:
    """Whether two batches' ``meta_info`` (what the worker builds a call's sampling from)
    agree but for the seed."""
    keys = set(a.meta_info) | set(b.meta_info)
    keys.discard("seed")
    try:
        return all(bool(a.meta_info.get(k) == b.meta_info.get(k)) for k in keys)
    except (TypeError, ValueError, RuntimeError):  # arrays: not compared, not joined
        return False
