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
  never trained on, and counted (``stream/dropped_groups``, ``stream/dropped_groups_total``);
  the stale samples that do train are corrected by the actor's loss (the truncated
  importance weights of ``actor.rollout_is_threshold``, or ``policy_loss=decoupled_ppo``),
  their share logged as ``async/stale_sample_fraction`` and the correction as the actor's
  ``rollout_is_*`` / ``behaviour_weight_*`` metrics.

``max_staleness=0`` queues one batch per step with the current weights and waits for it:
the synchronous trainer's samples, weights and updates (with ``rollout.seed`` set, the
batch of step ``k`` is sampled with the seed the synchronous rollout gives its ``k``-th
call, ``rollout.seed + k``; ``tests/trainer/test_streaming.py`` checks the weights within
1e-6).

**Groups out as they finish.** The rollouter generates inside
:func:`verl.rollout.continuous.stream_groups`: the native engine reports each prompt's group
as soon as its ``n`` samples have stopped (with continuous batching, while the call's long
tail still decodes; with lock-step waves, at the end of each wave), and the group is in the
buffer at the next look, so a step can take its batch before the call that generated its
groups ends. A batch is concatenated in the order of its prompts (generation batch, then
prompt), not of their finishing, so with ``max_staleness=0`` it is the synchronous batch.
Which groups a step takes with ``max_staleness >= 1`` then depends on timing (the samples
themselves do not: per-sample seeding); without continuous batching (one lock-step batch
per call, ``rollout.decode_slots`` null) a call's groups arrive together, as before. The
vLLM engine reports each group as vLLM finishes its request (``verl.rollout.vllm_stream``).
Other engines hand the groups over when the call ends. A copy in a Ray actor keeps them
in its own process and the driver polls them while the call runs
(:mod:`verl.trainer.rl.ray_copy_link`).

**The next batch in the tail's free slots.** With the native engine's continuous batching
(``rollout.decode_slots`` set) a call whose prompts all have a slot takes the next queued
batch into the slots its finished rows left, when the copy holds that batch's weights
(queued with the same version, or always with partial rollouts); the batch's own call then
continues the engine's loop (:mod:`verl.trainer.rl.rollout_feed`). A batch queued with
newer weights waits for its load between two calls. The samples do not change (per-sample
seeding), and every batch still returns whole when its last group stops.

**Dynamic sampling** (``algorithm.filter_groups``): a step takes ``data.train_batch_size``
groups, scores them and keeps those whose metric differs within the group, and takes more
(each take a "generation batch" of DAPO's metrics and of ``max_num_gen_batches``) until it
has enough (:func:`~verl.trainer.rl.dynamic_sampling.collect_informative_groups`, the
synchronous loop over takes instead of new generations): the ``dapo/*`` metrics are the
synchronous ones. Scoring stays on the trainer's thread (reward managers and reward-model
workers are the trainer's), so the filter runs when groups are taken, not as they arrive.

**ReMax** (a greedy baseline per prompt): the scorer gets the taken groups' prompts and
generates the greedy responses with the trainer's current weights (the synchronous step's
path); the baseline depends on the prompt only, so the gradient estimate stays unbiased.

**Partial rollouts** (``trainer.partial_rollout=continue|resume``): each step posts the
actor's weights to the rollouter's mailbox (:meth:`AsyncRollout.post_weights`), which the
native engine loads between two decode steps of the call in flight
(:mod:`verl.rollout.partial`). Tokens then carry the version that sampled them
(``rollout_token_versions``); a sample's ``rollout_policy_version`` is its oldest token's,
its ``staleness`` counts from there, and a group is dropped when its oldest token is staler
than ``max_staleness``.

Checkpoints: the buffered groups are saved beside the in-flight batches
(``async_rollout/stream_buffer.safetensors`` + ``stream_buffer.json``, the same data-only
format; nothing is unpickled on load), and the counters in the trainer state, so a run
killed and resumed mid-stream trains on exactly the groups the uninterrupted run does.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.rollout.partial import TOKEN_VERSIONS
from verl.trainer.lifecycle.checkpoint import CheckpointError
from verl.trainer.lifecycle.metrics import timer
from verl.trainer.rl.async_rollout import AsyncRollout
from verl.trainer.rl.dynamic_sampling import collect_informative_groups, concat_responses
from verl.trainer.rl.inflight_files import read_inflight, write_batch_files

logger = logging.getLogger(__name__)

__all__ = ["STREAM_FILES", "StreamingSource"]

STREAM_FILES = "stream_buffer"  # stream_buffer.safetensors + stream_buffer.json

Scored = tuple[DataProto, dict[str, Any]]
Draw = Callable[[], DataProto]


class StreamingSource:
    """The batch source of streaming rollout (module docstring).

    Args:
        pipeline: the rollouter (its queue of generation batches on the rollout copy).
        score: ``(responses, metrics, prompts=None) -> (scored responses, metrics)``
            (``prompts``: for ReMax's greedy baseline, with ``baseline``).
        version: the actor updates so far (the weights this step trains).
        num_groups: groups per training batch (``data.train_batch_size``).
        max_staleness: the most actor updates a trained sample may lag.
        buffer_groups: prompts queued or buffered ahead of training (at least
            ``num_groups``); None = ``(max_staleness + 1) * num_groups``.
        filter_groups: dynamic sampling: ``{"metric": ..., "max_num_gen_batches": ...}``
            (``algorithm.filter_groups``), or None.
        baseline: the estimator needs a greedy baseline per prompt (ReMax): the scorer gets
            the groups' prompts.
        stream_groups: take groups as the engine finishes them, mid-call (else at the end
            of their generation call).
        pad_token_id: pads the prompt part of groups whose batches differ in prompt width.
    """

    def __init__(
        self,
        pipeline: AsyncRollout,
        score: Callable[..., Scored],
        version: Callable[[], int],
        *,
        num_groups: int,
        max_staleness: int,
        buffer_groups: int | None = None,
        filter_groups: dict[str, Any] | None = None,
        baseline: bool = False,
        stream_groups: bool = True,
        pad_token_id: int = 0,
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
        self.filter_groups = filter_groups
        self.baseline = baseline
        self.pad_token_id = pad_token_id
        # (the n responses, version, (generation batch, prompt index)), in arrival order
        self.groups: deque[tuple[DataProto, int, tuple[int, int]]] = deque()
        self.dropped_total = 0
        pipeline.stream = self  # saved and restored with the pipeline's checkpoint files
        # groups out mid-call, and the next queued batches fed into a call's free slots
        pipeline.stream_groups = stream_groups

    def next(self, draw: Draw) -> Scored:
        if self.filter_groups is None:
            return self._score(*self._take(draw))
        fg = self.filter_groups
        chunks: list[dict[str, Any]] = []

        def take() -> Scored:
            gen, metrics = self._take(draw)
            chunks.append(metrics)
            return gen, metrics

        gen, metrics = collect_informative_groups(
            take(),
            take,
            lambda chunk: self._score(*chunk),
            metric=fg["metric"],
            num_prompts=self.num_groups,
            max_num_gen_batches=fg["max_num_gen_batches"],
            pad_token_id=self.pad_token_id,
        )
        # counts of the whole step, not means over its takes
        metrics["stream/dropped_groups"] = float(sum(m["stream/dropped_groups"] for m in chunks))
        for key in ("stream/dropped_groups_total", "stream/buffered_groups"):
            metrics[key] = chunks[-1][key]
        metrics["stream/queued_prompts"] = float(self.pipeline.queued_prompts())
        return gen, metrics

    def _score(self, gen: DataProto, metrics: dict[str, Any]) -> Scored:
        if not self.baseline:
            return self.score(gen, metrics)
        return self.score(gen, metrics, prompts=_group_prompts(gen))

    def _take(self, draw: Draw) -> tuple[DataProto, dict[str, Any]]:
        """The oldest ``num_groups`` groups not staler than ``max_staleness`` (waiting while
        fewer are ready), in the order of their prompts, unscored; with the metrics."""
        version = self.version()
        metrics: dict[str, Any] = {"timing_s/async_gen": 0.0, "timing_s/async_weight_sync": 0.0}
        dropped = 0
        taken: list[tuple[DataProto, int, tuple[int, int]]] = []
        self.pipeline.post_weights(version)  # partial rollouts: into the call in flight
        with timer("gen", metrics):  # the wait for the rollouter (it generated meanwhile)
            while len(taken) < self.num_groups:
                self._fill(draw, version)
                self._collect(metrics, wait=not self.groups)
                while self.groups and len(taken) < self.num_groups:
                    entry = self.groups.popleft()
                    if version - entry[1] > self.max_staleness:
                        dropped += 1
                    else:
                        taken.append(entry)
        # Nothing more is queued after the take: a batch queued now, with these weights,
        # would train one update later (the next step's fill queues with the new weights).
        self.dropped_total += dropped
        # The prompts' order, not the order their groups finished in: a batch does not
        # depend on which of its groups decoded fastest (max_staleness=0: the sync batch).
        taken.sort(key=lambda entry: entry[2])
        gen = concat_responses([group for group, _, _ in taken], self.pad_token_id)
        versions = np.concatenate([_sample_versions(group, v) for group, v, _ in taken])
        staleness = version - versions
        gen.non_tensor_batch["rollout_policy_version"] = versions
        gen.non_tensor_batch["staleness"] = staleness
        metrics |= {
            "async/staleness_mean": float(staleness.mean()),
            "async/staleness_max": float(staleness.max()),
            # trained on, older than the policy: the rollout correction reweighs them
            "async/stale_sample_fraction": float((staleness > 0).mean()),
            "stream/dropped_groups": float(dropped),
            "stream/dropped_groups_total": float(self.dropped_total),
            "stream/buffered_groups": float(len(self.groups)),
            "stream/queued_prompts": float(self.pipeline.queued_prompts()),
        }
        if self.pipeline.mailbox is not None:  # partial rollouts: swaps made mid-call so far
            box = self.pipeline.mailbox.stats
            metrics["stream/midcall_weight_swaps_total"] = box["swaps"]
            metrics["timing_s/async_midcall_weight_load_total"] = box["load_s"]
        return gen, metrics

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
        """Move the groups finished so far into the buffer (each as soon as the engine
        reports it, else when its generation call ends); with ``wait``, wait for one when
        none has finished."""
        while True:
            groups, timing = self.pipeline.take_groups()
            for key, value in timing.items():
                metrics[key] += value
            self.groups.extend(groups)
            if groups or not wait or not len(self.pipeline):
                return
            self.pipeline.wait_progress()

    def absorb(self) -> None:
        """Every finished group into the buffer (the pipeline's batches have all ended):
        a checkpoint then holds each group once, in the buffer."""
        groups, _ = self.pipeline.take_groups()
        self.groups.extend(groups)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {
            "versions": [v for _, v, _ in self.groups],
            "dropped_total": self.dropped_total,
        }

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.groups.clear()
        state = state or {"versions": [], "dropped_total": 0}
        self._pending_versions = [int(v) for v in state["versions"]]
        self.dropped_total = int(state["dropped_total"])

    def save_files(self, directory: Path) -> None:
        """The buffered groups, as data (:func:`~verl.trainer.rl.async_rollout.write_batch_files`)."""
        marks = [DataProto(meta_info={"version": v, "key": list(k)}) for _, v, k in self.groups]
        write_batch_files(
            directory, [(m, g) for m, (g, _, _) in zip(marks, self.groups)], stem=STREAM_FILES
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
        for position, ((mark, group), v) in enumerate(zip(saved, versions)):
            # the (batch, prompt) order key; checkpoints without it: the buffer's order
            key = mark.meta_info.get("key", [-1, position])
            self.groups.append((group, v, (int(key[0]), int(key[1]))))


def _sample_versions(group: DataProto, version: int) -> np.ndarray:
    """Each sample's oldest token version (``rollout_token_versions``, -1 past the
    response), or ``version`` for every sample of a group without per-token versions."""
    if group.batch is None or TOKEN_VERSIONS not in group.batch:
        return np.full(len(group), version)
    tokens = group.batch[TOKEN_VERSIONS]
    big = torch.iinfo(tokens.dtype).max
    oldest = tokens.masked_fill(tokens < 0, big).min(dim=-1).values
    return np.where(oldest.numpy() == big, version, oldest.numpy()).astype(np.int64)


def _group_prompts(gen: DataProto) -> DataProto:
    """The prompts of the whole groups in ``gen`` (one row per ``uid``, in order): their
    left-padded prompt tensors and per-sample fields, as the trainer drew them (for ReMax's
    greedy baseline, which the scorer generates from them)."""
    uid = gen.non_tensor_batch["uid"]
    first = np.array([0] + [i for i in range(1, len(gen)) if uid[i] != uid[i - 1]])
    width = gen.batch["prompts"].shape[1]
    return DataProto.from_dict(
        tensors={
            "input_ids": gen.batch["prompts"][first],
            "attention_mask": gen.batch["attention_mask"][first, :width],
            "position_ids": gen.batch["position_ids"][first, :width],
        },
        non_tensors={
            k: v[first]
            for k, v in gen.non_tensor_batch.items()
            if k not in ("rollout_policy_version", "staleness")
        },
    )
