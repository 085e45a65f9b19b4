"""Streaming rollout (``trainer.async_rollout=true trainer.rollout_mode=streaming``).

The rollouter is the one-step-off pipeline's (:class:`~verl.trainer.rl.async_rollout.AsyncRollout`):
a copy of the policy generating on a thread of its own (a Ray actor on the Ray backend),
loading the actor's weights between two generations. What differs is how its samples reach
training:

- **a bounded buffer of groups.** Generation runs ahead of training while the prompts
  queued or buffered stay within ``trainer.stream_buffer_groups`` (default
  ``(max_staleness + 1) * data.train_batch_size``); every prompt batch drawn is queued with
  the weights the trainer has at that moment. Each finished generation is split into its
  groups (the ``rollout.n`` responses of one prompt, ``uid``) as it arrives;
- **a batch when enough groups are ready.** A step takes the oldest
  ``data.train_batch_size`` groups, waiting only while fewer are ready;
- **per-sample staleness.** Every sample records the policy version that generated it
  (``rollout_policy_version``: actor updates in its weights) and, when it trains, its
  ``staleness`` (updates since). A group staler than ``trainer.max_staleness`` is dropped,
  never trained on, and counted (``stream/dropped_groups``, ``stream/dropped_groups_total``).

``max_staleness=0`` queues one batch per step with the current weights and waits for it:
the synchronous trainer's samples, weights and updates (with ``rollout.seed`` set, the
batch of step ``k`` is sampled with the seed the synchronous rollout gives its ``k``-th
call, ``rollout.seed + k``; ``tests/trainer/test_streaming.py`` checks the weights within
1e-6).

Groups stream at the granularity of one generation call (a loader batch of
``data.train_batch_size`` prompts): the copy's engine generates that call with continuous
batching when it has more rows than ``rollout.decode_slots``, but returns the call whole.

Checkpoints: the buffered groups are saved beside the in-flight batches
(``async_rollout/stream_buffer.safetensors`` + ``stream_buffer.json``, the same data-only
format; nothing is unpickled on load), and the counters in the trainer state, so a run
killed and resumed mid-stream trains on exactly the groups the uninterrupted run does.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from verl.protocol import DataProto
from verl.trainer.lifecycle.checkpoint import CheckpointError
from verl.trainer.lifecycle.metrics import timer
from verl.trainer.rl.async_rollout import AsyncRollout, read_inflight, write_batch_files

logger = logging.getLogger(__name__)

__all__ = ["STREAM_FILES", "StreamingSource"]

STREAM_FILES = "stream_buffer"  # stream_buffer.safetensors + stream_buffer.json

Scored = tuple[DataProto, dict[str, Any]]
Draw = Callable[[], DataProto]


class StreamingSource:
    """The batch source of streaming rollout (module docstring).

    Args:
        pipeline: the rollouter (its queue of generation batches on the rollout copy).
        score: ``(responses, metrics) -> (scored responses, metrics)``.
        version: the actor updates so far (the weights this step trains).
        num_groups: groups per training batch (``data.train_batch_size``).
        max_staleness: the most actor updates a trained sample may lag.
        buffer_groups: prompts queued or buffered ahead of training (at least
            ``num_groups``); None = ``(max_staleness + 1) * num_groups``.
    """

    def __init__(
        self,
        pipeline: AsyncRollout,
        score: Callable[[DataProto, dict[str, Any]], Scored],
        version: Callable[[], int],
        *,
        num_groups: int,
        max_staleness: int,
        buffer_groups: int | None = None,
    ) -> None:
        if max_staleness < 0:
            raise ValueError(f"trainer.max_staleness={max_staleness} must be >= 0")
        capacity = (max_staleness + 1) * num_groups if buffer_groups is None else buffer_groups
        if capacity < num_groups:
            raise ValueError(
                f"trainer.stream_buffer_groups={capacity} < data.train_batch_size="
                f"{num_groups}: the buffer must hold one training batch"
            )
        self.pipeline = pipeline
        self.score = score
        self.version = version
        self.num_groups = num_groups
        self.max_staleness = max_staleness
        self.capacity = capacity
        self.groups: deque[tuple[DataProto, int]] = deque()  # (the n responses, version)
        self.dropped_total = 0
        pipeline.stream = self  # saved and restored with the pipeline's checkpoint files

    def next(self, draw: Draw) -> Scored:
        version = self.version()
        metrics: dict[str, Any] = {"timing_s/async_gen": 0.0, "timing_s/async_weight_sync": 0.0}
        dropped = 0
        taken: list[tuple[DataProto, int]] = []
        with timer("gen", metrics):  # the wait for the rollouter (it generated meanwhile)
            while len(taken) < self.num_groups:
                self._fill(draw, version)
                self._collect(metrics, wait=not self.groups)
                while self.groups and len(taken) < self.num_groups:
                    group, made_by = self.groups.popleft()
                    if version - made_by > self.max_staleness:
                        dropped += 1
                    else:
                        taken.append((group, made_by))
        # Nothing more is queued after the take: a batch queued now, with these weights,
        # would train one update later (the next step's fill queues with the new weights).
        self.dropped_total += dropped
        gen = DataProto.concat([group for group, _ in taken])
        versions = np.concatenate([np.full(len(group), v) for group, v in taken])
        staleness = version - versions
        gen.non_tensor_batch["rollout_policy_version"] = versions
        gen.non_tensor_batch["staleness"] = staleness
        metrics |= {
            "async/staleness_mean": float(staleness.mean()),
            "async/staleness_max": float(staleness.max()),
            "stream/dropped_groups": float(dropped),
            "stream/dropped_groups_total": float(self.dropped_total),
            "stream/buffered_groups": float(len(self.groups)),
            "stream/queued_prompts": float(self.pipeline.queued_prompts()),
        }
        return self.score(gen, metrics)

    # ------------------------------------------------------------------ the buffer
    def _fill(self, draw: Draw, version: int) -> None:
        """Queue prompt batches with the weights of ``version`` while the prompts queued
        and the groups buffered stay under the capacity."""
        while len(self.groups) + self.pipeline.queued_prompts() < self.capacity:
            before = len(self.pipeline)
            self.pipeline.fill(draw, version, limit=before + 1)
            if len(self.pipeline) == before:
                break

    def _collect(self, metrics: dict[str, Any], wait: bool) -> None:
        """Move finished generations, oldest first, into the buffer as groups; with
        ``wait``, wait for the oldest one when none has finished."""
        while len(self.pipeline) and (self.pipeline.head_ready() or wait):
            gen, made_by, timing = self.pipeline.pop_any()
            for key, value in timing.items():
                metrics[key] += value
            self._add(gen, made_by)
            wait = False

    def _add(self, gen: DataProto, made_by: int) -> None:
        uid = gen.non_tensor_batch["uid"]
        starts = [0] + [i for i in range(1, len(gen)) if uid[i] != uid[i - 1]] + [len(gen)]
        for start, end in itertools.pairwise(starts):
            self.groups.append((gen[start:end], made_by))

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "versions": [v for _, v in self.groups],
            "dropped_total": self.dropped_total,
        }

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.groups.clear()
        state = state or {"versions": [], "dropped_total": 0}
        self._pending_versions = [int(v) for v in state["versions"]]
        self.dropped_total = int(state["dropped_total"])

    def save_files(self, directory: Path) -> None:
        """The buffered groups, as data (:func:`~verl.trainer.rl.async_rollout.write_batch_files`)."""
        marks = [DataProto(meta_info={"version": v}) for _, v in self.groups]
        write_batch_files(
            directory, [(m, g) for m, (g, _) in zip(marks, self.groups)], stem=STREAM_FILES
        )

    def load_files(self, directory: Path) -> None:
        versions = getattr(self, "_pending_versions", [])
        self._pending_versions = []
        if not (directory / f"{STREAM_FILES}.json").is_file():
            if versions:
                raise CheckpointError(
                    f"{directory / STREAM_FILES}.json is missing: the trainer state lists "
                    f"{len(versions)} buffered groups"
                )
            return  # a one-step-off checkpoint: nothing buffered
        saved = read_inflight(directory, stem=STREAM_FILES)
        if [int(m.meta_info["version"]) for m, _ in saved] != versions:
            raise CheckpointError(
                f"{directory / STREAM_FILES}.json: the buffered groups' versions do not match "
                f"the trainer state ({len(saved)} saved, {len(versions)} listed)"
            )
        self.groups.extend((group, v) for (_, group), v in zip(saved, versions))
