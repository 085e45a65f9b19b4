"""A rollout-only copy of the policy, for asynchronous (one-step-off) training.

In synchronous training the hybrid :class:`~verl.workers.actor_rollout_ref.ActorRolloutRefWorker`
samples from the module it trains. With ``trainer.async_rollout=true`` the next batch is
generated *while* the current one trains, so the rollout needs weights the optimizer does
not touch: this worker holds its own copy of the policy (built like the actor's: same model,
LoRA, precision, rollout backend) and samples from it. The trainer pushes the actor's
weights into it at step boundaries only, between two generations
(:meth:`RolloutCopyWorker.load_policy_weights`), through the same bucketed, time-limited
push the vLLM backend takes its weights with (:func:`verl.rollout.weight_sync.push_weights`).
With ``rollout.name=vllm`` the copy's engine is a vLLM engine of its own (started like the
hybrid worker's), and each load pushes the new weights on into it at once (its bucketed
``update_weights``), so the next generation samples with them; the seconds reported are the
whole load. Its ``generate`` drives vLLM one engine step at a time under the process-wide
vLLM lock (the actor's engine in this process takes pushes between two steps) and hands each
prompt's group over as vLLM finishes its request when a streaming sink is installed
(:func:`verl.rollout.vllm_stream.copy_generate`). A native engine may keep the rows of a
batch it started for the next call in flight between two calls (continuous batching across
calls, ``verl/rollout/continuous.py``); a weight load drops them, so no row ever mixes the
weights of two loads.

Groups out of a copy in another process (the Ray backend): a ``generate_sequences`` call
whose ``meta_info`` carries :data:`STREAM_TOKEN` (any string naming the call) installs a
sink of its own that keeps each finished group (CPU copies) under a lock, and
:meth:`RolloutCopyWorker.take_streamed_groups` (``register(..., beside=True)``: answered on
a second thread of the actor while the call runs) hands over those of that call. The call's
whole output still holds every group; the driver keeps each once.

Partial rollouts in a copy in another process (``trainer.partial_rollout`` on the Ray
backend): the copy owns a :class:`~verl.rollout.partial.WeightMailbox` in its own process.
:meth:`RolloutCopyWorker.post_policy_weights` (beside a running call) posts a version's full
state dict into it; a ``generate_sequences`` call whose ``meta_info`` carries
:data:`WEIGHT_MAILBOX` first loads the newest post (between two calls, as
:meth:`RolloutCopyWorker.load_policy_weights`), then runs under
:func:`~verl.rollout.partial.weight_mailbox`, so the native continuous loop and the vLLM
stepping loop take a post made meanwhile between two decode steps, exactly as a copy in the
driver process does. Its output's ``meta_info[WEIGHT_MAILBOX]`` tells the driver the version
the call started with, the one it ended with, the seconds of the load at its start and the
mailbox's counters (``swaps``, ``load_s``, ...).

Continuous batching across calls in a copy in another process: the driver offers the
queued batches that may join the running call with :meth:`RolloutCopyWorker.offer_batch`
(beside the call); a ``generate_sequences`` call whose ``meta_info`` carries
:data:`FEED_KEY` takes them into its native loop's free decode slots, keeps their groups
under their own stream tokens (polled by the driver; a call's start drops only the groups
of batches no loop holds), and continues the loop when its own batch was
taken, loading no mailbox post first (``verl/workers/copy_feed.py``);
:meth:`RolloutCopyWorker.load_policy_weights` forgets the taken batches with the rows.

A pool of copies (``trainer.rollout_copies`` > 1, the Ray backend): the group has one rank
per copy, each a whole copy on the single engine; ``generate_sequences`` splits a batch's
prompts into equal shares by rank (data-parallel dispatch, whole prompts: a prompt's ``n``
samples stay on one copy) and concatenates the outputs in rank order, i.e. in prompt order.
Each rank counts its share's rows and prompts as the whole batch's: its native engine
draws a sample's uniforms by its row in the batch, so the pool samples what one copy
samples with the same seed, and its streamed groups carry the batch's prompt indices
(:meth:`RolloutCopyWorker.take_pool_groups` hands over every rank's).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import torch

from verl.controller import Dispatch, register
from verl.controller.dispatch import get_method_dispatch
from verl.protocol import DataProto
from verl.rollout.partial import WeightMailbox, weight_mailbox
from verl.rollout.weight_sync import push_weights
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.common import to_device
from verl.workers.copy_feed import CopyFeed, Offer
from verl.workers.specs import ActorRolloutRefSpec

__all__ = ["FEED_KEY", "STREAM_TOKEN", "WEIGHT_MAILBOX", "RolloutCopyWorker"]

#: ``meta_info`` key of a ``generate_sequences`` call whose groups the driver takes with
#: :meth:`RolloutCopyWorker.take_streamed_groups` while it runs (module docstring)
STREAM_TOKEN = "stream_token"
#: ``meta_info`` key of a ``generate_sequences`` call under the copy's own weight mailbox:
#: ``{"mode": "continue" | "resume", "version": the driver's version of the batch}``; the
#: output's ``meta_info`` carries ``{"start", "held", "load_s", "stats"}`` under it
WEIGHT_MAILBOX = "weight_mailbox"
#: ``meta_info`` key of a ``generate_sequences`` call of the rollouter's queue: its batch's
#: ``(dropped queues, batch index)``; the call takes offered batches into its free decode
#: slots and continues the loop that took its own batch (``verl/workers/copy_feed.py``)
FEED_KEY = "feed_key"

_GENERATE = get_method_dispatch(ActorRolloutRefWorker.generate_sequences)
assert _GENERATE is not None and _GENERATE.reads is not None


class RolloutCopyWorker(ActorRolloutRefWorker):
    """The policy's rollout on a module of its own; generation and weight loading only.

    Args:
        spec: the copy's spec (:func:`verl.workers.specs.rollout_copy_spec`: the actor's,
            without a reference, on the single engine: one process holds the whole copy, a
            plain module, never sharded; the actor may be FSDP2 over several ranks, its full
            state dict is what this copy loads).
        module: an already-built causal LM (a copy of the actor's initial module) to use
            instead of loading ``actor_rollout_ref.model.path``.
        tokenizer: a tokenizer to use instead of loading one.
    """

    def __init__(
        self,
        spec: ActorRolloutRefSpec,
        module: torch.nn.Module | None = None,
        tokenizer: Any = None,
        **worker_kwargs: Any,
    ) -> None:
        if isinstance(spec, ActorRolloutRefSpec) and (
            spec.actor.strategy != "single" or spec.ref is not None
        ):
            raise ValueError(
                f"the rollout copy runs on the single engine without a reference, got "
                f"strategy={spec.actor.strategy}, role={spec.role}; build its spec with "
                "verl.workers.specs.rollout_copy_spec(config)"
            )
        super().__init__(spec, module=module, tokenizer=tokenizer, **worker_kwargs)
        self.policy_version: int | None = None  # the actor update the weights come from
        # (call token, prompt index, group on CPU, log-prob temperature) of the groups the
        # running call finished and the driver has not taken
        self._streamed: list[tuple[str, int, DataProto, float]] = []
        self._streamed_lock = threading.Lock()
        # partial rollouts: the mailbox the driver posts into (created by the first post or
        # call, under the lock: a post arrives on the actor's second thread)
        self.weight_box: WeightMailbox | None = None
        self._box_lock = threading.Lock()
        # the WEIGHT_MAILBOX entry of this copy's last call: a pool's output carries rank
        # 0's, every rank's reaches the driver through weight_mailbox_state
        self.call_mailbox: dict[str, Any] | None = None
        # continuous batching across calls: the batches the driver offered (copy_feed.py)
        self.feed = CopyFeed()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int) -> None:
        """The worker's set-up; a vLLM rollout's ``generate`` then runs step by step and
        streams groups inside :func:`verl.rollout.continuous.stream_groups` (module
        docstring)."""
        super().init_model(total_steps)
        if getattr(self.rollout, "engine_name", None) == "vllm":
            from verl.rollout.vllm_stream import copy_generate

            self.rollout.generate = copy_generate(self.rollout)

    @register(
        dispatch_mode=_GENERATE.mode,
        reads=_GENERATE.reads,
        optional=_GENERATE.optional,
        meta=(*_GENERATE.meta, STREAM_TOKEN, WEIGHT_MAILBOX, FEED_KEY),
    )
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """The hybrid worker's ``generate_sequences``; with ``meta_info[STREAM_TOKEN]`` each
        prompt's group is also kept for :meth:`take_streamed_groups` as the engine finishes
        it (the samples do not change); with ``meta_info[WEIGHT_MAILBOX]`` the call runs
        under this copy's weight mailbox; with ``meta_info[FEED_KEY]`` it takes offered
        batches into its free decode slots, or continues the loop that took its own batch
        (module docstring)."""
        token = prompts.meta_info.pop(STREAM_TOKEN, None)
        partial = prompts.meta_info.pop(WEIGHT_MAILBOX, None)
        key = prompts.meta_info.pop(FEED_KEY, None)
        # a pool of copies: this rank's share starts at prompt rank * share of the batch
        first = self.rank * len(prompts)
        taken = self.feed.start_call(key) if key is not None else None
        try:
            with contextlib.ExitStack() as stack:
                if first:
                    stack.enter_context(self._sampling_as_rows_of_batch(first))
                box = None
                if partial is not None:
                    box, start, load_s = self._start_with_mailbox(
                        partial["mode"], partial["version"], taken
                    )
                    stack.enter_context(weight_mailbox(box))
                if token is not None:
                    stack.enter_context(self._keeping_groups(token, first))
                if key is not None:
                    stack.enter_context(self._feeding(key, prompts, first, box))
                out = super().generate_sequences(prompts)
        finally:
            if key is not None:
                self.feed.end_call(key)
        if key is not None:
            stats = getattr(self.rollout, "last_stats", None) or {}
            self.feed.stats["fed_batches"] += float(stats.get("fed_batches", 0.0))
        if partial is not None:
            out.meta_info[WEIGHT_MAILBOX] = self.call_mailbox = {
                "start": start,
                "held": int(box.held),
                "load_s": load_s,
                "stats": dict(box.stats),
            }
        return out

    def _feeding(self, key: Any, prompts: DataProto, first: int, box: WeightMailbox | None):
        """The call's prompt feed (``verl/workers/copy_feed.py``): a taken batch's groups are
        kept under its own stream token, its prompt indices counted in its whole batch."""
        from verl.rollout.continuous import feed_prompts

        def sink_for(offer: Offer) -> Any:
            return self._group_keeper(offer.token, first)

        def held() -> int | None:
            return None if box is None else int(box.held)

        return feed_prompts(self.feed.prompt_feed(key, prompts, sink_for, held, first > 0))

    @contextlib.contextmanager
    def _sampling_as_rows_of_batch(self, first: int):
        """Within the block, the native engine draws each sample's uniforms as the row it
        has in the whole batch (this rank's share starts at prompt ``first``), so a pool of
        copies samples what one copy would (``verl.rollout.sampling.row_uniforms``: a
        sample's draws depend on the seed, its row and its token index). Other engines
        sample by their own seeding: the same distribution, other draws per pool size."""
        plain = getattr(self.rollout, "_sample", None)
        if plain is None:
            yield
            return

        def shifted(logits, rows, steps, params, seed):
            return plain(logits, rows + first * params.n, steps, params, seed)

        self.rollout._sample = shifted
        try:
            yield
        finally:
            self.rollout._sample = plain

    @contextlib.contextmanager
    def _keeping_groups(self, token: str, first: int = 0):
        """Within the block, each finished group is kept (a CPU copy) for
        :meth:`take_streamed_groups` under ``token``, its prompt index counted in the whole
        batch (this rank's share starts at prompt ``first``)."""
        from verl.rollout.continuous import stream_groups

        # an earlier call's groups: its whole output has them; a batch taken into the loop
        # (this call's own, continued, or a later one) keeps its groups for its token
        live = self.feed.live_tokens()
        with self._streamed_lock:
            self._streamed = [g for g in self._streamed if g[0] in live]
        with stream_groups(self._group_keeper(token, first)):
            yield

    def _group_keeper(self, token: str, first: int) -> Any:
        """The group sink that keeps each group under ``token`` (module docstring)."""

        def keep(prompt: int, group: DataProto, params: Any) -> None:
            # a copy of its own: a slice would carry its whole batch's storage across
            group = group.clone().to("cpu")
            with self._streamed_lock:
                self._streamed.append((token, first + prompt, group, params.logprob_temperature))

        return keep

    def _mailbox(self, mode: str) -> WeightMailbox:
        with self._box_lock:
            if self.weight_box is None:
                self.weight_box = WeightMailbox(mode)
            elif self.weight_box.mode != mode:
                raise ValueError(
                    f"trainer.partial_rollout={mode}: the rollout copy's mailbox runs "
                    f"{self.weight_box.mode}; one run takes one mode"
                )
            return self.weight_box

    def _start_with_mailbox(
        self, mode: str, version: int, taken: Offer | None = None
    ) -> tuple[WeightMailbox, int, float]:
        """Before a call under the mailbox: load its newest post (between two calls, as
        :meth:`load_policy_weights`: a native loop's kept rows are dropped, a vLLM engine
        takes the weights); without one, the module keeps what it holds (``version`` when
        nothing was ever loaded through the mailbox). A call whose batch a loop ``taken``
        loads nothing: it continues that loop, which takes a post between two decode
        steps, and starts with the version the loop held when it took the batch. Returns
        the mailbox, the version the call starts with and the load's seconds."""
        box = self._mailbox(mode)
        if taken is not None and taken.version is not None:
            return box, int(taken.version), 0.0
        pending = box.take()
        load_s = 0.0
        if pending is not None:
            start = time.perf_counter()
            self.load_policy_weights(*pending)
            load_s = time.perf_counter() - start
            box.held = pending[1]
        elif box.held is None:
            box.held = int(version)
        return box, int(box.held), load_s

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, rank_zero_result=True, beside=True)
    def post_policy_weights(
        self, state: dict[str, torch.Tensor], version: int, mode: str
    ) -> int | None:
        """Partial rollouts: post ``state`` (the actor's full state dict, CPU) as the weights
        of ``version`` into this copy's mailbox (``mode``: ``trainer.partial_rollout``), for
        the running call's next decode step or the next call's start; an older post never
        replaces a newer one. Answered beside a running call on the Ray backend. Returns the
        newest version posted."""
        box = self._mailbox(mode)
        box.post(state, int(version))
        return box.posted_version

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, beside=True)
    def weight_mailbox_state(self) -> dict[str, Any] | None:
        """The mailbox's ``held`` version (None while it holds none: before its first load,
        or after a checkpoint's reset until the next call's start loads) and counters now,
        and under ``call`` the ``meta_info[WEIGHT_MAILBOX]`` entry of the last call (None
        before the first post or call); the driver gets one per rank (a pool: each copy's
        own mailbox). Answered beside a running call: its mid-call swaps reach the driver's
        metrics before the call returns."""
        box = self.weight_box
        if box is None:
            return None
        held = box.held
        return {
            "held": None if held is None else int(held),
            "stats": dict(box.stats),
            "call": self.call_mailbox,
        }

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, beside=True)
    def reset_weight_mailbox(self) -> None:
        """Forget what was posted and held (a checkpoint loaded: the next step posts again)."""
        with self._box_lock:
            if self.weight_box is not None:
                self.weight_box.reset()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, rank_zero_result=True, beside=True)
    def take_streamed_groups(self, token: str) -> list[tuple[int, DataProto, float]]:
        """The groups the call of ``token`` has finished since the last take, as ``[(prompt
        index, its n rows, log-prob temperature), ...]``; other tokens' stay (the running
        call's, a batch's taken into its loop); a call's start drops those of earlier calls.
        Answered beside a running call on the Ray backend."""
        with self._streamed_lock:  # the running call's and taken batches' stay
            taken = [g for g in self._streamed if g[0] == token]
            self._streamed = [g for g in self._streamed if g[0] != token]
        return [(prompt, group, temp) for _, prompt, group, temp in taken]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, beside=True)
    def take_pool_groups(self, token: str) -> list[tuple[int, DataProto, float]]:
        """:meth:`take_streamed_groups` of every rank of a pool of copies (the driver gets
        one list per rank; prompt indices are the whole batch's)."""
        return self.take_streamed_groups(token)

    @register(
        dispatch_mode=Dispatch.DP_COMPUTE,
        reads=_GENERATE.reads,
        optional=_GENERATE.optional,
        meta=_GENERATE.meta,
        beside=True,
    )
    def offer_batch(self, prompts: DataProto, key: Any, token: str) -> dict[str, bool]:
        """Offer a queued batch (``prompts`` as its own ``generate_sequences`` call will get
        them, ``key`` that call's ``meta_info[FEED_KEY]``, ``token`` its stream token) to the
        running or a later call's loop (``verl/workers/copy_feed.py``). Answered beside a
        running call. Returns ``{"feeds": whether this copy's engine can take it}`` (a
        native engine with ``decode_slots`` and continuous batching)."""
        rollout = self.rollout
        feeds = bool(
            getattr(rollout, "max_num_seqs", None) and getattr(rollout, "continuous_batching", 0)
        )
        if feeds:  # on the engine's device, as run_generation hands the call's prompts over
            self.feed.offer(to_device(prompts, self.device), key, token)
        return {"feeds": feeds}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, rank_zero_result=True, beside=True)
    def feed_stats(self) -> dict[str, float]:
        """Counters of continuous batching across calls: batches ``offered``, ``taken`` into
        a running loop, calls ``continued``, and the engine's ``fed_batches`` (joins)."""
        return {k: float(v) for k, v in self.feed.stats.items()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_policy_weights(self, state: dict[str, torch.Tensor], version: int) -> dict[str, float]:
        """Copy the actor's full state dict ``state`` (names of the actor's module) into
        this copy's module, in place; ``version`` is the number of actor updates it holds.

        Must not run while this worker generates (the trainer calls it between two
        generations, on the rollout's own thread). Returns the push's seconds and size.
        """
        drop = getattr(self.rollout, "drop_session", None)
        if drop is not None:  # rows a native loop kept for a later call: old weights
            drop()
        self.feed.drop_taken()  # their calls generate them afresh
        module = self.engine.module
        targets = module.state_dict()
        missing = sorted(set(targets) - set(state))
        unknown = sorted(set(state) - set(targets))
        if missing or unknown:
            raise ValueError(
                f"load_policy_weights: the actor's state dict does not match the rollout "
                f"copy's module (missing {missing[:3]}, unexpected {unknown[:3]})"
            )

        def receive(weights: Any) -> None:
            for name, tensor in weights:
                targets[name].copy_(tensor)

        rollout = self.spec.rollout
        stats = push_weights(
            receive,
            state.items(),
            bucket_bytes=rollout.weight_sync_bucket_mb * 2**20,
            timeout_s=rollout.weight_sync_timeout_s,
            role="async rollout copy",
            engine="rollout-copy",
            timeout_key="actor_rollout_ref.rollout.vllm.weight_sync_timeout_s",
        )
        seconds = stats["seconds"]
        if self.rollout.owns_weights:  # vLLM: its engine takes them now, between generations
            self.rollout.wake_up()
            seconds += self._sync_rollout_weights()["rollout/weight_sync_seconds"]
            self.rollout.sleep()
        self.policy_version = version
        return {"async/weight_sync_seconds": seconds}
