"""The driver's side of a rollout copy in another process (a Ray actor, ``trainer.backend=ray``).

A copy in the driver process shares its memory with the pipeline
(:class:`~verl.trainer.rl.async_rollout.AsyncRollout`): its engine hands finished groups to
the pipeline's sink and polls the pipeline's :class:`~verl.rollout.partial.WeightMailbox`.
A copy in an actor does both in its own process
(:class:`~verl.workers.rollout_copy.RolloutCopyWorker`), and the driver reaches them
through methods answered beside the running call (``register(..., beside=True)``):

- streamed groups: :func:`polling` takes the groups the running call has finished every
  :data:`POLL_INTERVAL_S` (``take_streamed_groups``) and hands them to the pipeline's sink;
- partial rollouts: :func:`post_to_copy` sends a version's weights (the actor's full CPU
  state dict, one post per step, never an older one after a newer) into the copy's own
  mailbox (``post_policy_weights``), where the copy's next decode step or next call takes
  them; the driver's mailbox then keeps the version posted, not the weights. Each call
  carries :func:`mailbox_meta` and its output tells which version it started and ended
  with and the copy's swap counters (:func:`absorb_call_output`), from which the driver's
  mailbox mirrors ``held`` and ``stats``; while a streaming call runs, each poll mirrors
  them too (``weight_mailbox_state``), so a mid-call swap reaches the step's metrics
  before its call returns.

A pool of copies (``trainer.rollout_copies`` > 1) is one worker group of several ranks:
each call splits its prompts across them, each weight load goes to every rank (a
``ONE_TO_ALL`` method), and each poll takes every rank's groups (:func:`take_groups`).
With partial rollouts each copy owns its mailbox: every post goes to every copy, and each
copy swaps at its own decode step, its tokens recording the version that sampled them. The
driver's mailbox then mirrors the pool (:func:`absorb_call_output`, each poll): ``held`` is
the oldest version a copy holds, the counters are the copies' sums, and a call started with
the oldest version a copy started its share with. A call's output carries rank 0's
``meta_info`` only, so every rank's entry comes from ``weight_mailbox_state`` (one per rank).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch

from verl.protocol import DataProto
from verl.rollout.partial import WeightMailbox

logger = logging.getLogger(__name__)

__all__ = [
    "POLL_INTERVAL_S",
    "absorb_call_output",
    "copy_in_other_process",
    "mailbox_meta",
    "polling",
    "post_to_copy",
    "rank_states",
    "repeating",
    "reset_copy_mailbox",
    "take_groups",
]

# How often the driver asks a rollout copy in a Ray actor for the groups its running call has
# finished: one small actor call each time (an empty list mostly), on a thread of its own; a
# group then waits at most this long before the trainer can take it.
POLL_INTERVAL_S = 0.05


def copy_in_other_process(group: Any) -> bool:
    """Whether the copy ``group`` runs in a process of its own (a Ray actor), out of reach
    of this process's group sink and mailbox."""
    from verl.controller.local import LocalWorkerGroup

    return hasattr(group, "take_streamed_groups") and not isinstance(group, LocalWorkerGroup)


@contextlib.contextmanager
def polling(
    group: Any, token: str, sink: Callable[..., None], mailbox: WeightMailbox | None = None
) -> Iterator[None]:
    """While the block runs (the copy's call of ``token``), a thread takes the groups the
    copy has finished every :data:`POLL_INTERVAL_S` and hands them to ``sink`` (with a
    ``mailbox``: and mirrors the copy's ``held`` and swap counters into it); it has stopped
    when the block ends, so no group arrives after its call's output. A failed poll stops
    the polling: the call's whole output still holds every group."""

    def poll() -> bool:
        try:
            groups = take_groups(group, token)
            states = rank_states(group) if mailbox is not None else []
        except Exception as e:  # the call itself reports a dead copy
            logger.warning("polling the rollout copy's streamed groups failed: %s", e)
            return False
        if states:  # before the groups: it counts every swap they saw
            _mirror(mailbox, states)
        for prompt, rows, temperature in groups:
            # the sink reads the call's params for their logprob_temperature only
            sink(prompt, rows, SimpleNamespace(logprob_temperature=temperature))
        return True

    with repeating(poll, "verl-rollout-poll"):
        yield


@contextlib.contextmanager
def repeating(step: Callable[[], bool], name: str) -> Iterator[None]:
    """While the block runs, a thread (``name``) calls ``step`` every
    :data:`POLL_INTERVAL_S` until it returns False; the thread has stopped when the block
    ends."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(POLL_INTERVAL_S) and step():
            pass

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def take_groups(group: Any, token: str) -> list[tuple[int, DataProto, float]]:
    """The groups the call of ``token`` has finished since the last take, from every copy of
    a pool (``trainer.rollout_copies`` > 1: each rank's prompt indices are the batch's
    already, ``RolloutCopyWorker.take_pool_groups``), else from the one copy."""
    if getattr(group, "world_size", 1) > 1:
        return [g for rank in group.take_pool_groups(token) for g in rank]
    return group.take_streamed_groups(token)


def post_to_copy(
    group: Any, mailbox: WeightMailbox, state: dict[str, torch.Tensor], version: int
) -> None:
    """Post ``state`` (full state dict, CPU) as the weights of ``version`` into the copy's
    own mailbox (answered beside its running call), and record the version in the driver's
    ``mailbox`` without keeping the weights here."""
    group.post_policy_weights(state, version, mailbox.mode)
    mailbox.post({}, version)  # the version only: the weights live in the copy's mailbox
    mailbox.take()


def reset_copy_mailbox(group: Any) -> None:
    """After a checkpoint load: the copy forgets what was posted and held, as the driver's
    mailbox does (no call runs then: the pipeline waited for its queue)."""
    group.reset_weight_mailbox()


def mailbox_meta(mailbox: WeightMailbox, version: int) -> dict[str, Any]:
    """The ``meta_info`` entry that runs a call under the copy's mailbox (``version``: the
    batch's, what the copy holds when nothing was ever loaded through its mailbox)."""
    return {"mode": mailbox.mode, "version": int(version)}


def absorb_call_output(
    mailbox: WeightMailbox, gen: DataProto, group: Any = None
) -> tuple[int, float]:
    """From a call's output (its ``meta_info`` entry, removed): mirror the copy's ``held``
    and counters into the driver's ``mailbox``; returns the version the call started with
    and the seconds of the load at its start. A pool (``group`` of several ranks): the
    entry is rank 0's, so every rank's is read from the copies (``weight_mailbox_state``,
    its ``call``); the call started with the oldest of their versions, its load took the
    longest of their loads (they run side by side) and the mailbox mirrors them all."""
    from verl.workers.rollout_copy import WEIGHT_MAILBOX

    entries = [gen.meta_info.pop(WEIGHT_MAILBOX)]
    if getattr(group, "world_size", 1) > 1:
        entries = [state["call"] for state in rank_states(group)]
        if len(entries) != group.world_size or any(e is None for e in entries):
            raise RuntimeError(
                f"the pool of {group.world_size} rollout copies reported {len(entries)} "
                "mailbox states after a call under its mailboxes, each must report its call"
            )
    _mirror(mailbox, entries)
    return min(int(e["start"]) for e in entries), max(float(e["load_s"]) for e in entries)


def rank_states(group: Any) -> list[dict[str, Any]]:
    """Every copy's ``weight_mailbox_state`` (one per rank of a pool), those without a
    mailbox left out."""
    states = group.weight_mailbox_state()
    if not isinstance(states, list):  # a copy group answering with one rank's
        states = [states]
    return [state for state in states if state is not None]


def _mirror(mailbox: WeightMailbox, states: list[dict[str, Any]]) -> None:
    """The copies' ``held`` (the oldest of those holding one) and counters (summed over
    every copy, a copy still loading its first post included: the totals never go back;
    ``states``: one per copy, at least one) into the driver's ``mailbox``."""
    held = [int(state["held"]) for state in states if state["held"] is not None]
    if held:
        mailbox.held = min(held)
    totals: dict[str, float] = {}
    for state in states:
        for key, value in state["stats"].items():
            totals[key] = totals.get(key, 0.0) + float(value)
    mailbox.stats.update(totals)
