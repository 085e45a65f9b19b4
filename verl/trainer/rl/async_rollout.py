"""One-step-off asynchronous rollout (``trainer.async_rollout=true``).

Synchronous training alternates: generate batch k with the weights after k-1 updates, then
train on it. Here generation runs on a background thread, on a copy of the policy of its
own (:class:`~verl.workers.rollout_copy.RolloutCopyWorker`), ``trainer.max_staleness``
batches ahead of training (default 1)::

    step k:  take batch k (generated earlier)     | rollout thread: generating batch k+1
             push weights v_{k-1} to the copy,    |   (weights v_{k-2}), then loads
             queue batch k+s with them            |   v_{k-1} and generates batch k+s
             score, log-probs, advantages,        |
             update -> v_k                        |

``v_j`` is the policy after ``j`` actor updates. A batch queued at step ``k`` (weights
``v_{k-1}``) trains at step ``k+s`` (weights ``v_{k+s-1}``): its **staleness**, the number
of updates between the policy that sampled it and the policy that trains on it, is ``s``
(less for the first ``s`` steps). It is recorded per sample (``staleness``,
``rollout_policy_version`` in ``non_tensor_batch``) and as metrics, and a batch staler than
``max_staleness`` is an error, never trained on.

Where the copy runs: in the driver process on the local backend; on the Ray backend, in a
Ray actor of its own (a resource pool of one process beside the device map's; with
``trainer.rollout_copies`` > 1 a pool of copies splitting each batch's prompts), the thread
here then only waits on its calls (streaming: and polls it for the groups its call has
finished, :mod:`verl.trainer.rl.ray_copy_link`). Weights reach it through the same bucketed
push the vLLM backend takes them with (:func:`verl.rollout.weight_sync.push_weights`).

Correctness of the weights: the rollout thread runs one task after another (load weights,
generate), so the copy's weights never change during a generation; the trainer only hands
it a snapshot (``state_dict_for_save``, CPU copies) taken at the step boundary, and the
actor's optimizer never touches the copy.

Continuous batching across calls (streaming, native engine with ``decode_slots``): a call
takes the next queued batches into its free decode slots when the copy holds their weights
(:mod:`verl.trainer.rl.rollout_feed`; a copy in a Ray actor gets them offered); such a
batch's own task then loads nothing and its call continues the engine's loop. A batch
queued with newer weights waits for its load, between two calls, as before.

Sampling is seeded per generation batch (``trainer.seed`` and the batch's index), so a
batch's responses depend only on the prompts and the weights, not on the thread's timing.

Checkpoints: the in-flight batches are **saved** with the checkpoint (prompts, responses,
policy version), after waiting for them to finish; the loader position saved beside them
points after the last one queued. A resumed run trains on exactly those batches and then
continues as the uninterrupted run would.

Their files hold data only, nothing is unpickled when they load
(:mod:`verl.trainer.rl.inflight_files`).

Partial rollouts (``trainer.partial_rollout``, streaming only): with a ``mailbox``
(:class:`~verl.rollout.partial.WeightMailbox`) the trainer posts each step's weights to it
(:meth:`AsyncRollout.post_weights`) instead of queueing them with a batch; a generation
takes the newest posted weights before it starts and, on the native engine's continuous
loop, between two decode steps. Each token then records the version that sampled it
(``rollout_token_versions``) and a group's version is its oldest token's. A copy in a Ray
actor owns a mailbox of its own, in its process: the posts go there, and each call reports
the version it started with (:mod:`verl.trainer.rl.ray_copy_link`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.rollout.partial import WeightMailbox, oldest_token_version, weight_mailbox
from verl.trainer.lifecycle.checkpoint import CheckpointError
from verl.trainer.rl import ray_copy_link as link
from verl.trainer.rl.inflight_files import (
    INFLIGHT_JSON,
    INFLIGHT_TENSORS,
    encode_batches,
    read_inflight,
)
from verl.trainer.rl.rollout_feed import QueueFeed, RayFeed, call_names
from verl.utils.atomic_io import atomic_path, write_json_atomic

logger = logging.getLogger(__name__)

__all__ = ["AsyncRollout", "StalenessError"]


class StalenessError(RuntimeError):
    """A batch would train more than ``trainer.max_staleness`` updates after it was sampled."""


@dataclass
class _InFlight:
    prompts: DataProto
    version: int  # actor updates in the weights that generate it
    index: int  # generation batch number (seeds the sampling)
    result: Future | None = None
    gen: DataProto | None = None  # the finished generation (a loaded checkpoint's)
    load: dict[str, torch.Tensor] | None = None  # weights the copy loads before it
    # taken into the running call's free slots (a ``QueueFeed``): its own call continues
    # it, with the weights that call holds (no load)
    claimed: bool = False
    offered: bool = False  # offered to a copy in a Ray actor (``rollout_feed.RayFeed``)
    # streamed groups (``stream_groups``): (prompt index, its n rows) reported by the engine
    # and not yet taken by :meth:`AsyncRollout.take_groups`; the prompts already taken
    ready: list[tuple[int, DataProto]] = field(default_factory=list)
    taken: set[int] = field(default_factory=set)
    reported: set[int] = field(default_factory=set)  # prompts the sink has had


class AsyncRollout:
    """The queue of generation batches ahead of training, on a thread of its own.

    Args:
        rollout_group: worker group of :class:`~verl.workers.rollout_copy.RolloutCopyWorker`.
        generate: ``(group, prompts) -> responses`` (the trainer's ``_generate``: rollout
            plus the prompts' per-sample fields joined back on).
        weights: returns the actor's current full state dict (CPU copies).
        max_staleness: how many batches generation runs ahead (``trainer.max_staleness``).
        seed: base of the per-batch sampling seeds.
        mailbox: partial rollouts (module docstring); None = weights between calls only.
        threads: torch intra-op threads of the rollout thread (``trainer.rollout_num_threads``,
            set once when the thread starts); None = the count torch gives a new thread.
    """

    def __init__(
        self,
        rollout_group: Any,
        generate: Callable[[Any, DataProto], DataProto],
        weights: Callable[[], dict[str, torch.Tensor]],
        *,
        max_staleness: int,
        seed: int,
        mailbox: WeightMailbox | None = None,
        threads: int | None = None,
    ) -> None:
        if max_staleness < 0:
            raise ValueError(f"trainer.max_staleness={max_staleness} must be >= 0")
        self.group = rollout_group
        self._generate = generate
        self._weights = weights
        self.max_staleness = max_staleness
        self.seed = seed
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verl-rollout")
        if threads is not None:
            # torch's intra-op count is per thread once a thread sets it, but setting it on a
            # new thread also resets the calling thread's: start the rollout thread with its
            # count now, then restore the trainer's
            trainer_threads = torch.get_num_threads()
            self._executor.submit(_own_threads, threads).result()
            torch.set_num_threads(trainer_threads)
        self._queue: deque[_InFlight] = deque()
        self._launched = 0  # generation batches queued since the start of the run
        self._copy_version: int | None = None  # what the copy holds (None: unknown)
        self._pending_meta: list[dict[str, Any]] = []  # load_state_dict -> load_files
        #: the sampling seed of generation batch ``index`` (a streaming source may choose)
        self.seed_for: Callable[[int], int] = lambda index: self.seed * 1_000_003 + index
        #: a streaming source's buffer, saved and restored with the in-flight batches
        #: (``state_dict`` / ``load_state_dict`` / ``save_files`` / ``load_files``)
        self.stream: Any = None
        #: report each prompt's group as the engine finishes it (:meth:`take_groups`), and
        #: let a call take the next queued batches into its free slots (``rollout_feed``)
        self.stream_groups = False
        self._progress = threading.Condition()  # a group streamed or a batch finished
        self.mailbox = mailbox
        self._epoch = 0  # dropped queues so far: a fed batch's call key includes it

    def __len__(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------------ the pipeline
    def fill(
        self, next_prompts: Callable[[], DataProto], version: int, limit: int | None = None
    ) -> None:
        """Queue batches from ``next_prompts`` with the weights of ``version`` updates until
        ``limit`` are in flight (default ``max_staleness + 1``: the one to train now and
        those ahead)."""
        limit = self.max_staleness + 1 if limit is None else limit
        while len(self._queue) < limit:
            prompts = next_prompts()
            # One id per prompt: the n responses of a prompt share it (the GRPO group).
            prompts.non_tensor_batch["uid"] = np.array(
                [f"{self._launched}-{i}" for i in range(len(prompts))], dtype=object
            )
            item = _InFlight(prompts, version, self._launched)
            self._launched += 1
            item.load = None if self.mailbox is not None else self._weights_for(version)
            item.result = self._executor.submit(self._run, item)
            item.result.add_done_callback(lambda _: self._notify())
            self._queue.append(item)

    def _notify(self) -> None:
        with self._progress:
            self._progress.notify_all()

    def _weights_for(self, version: int) -> dict[str, torch.Tensor] | None:
        """A snapshot of the actor's weights (taken now, at the step boundary) for the copy
        to load before generating with ``version``; None when it will hold them already."""
        if self._copy_version == version:
            return None
        self._copy_version = version
        return self._weights()

    def post_weights(self, version: int) -> None:
        """Partial rollouts: post a snapshot of the actor's weights (``version`` updates) to
        the mailbox, for the running generation's next decode step or the next one's start;
        nothing when it has them already, or without a mailbox."""
        box = self.mailbox
        if box is not None and (box.posted_version is None or version > box.posted_version):
            if self._copy_in_other_process():  # into the copy's own mailbox, in its process
                link.post_to_copy(self.group, box, self._weights(), version)
            else:
                box.post(self._weights(), version)

    def _run(self, item: _InFlight) -> DataProto:
        """On the rollout thread: load ``item.load`` (if any; with a mailbox, its newest
        post), then generate ``item``; a claimed item's call continues the loop that took
        it, with the weights it holds."""
        sync_s = 0.0
        weights, version = item.load, item.version
        item.load = None  # the snapshot is not kept with the queue
        remote_box = self.mailbox is not None and self._copy_in_other_process()
        if item.claimed or remote_box:  # a remote copy takes its mailbox's post itself
            weights = None
        elif self.mailbox is not None:
            pending = self.mailbox.take()
            weights, version = pending if pending is not None else (None, version)
        if weights is not None:
            sync_s = self.group.load_policy_weights(weights, version)[0][
                "async/weight_sync_seconds"
            ]
        if self.mailbox is not None and not item.claimed and not remote_box:
            if weights is not None or self.mailbox.held is None:
                self.mailbox.held = version
            item.version = max(item.version, self.mailbox.held)  # before any group is out
        start = time.perf_counter()
        prompts = self._call_prompts(item)
        with contextlib.ExitStack() as stack:
            if remote_box:
                from verl.workers.rollout_copy import WEIGHT_MAILBOX

                prompts.meta_info[WEIGHT_MAILBOX] = link.mailbox_meta(self.mailbox, version)
            else:
                stack.enter_context(self._mailbox_in_force())
            if self.stream_groups and self._copy_in_other_process():
                from verl.workers.rollout_copy import FEED_KEY, STREAM_TOKEN

                # the copy's own sink keeps the groups; polled while the call runs; the
                # queued batches that may join are offered to its loop (rollout_feed)
                prompts.meta_info[FEED_KEY], token = call_names(self, item)
                prompts.meta_info[STREAM_TOKEN] = token
                sink = self._sink_for(item, prompts)
                box = self.mailbox if remote_box else None
                stack.enter_context(link.polling(self.group, token, sink, box))
                stack.enter_context(RayFeed(self, item).running())
            elif self.stream_groups:
                from verl.rollout.continuous import feed_prompts, stream_groups

                stack.enter_context(stream_groups(self._sink_for(item, prompts)))
                # the next queued batches into this call's free slots (native engine)
                stack.enter_context(feed_prompts(QueueFeed(self, item)))
            gen = self._generate(self.group, prompts)
        if remote_box:  # the version the copy started the call with, what it loaded then
            start_version, sync_s = link.absorb_call_output(self.mailbox, gen, self.group)
            item.version = max(item.version, start_version)
        gen.meta_info["async_gen_seconds"] = time.perf_counter() - start
        gen.meta_info["async_weight_sync_seconds"] = sync_s
        return gen

    def _call_prompts(self, item: _InFlight) -> DataProto:
        """The prompts ``item``'s generation call gets: its own, seeded for its index."""
        return DataProto.from_dict(
            tensors=dict(item.prompts.batch),
            non_tensors=dict(item.prompts.non_tensor_batch),
            meta_info={**item.prompts.meta_info, "seed": self.seed_for(item.index)},
        )

    def _sink_for(self, item: _InFlight, prompts: DataProto) -> Callable[..., None]:
        """The group sink of ``item``'s call (``prompts``: as that call gets them); a prompt
        reported twice (a fed batch generated afresh) is kept once."""

        def sink(prompt: int, group: DataProto, params: Any) -> None:
            group = _join_prompt_fields(group.to("cpu"), prompts[prompt : prompt + 1])
            # what the worker adds to a whole call's output (run_generation)
            group.meta_info["temperature"] = params.logprob_temperature
            with self._progress:
                if prompt in item.reported:
                    return
                item.reported.add(prompt)
                item.ready.append((prompt, group))
                self._progress.notify_all()

        return sink

    def _copy_in_other_process(self) -> bool:
        """Whether the copy runs in a process of its own (a Ray actor), out of reach of
        this process's group sink and mailbox (:mod:`verl.trainer.rl.ray_copy_link`)."""
        return link.copy_in_other_process(self.group)

    def _call_key(self, item: _InFlight) -> tuple[int, int, int]:
        return (id(self), self._epoch, item.index)

    def _mailbox_in_force(self) -> contextlib.AbstractContextManager:
        return (
            weight_mailbox(self.mailbox) if self.mailbox is not None else contextlib.nullcontext()
        )

    def take_groups(self) -> tuple[list[tuple[DataProto, int, tuple[int, int]]], dict[str, float]]:
        """The groups finished since the last call, oldest batch first: ``[(the n responses
        of one prompt, the version that generated them, (batch index, prompt index)), ...]``,
        and the async timing metrics of the batches that ended. A batch leaves the queue
        once it has ended; the groups its engine did not stream (the hf engine) or that were
        not polled yet (a copy in a Ray actor) come from its whole output then."""
        out: list[tuple[DataProto, int, tuple[int, int]]] = []
        metrics = {"timing_s/async_gen": 0.0, "timing_s/async_weight_sync": 0.0}
        for item in list(self._queue):
            done = item.gen is not None or (item.result is not None and item.result.done())
            with self._progress:
                ready, item.ready = item.ready, []
            for prompt, group in ready:
                item.taken.add(prompt)
                out.append((group, oldest_token_version(group, item.version), (item.index, prompt)))
            if not done or item is not self._queue[0]:
                continue
            gen, _, timing = self.pop_any()
            for key, value in timing.items():
                metrics[key] += value
            n = len(gen) // len(item.prompts)
            for prompt in range(len(item.prompts)):
                if prompt not in item.taken:
                    group = gen[prompt * n : (prompt + 1) * n]
                    version = oldest_token_version(group, item.version)
                    out.append((group, version, (item.index, prompt)))
        return out, metrics

    def wait_progress(self, timeout_s: float = 1.0) -> None:
        """Wait (at most ``timeout_s``) until a group is streamed or the oldest batch ends."""
        with self._progress:
            if self._queue and not any(i.ready for i in self._queue) and not self.head_ready():
                self._progress.wait(timeout_s)

    def queued_prompts(self) -> int:
        """Prompts in the queued batches (finished or not)."""
        return sum(len(item.prompts) for item in self._queue)

    def head_ready(self) -> bool:
        """Whether the oldest queued batch has finished generating (False when none)."""
        if not self._queue:
            return False
        item = self._queue[0]
        return item.gen is not None or (item.result is not None and item.result.done())

    def pop_any(self) -> tuple[DataProto, int, dict[str, float]]:
        """The oldest batch (waiting for it) as ``(responses, the version that generated
        them, its async timing metrics)``, with no staleness check: a streaming source
        checks each sample when it trains."""
        item = self._queue.popleft()
        gen = item.gen if item.gen is not None else item.result.result()
        metrics = {
            "timing_s/async_gen": float(gen.meta_info.pop("async_gen_seconds", 0.0)),
            "timing_s/async_weight_sync": float(
                gen.meta_info.pop("async_weight_sync_seconds", 0.0)
            ),
        }
        return gen, item.version, metrics

    def pop(self, train_version: int) -> tuple[DataProto, dict[str, float]]:
        """The oldest batch, finished, for training on the weights of ``train_version``
        updates: its responses with ``staleness`` and ``rollout_policy_version`` per sample,
        and the ``async/*`` metrics. Raises :class:`StalenessError` past ``max_staleness``."""
        item = self._queue.popleft()
        gen = item.gen if item.gen is not None else item.result.result()
        staleness = train_version - item.version
        if staleness > self.max_staleness or staleness < 0:
            raise StalenessError(
                f"a batch sampled with the policy after {item.version} updates would train "
                f"after {train_version}: staleness {staleness} > trainer.max_staleness="
                f"{self.max_staleness}"
            )
        gen.non_tensor_batch["rollout_policy_version"] = np.full(len(gen), item.version)
        gen.non_tensor_batch["staleness"] = np.full(len(gen), staleness)
        metrics = {
            "async/staleness_mean": float(staleness),
            "async/staleness_max": float(staleness),
            "async/stale_sample_fraction": float(staleness > 0),
            # wall-clock, on the rollout thread (the step's own wait is timing_s/gen)
            "timing_s/async_gen": float(gen.meta_info.pop("async_gen_seconds", 0.0)),
            "timing_s/async_weight_sync": float(
                gen.meta_info.pop("async_weight_sync_seconds", 0.0)
            ),
        }
        return gen, metrics

    # ------------------------------------------------------------------ checkpoints
    def _finish(self) -> None:
        for item in self._queue:
            if item.gen is None:
                item.gen = item.result.result()

    def _settle(self) -> None:
        """Before a checkpoint: every batch finished; with a streaming source, every group
        moved into its buffer (so a group is saved once, in the buffer)."""
        self._finish()
        if self.stream is not None:
            self.stream.absorb()

    def state_dict(self) -> dict[str, Any]:
        """Counters (JSON); the in-flight batches go to a file (:meth:`save_files`)."""
        self._settle()
        state = {
            "launched": self._launched,
            "inflight": [{"version": i.version, "index": i.index} for i in self._queue],
        }
        if self.stream is not None:
            state["stream"] = self.stream.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._drop_queue()
        self._launched = int(state["launched"])
        self._copy_version = None  # the copy's weights are pushed again before use
        if self.mailbox is not None:
            self.mailbox.reset()
            if self._copy_in_other_process():
                link.reset_copy_mailbox(self.group)
        self._pending_meta = list(state["inflight"])
        if self.stream is not None:
            # a checkpoint of one-step-off mode resumed streaming: an empty buffer
            self.stream.load_state_dict(state.get("stream"))

    def save_files(self, directory: Path) -> None:
        """Write the in-flight batches (waiting for their generation to finish):
        :data:`INFLIGHT_TENSORS` (every tensor) and :data:`INFLIGHT_JSON` (the rest).

        Raises:
            TypeError: a batch holds a value that cannot be stored as data (see
                :func:`encode_batches`); nothing is written.
        """
        self._settle()
        tensors, doc = encode_batches([(i.prompts, i.gen) for i in self._queue])
        directory.mkdir(parents=True, exist_ok=True)
        from safetensors.torch import save_file

        with atomic_path(directory / INFLIGHT_TENSORS) as tmp:
            save_file(tensors, str(tmp))
        write_json_atomic(directory / INFLIGHT_JSON, doc)
        if self.stream is not None:
            self.stream.save_files(directory)

    def load_files(self, directory: Path) -> None:
        """Restore the in-flight batches :meth:`save_files` wrote (after
        :meth:`load_state_dict`).

        Raises:
            CheckpointError: the files are missing, malformed, pickled (an ``inflight.pt``:
                refused unread) or list another number of batches than the trainer state.
        """
        meta = self._pending_meta
        saved = read_inflight(directory) if meta else []
        if len(saved) != len(meta):
            raise CheckpointError(
                f"{directory / INFLIGHT_JSON}: {len(saved)} in-flight batches, the trainer "
                f"state lists {len(meta)}"
            )
        for m, (prompts, gen) in zip(meta, saved):
            self._queue.append(_InFlight(prompts, int(m["version"]), int(m["index"]), gen=gen))
        self._pending_meta = []
        if self.stream is not None:
            self.stream.load_files(directory)

    def _drop_queue(self) -> None:
        self._epoch += 1  # a loop waiting for a dropped batch's call is never continued
        for item in self._queue:
            if item.result is not None:
                item.result.cancel()
        for item in self._queue:  # a running generation must end before the copy is reused
            if item.result is not None and not item.result.cancelled():
                # dropped work: its error does not matter
                with contextlib.suppress(Exception):
                    item.result.result()
        self._queue.clear()

    def close(self) -> None:
        """Drop the queued batches and stop the thread (idempotent)."""
        self._drop_queue()
        self._executor.shutdown(wait=True)


def _own_threads(count: int) -> None:
    """On the rollout thread: its own intra-op count (read back once, which fixes it for this
    thread: a later ``set_num_threads`` on the trainer's thread leaves it alone)."""
    torch.set_num_threads(count)
    if torch.get_num_threads() != count:
        raise RuntimeError(
            f"trainer.rollout_num_threads={count}: torch kept {torch.get_num_threads()}"
        )


def _join_prompt_fields(gen: DataProto, prompts: DataProto) -> DataProto:
    """``gen`` (the rollout of ``prompts``, ``n`` rows per prompt) with the prompts'
    per-sample fields it lacks repeated on, as the trainer's ``_generate`` joins them on a
    whole call's output."""
    n = len(gen) // len(prompts)
    kept = prompts.select(
        batch_keys=[k for k in prompts.batch if k not in gen.batch],
        non_tensor_keys=[k for k in prompts.non_tensor_batch if k not in gen.non_tensor_batch],
        meta_keys=[],
    )
    if kept.batch or kept.non_tensor_batch:
        gen.union(kept.repeat(n, interleave=True))
    return gen


# ---------------------------------------------------------------------- the files' format
#
# inflight.json: {"format": 1, "batches": [{"prompts": P, "gen": P}, ...]} where P is
def build_async_rollout(
    cfg: Any,
    tokenizer: Any,
    module: torch.nn.Module | None,
    generate: Callable[[Any, DataProto], DataProto],
    actor_group: Any,
    placement: Any,
) -> AsyncRollout:
    """The rollout copy and the pipeline over it.

    The copy is a worker group of one :class:`~verl.workers.rollout_copy.RolloutCopyWorker`
    on a resource pool of its own (``async_rollout``): in the driver process on the local
    backend, one more Ray actor on the Ray backend (``trainer.rollout_copies`` actors: a
    pool, each batch's prompts split across them, :mod:`verl.trainer.rl.ray_copy_link`). Its model is loaded like the actor's, or
    is ``module`` (a copy of the actor's initial module). It joins ``placement``'s pools, so
    it is shut down with the roles.
    """
    from verl.controller.factory import make_worker_group
    from verl.controller.resource_pool import ResourcePool
    from verl.utils.device import resolve_device
    from verl.workers.rollout_copy import RolloutCopyWorker
    from verl.workers.specs import rollout_copy_spec

    device_type = resolve_device(cfg.trainer.device).type
    copies = getattr(cfg.trainer, "rollout_copies", 1)  # a pool: one Ray actor per copy
    pool = ResourcePool([copies], use_gpu=device_type == "cuda", name="async_rollout")
    options = None
    if cfg.worker_backend == "ray":
        from verl.controller.ray_backend import RayOptions

        options = RayOptions(
            device_type=device_type, heartbeat_timeout_s=cfg.trainer.worker_heartbeat_timeout
        )
    group = make_worker_group(
        cfg.worker_backend,
        RolloutCopyWorker,
        pool,
        spec=rollout_copy_spec(cfg),
        module=module,
        tokenizer=copy.deepcopy(tokenizer),  # fast tokenizers are not safe across threads
        ray_options=options,
    )
    placement.pools.append(group)
    group.init_model(total_steps=1)  # its optimizer never steps
    partial = getattr(cfg.trainer, "partial_rollout", "off")
    streaming = cfg.trainer.rollout_mode == "streaming"
    return AsyncRollout(
        group,
        generate,
        lambda: actor_group.state_dict_for_save()[0],  # rank 0 holds the full dict
        max_staleness=cfg.trainer.max_staleness,
        seed=cfg.trainer.seed,
        mailbox=WeightMailbox(partial) if streaming and partial != "off" else None,
        threads=cfg.trainer.rollout_num_threads,
    )
