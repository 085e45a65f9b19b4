"""Continuous batching for the native engine: a fixed number of slots, refilled as rows end,
across generation calls.

The lock-step loop (:func:`verl.rollout.native_lockstep.generate_lockstep`) decodes a batch
until its longest row stops; with more rows than the KV cache has slots (``max_num_seqs``)
every wave then waits for its slowest row. Here the ``S`` slots of one
:class:`~verl.rollout.kv_cache.SlotKVCache` are kept busy instead
(:class:`~verl.rollout.continuous_session.ContinuousSession` holds them)::

    loop:
        admit   while >= n slots are free and prompts wait: prefill the next prompts
                (together, into a PreallocatedKVCache), copy their keys / values into free
                slots (n samples each) and sample their first token
        feed    every prompt admitted, >= n slots free: take the next queued call's
                batch, if a prompt feed offers one (below), and admit it
        decode  one forward over the slots: row i feeds its last token at its own position,
                writes its key / value at its own column and attends to its own columns
                (a (S, 1, 1, width) boolean mask per row), so rows at different positions
                decode in one step
        sample  the running rows; a row that stops frees its slot

Once no prompt waits and the feed has nothing, finished slots are compacted away (as in
the lock-step loop); a batch fed later gets them back.

Rows stay independent: each row's mask admits only its own prompt and generated columns
(columns of an earlier occupant and other padding are masked; every buffer starts zeroed,
so a masked value is finite), positions are per row, and the sampling of a sample depends
only on (its call's seed, its output row in its call, its token index)
(:func:`~verl.rollout.sampling.row_uniforms`). So a sample is the same whichever slot,
step and neighbours it ran with: greedy and seeded outputs equal the lock-step engine's
(up to the last bits of float sums over differently laid out columns, which can flip an
exact tie only).

Only for models whose attention takes a ready 4-D mask (``sdpa``, ``eager``, no sliding
windows) and eager decoding; the engine uses lock-step waves otherwise. Image prompts
(:mod:`verl.rollout.images`): each admission's prefill gets its prompts' images, and a slot
keeps its row's four position axes (text and rope), each advanced by one per step.

**Groups out as they finish.** A prompt's group (its ``n`` samples) is complete when its
last row stops, usually long before the call's slowest row. ``on_group(prompt)`` is called
then, on the generating thread, so a caller can hand the group on while the rest of the call
decodes. :func:`stream_groups` installs a sink for every native ``generate`` run inside it
(:meth:`verl.rollout.native.NativeRollout.generate` assembles the group's output and calls
the sink): the streaming rollout (``verl/trainer/rl/streaming.py``) pushes each group into its
buffer that way. The samples do not change (per-sample seeding): only when they are seen. The
rollout copy's vLLM engine reports to the same sink as vLLM finishes each request
(``verl.rollout.vllm_stream``).

**Across calls: the next batch in the tail's free slots.** A caller that generates a queue
of batches, one ``generate`` call each (the streaming rollouter,
:class:`verl.trainer.rl.async_rollout.AsyncRollout`), installs a :class:`PromptFeed` with
:func:`feed_prompts`. Once a call's prompts are all admitted and ``n`` slots are free, the
loop asks the feed for the next batch (``PromptFeed.next_batch``): the feed offers the batch
only when the engine may generate it with the weights it holds now, and with the sampling
of the running call (but its seed). Its prompts join the running loop as a segment of their
own (their own seed, output rows and group sink), so the current call's long tail no longer
leaves slots idle. The call returns when its own rows have all stopped; the rows of fed
batches still decoding stay in their slots, and the session waits on the engine
(``NativeRollout._session``) for their own ``generate`` call, which continues it: that call
must bring the same prompts, sampling and seed (checked; any other call, or a weight load
(:meth:`~verl.rollout.native.NativeRollout.drop_session`), drops the waiting session and
starts afresh). So every call still returns its whole batch, through the caller's usual
path, as soon as its last group has finished, and its samples are those of a call of its
own.

**New weights mid-call** (:mod:`verl.rollout.partial`). With a ``mailbox``, the loop polls it
before each admission / decode step (no forward in progress) and, when new weights were
posted, loads them into the module: the rows in flight continue over their caches
(``continue``) or have prompt + generated prefix prefilled again under the new weights
(``resume``); prompts admitted later are prefilled with the new weights. Each sampled token
records the version in force (``versions``).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import torch

from verl.rollout.continuous_session import ContinuousSession, Segment

if TYPE_CHECKING:
    from verl.protocol import DataProto
    from verl.rollout.base import SamplingParams
    from verl.rollout.images import PromptImages
    from verl.rollout.native import NativeRollout
    from verl.rollout.partial import WeightMailbox
    from verl.rollout.stopping import StopStringChecker

logger = logging.getLogger(__name__)

__all__ = [
    "FedBatch",
    "GroupSink",
    "PromptFeed",
    "current_group_sink",
    "current_prompt_feed",
    "feed_prompts",
    "generate_continuous",
    "stream_groups",
]

#: ``sink(prompt, group, params)``: ``prompt`` the group's prompt index in the call,
#: ``group`` its ``n`` rows in the layout of ``verl.rollout.base`` (on the engine's device),
#: ``params`` the call's :class:`~verl.rollout.base.SamplingParams`.
GroupSink = Callable[[int, Any, "SamplingParams"], None]

_SINK: contextvars.ContextVar[GroupSink | None] = contextvars.ContextVar(
    "verl_rollout_group_sink", default=None
)


@contextlib.contextmanager
def stream_groups(sink: GroupSink) -> Iterator[None]:
    """Within the block (this thread / context), every native ``generate`` call reports each
    prompt's group to ``sink`` as soon as its ``n`` samples have stopped (module docstring).
    An exception raised by ``sink`` ends the generation call with it."""
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)


def current_group_sink() -> GroupSink | None:
    """The sink :func:`stream_groups` installed here, or None."""
    return _SINK.get()


@dataclass
class FedBatch:
    """A queued call's batch offered to the running loop: ``prompts`` exactly as that call
    will pass them to ``generate`` (``meta_info["seed"]`` its sampling seed), ``sink`` its
    group sink (or None), ``key`` the :attr:`PromptFeed.key` its call will run under."""

    key: Hashable
    prompts: DataProto
    sink: GroupSink | None = None


class PromptFeed(Protocol):
    """The source of the next queued calls' batches (module docstring)."""

    #: names the call in progress: a batch offered earlier is continued by the call whose
    #: feed has its key
    key: Hashable

    def next_batch(self, accept: Callable[[DataProto], bool]) -> FedBatch | None:
        """The next queued batch when it may join the running call now (the engine's
        weights are its, its sampling is the running call's but the seed, and
        ``accept(prompts)``); it is then this call's to generate. None otherwise."""


_FEED: contextvars.ContextVar[PromptFeed | None] = contextvars.ContextVar(
    "verl_rollout_prompt_feed", default=None
)


@contextlib.contextmanager
def feed_prompts(feed: PromptFeed) -> Iterator[None]:
    """Within the block, a native ``generate`` with continuous batching takes further
    batches from ``feed`` into its free slots (module docstring)."""
    token = _FEED.set(feed)
    try:
        yield
    finally:
        _FEED.reset(token)


def current_prompt_feed() -> PromptFeed | None:
    """The feed :func:`feed_prompts` installed here, or None."""
    return _FEED.get()


def generate_continuous(
    engine: NativeRollout,
    input_ids: torch.Tensor,
    key_real: torch.Tensor,
    position_ids: torch.Tensor,
    params: SamplingParams,
    *,
    slots: int,
    seed: int | None,
    stop_ids: torch.Tensor | None,
    checker: StopStringChecker,
    on_group: Callable[..., None] | None = None,
    mailbox: WeightMailbox | None = None,
    images: PromptImages | None = None,
    feed: PromptFeed | None = None,
    make_reporter: Callable[..., Callable[..., None] | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float], torch.Tensor | None]:
    """Generate ``params.n`` samples for each of the ``B`` prompts (``input_ids`` /
    ``key_real`` / ``position_ids`` (B, P), left-padded, on the model's device) through
    ``slots`` KV-cache rows (``slots >= n``). ``on_group(prompt, responses, log_probs,
    lengths[, versions])``: called as soon as the ``n`` rows of prompt ``prompt`` have all
    stopped, with their final rows of the outputs below ((n, R), (n, R), (n,), (n, R);
    ``versions`` only with a ``mailbox``). ``mailbox``: polled between steps (module
    docstring); its ``held`` version tags the tokens until a swap. ``images``: the prompts'
    images (:class:`~verl.rollout.images.PromptImages`; ``position_ids`` then (B, P, 4),
    the text and rope axes): each admission's prefill takes its prompts' share; not with a
    ``mailbox`` (a resume's prefill again would have no images) or a ``feed``.

    ``feed``: further batches for the free slots (module docstring); ``make_reporter(
    prompts, params, position_ids, sink)``: the ``on_group`` of a fed batch. A call whose
    batch an earlier call took from the feed continues the engine's waiting session.

    Returns ``responses`` (B*n, R) long (garbage past ``lengths``), ``log_probs`` (B*n, R)
    float32, ``lengths`` (B*n,), stats (``prefill_s``, ``decode_steps``,
    ``decode_row_steps``, ``admissions``, ``compactions``, ``fed_batches``, ``prompt_len``,
    ``resumed`` (1: the call continued a waiting session); with a mailbox ``weight_swaps``,
    ``reprefill_rows``, ``reprefill_tokens``, ``reprefill_s``), counted over this call, and
    ``versions`` (B*n, R) int64, the weights' version that sampled each token (None
    without a mailbox; garbage past ``lengths``).
    """
    if feed is not None and images is not None:
        raise ValueError("generate_continuous: a prompt feed takes text prompts only")
    session: ContinuousSession | None = getattr(engine, "_session", None)
    engine._session = None
    segment = None
    if session is not None and feed is not None and session.mailbox is mailbox:
        segment = session.find(feed.key)
        same_loop = session.full_slots == slots and session.n == params.n
        if segment is not None and not (
            same_loop and segment.matches(input_ids, key_real, position_ids, params, seed)
        ):
            logger.warning(
                "continuous batching: the call %r does not bring the prompts / sampling "
                "its batch was started with; generating it afresh",
                feed.key,
            )
            segment = None
    resumed = segment is not None
    if segment is None:
        session = ContinuousSession(
            engine,
            slots=slots,
            prompt_width=input_ids.shape[1],
            params=params,
            stop_ids=stop_ids,
            checker=checker,
            mailbox=mailbox,
            pos_axes=tuple(position_ids.shape[2:]),
            device=input_ids.device,
        )
        segment = session.add(
            Segment(
                None if feed is None else feed.key,
                input_ids,
                key_real,
                position_ids,
                params,
                seed,
                on_group=on_group,
                images=images,
                with_versions=mailbox is not None,
            )
        )
    elif on_group is not None:
        segment.on_group = on_group  # its later groups go to this call's sink
    before = session.counters()
    more = None
    if feed is not None:
        more = _feeder(session, feed, params, input_ids.device, make_reporter)
    session.run(segment, more)
    session.release(segment)
    if session.holds():
        engine._session = session  # fed batches not returned yet: their calls continue it
    stats = {k: v - before.get(k, 0.0) for k, v in session.counters().items()}
    stats |= {"prompt_len": float(input_ids.shape[1]), "resumed": float(resumed)}
    return segment.responses, segment.log_probs, segment.lengths, stats, segment.versions


def _feeder(
    session: ContinuousSession,
    feed: PromptFeed,
    params: SamplingParams,
    device: torch.device,
    make_reporter: Callable[..., Callable[..., None] | None] | None,
) -> Callable[[], Segment | None]:
    """``more()`` for :meth:`ContinuousSession.run`: the feed's next batch as a segment."""
    from verl.rollout.base import validate_prompts

    def accept(prompts: DataProto) -> bool:
        seed = prompts.meta_info.get("seed")
        if seed is None and not params.greedy:
            return False  # its call would draw a seed of its own
        mask = prompts.batch["attention_mask"].bool()
        return mask.ndim == 2 and session.fits(mask)

    def more() -> Segment | None:
        fed = feed.next_batch(accept)
        if fed is None:
            return None
        ids, mask, pos = validate_prompts(fed.prompts)
        seed = None if params.greedy else int(fed.prompts.meta_info["seed"])
        fed_params = replace(params, seed=fed.prompts.meta_info.get("seed", params.seed))
        on_group = None
        if make_reporter is not None and fed.sink is not None:
            on_group = make_reporter(fed.prompts, fed_params, pos, fed.sink)
        return Segment(
            fed.key,
            ids.to(device),
            mask.to(device).bool(),
            pos.to(device),
            fed_params,
            seed,
            on_group=on_group,
            with_versions=session.mailbox is not None,
        )

    return more
