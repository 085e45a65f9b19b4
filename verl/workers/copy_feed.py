"""Continuous batching across calls in a rollout copy in another process (a Ray actor).

In the driver process the rollouter's queue is at hand: a call's native continuous loop asks
a :class:`~verl.trainer.rl.rollout_feed.QueueFeed` for the next queued batch when its
long tail leaves decode slots free. A copy in a Ray actor has no queue: the driver *offers*
each queued batch that may join (same conditions as the local feed:
:class:`~verl.trainer.rl.rollout_feed.RayFeed`) with ``offer_batch``, answered beside the
running call, and :class:`CopyFeed` keeps the offers here, in queue order. A call whose
``meta_info`` names its batch's key (``FEED_KEY``) runs inside
:func:`~verl.rollout.continuous.feed_prompts` with :meth:`CopyFeed.prompt_feed`: the engine
takes the first offer not taken yet (never a later one past it) when it fits, and the copy
records it as *taken*, with the weights' version the loop holds then. The taken batch's
groups are kept under its own stream token as they finish (the driver polls them).

At a call's start (:meth:`CopyFeed.start_call`) the offers and taken batches up to its key
are forgotten (their calls ran, or their queue was dropped: a dropped queue's keys are
older than any later call's); when the call's own batch was taken, its call continues the
engine's waiting loop (``verl/rollout/continuous.py``, "Across calls") and loads no
weights first. A weight load drops the engine's waiting loop and forgets the taken batches
(:meth:`CopyFeed.drop_taken`): their calls generate them afresh. An offer never taken is
simply never used: its own call generates it, so nothing offered is lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verl.protocol import DataProto

__all__ = ["CopyFeed", "Offer"]


@dataclass
class Offer:
    """A queued batch offered to the copy: ``prompts`` this copy's share exactly as the
    batch's own ``generate_sequences`` call will get them, ``key`` that call's
    ``(dropped queues, batch index)``, ``token`` its stream token; ``version``: the weights'
    version the loop held when it took the batch (partial rollouts)."""

    key: tuple[int, int]
    prompts: DataProto
    token: str
    version: int | None = None


class CopyFeed:
    """The offers and taken batches of one rollout copy (module docstring); its methods are
    called from the actor's two threads (the running call's and the beside thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offers: list[Offer] = []  # offered, not taken, in queue order
        self._taken: dict[tuple[int, int], Offer] = {}  # taken, their own call not started
        self.stats = {"offered": 0, "taken": 0, "continued": 0, "fed_batches": 0.0}

    def offer(self, prompts: DataProto, key: Any, token: str) -> None:
        """Keep ``prompts`` (the batch of ``key``) for the running or a later call's loop;
        a key offered or taken already is kept once."""
        key = _key(key)
        with self._lock:
            if key in self._taken or any(o.key == key for o in self._offers):
                return
            self._offers.append(Offer(key, prompts, token))
            self._offers.sort(key=lambda o: o.key)
            self.stats["offered"] += 1

    def start_call(self, key: Any) -> Offer | None:
        """A call of ``key`` starts: forget the offers and taken batches up to it; returns
        its batch's :class:`Offer` when a loop took it (the call continues that loop)."""
        key = _key(key)
        with self._lock:
            self._offers = [o for o in self._offers if o.key > key]
            mine = self._taken.pop(key, None)
            self._taken = {k: o for k, o in self._taken.items() if k > key}
            if mine is not None:
                self._taken[key] = mine  # its groups stay live until the call has ended
                self.stats["continued"] += 1
            return mine

    def end_call(self, key: Any) -> None:
        """The call of ``key`` returned: its batch is no longer waited for."""
        with self._lock:
            self._taken.pop(_key(key), None)

    def drop_taken(self) -> None:
        """The engine's waiting loop was dropped (a weight load): the taken batches' calls
        generate them afresh."""
        with self._lock:
            self._taken.clear()

    def live_tokens(self) -> set[str]:
        """The stream tokens whose groups are kept across calls: the taken batches'."""
        with self._lock:
            return {o.token for o in self._taken.values()}

    def prompt_feed(
        self,
        key: Any,
        running: DataProto,
        sink_for: Callable[[Offer], Any],
        held: Callable[[], int | None],
        same_rows: bool,
    ) -> Any:
        """The :class:`~verl.rollout.continuous.PromptFeed` of the call of ``key`` on
        ``running`` (its prompts): the first offer not taken, when it fits; ``sink_for(
        offer)``: the group sink of a taken batch; ``held()``: the version of the weights
        the loop holds (None without a mailbox); ``same_rows``: an offer joins only with as
        many prompts as ``running`` (a pool's rank > 0: its rows' sampling is shifted by its
        share's first prompt, the same for both then)."""
        return _Feed(self, _key(key), len(running), sink_for, held, same_rows)

    def _take(self, offer: Offer, version: int | None) -> None:
        with self._lock:
            self._offers = [o for o in self._offers if o is not offer]
            offer.version = version
            self._taken[offer.key] = offer
            self.stats["taken"] += 1

    def _first(self, after: tuple[int, int]) -> Offer | None:
        with self._lock:
            return next((o for o in self._offers if o.key > after), None)


class _Feed:
    def __init__(self, feed, key, rows, sink_for, held, same_rows) -> None:
        self.owner, self.key, self.rows = feed, key, rows
        self.sink_for, self.held, self.same_rows = sink_for, held, same_rows

    def next_batch(self, accept: Callable[[DataProto], bool]) -> Any:
        from verl.rollout.continuous import FedBatch

        offer = self.owner._first(self.key)
        if offer is None or (self.same_rows and len(offer.prompts) != self.rows):
            return None
        if not accept(offer.prompts):
            return None
        self.owner._take(offer, self.held())
        return FedBatch(offer.key, offer.prompts, self.sink_for(offer))


def _key(key: Any) -> tuple[int, int]:
    epoch, index = key
    return int(epoch), int(index)
