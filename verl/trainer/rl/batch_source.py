"""Where an RL step's responses come from: a batch source, chosen once when the trainer is
built, so that the step itself never asks how its batch was made.

A source turns prompt batches into the step's scored responses::

    gen, metrics = source.next(draw)     # draw() -> the next prompt batch of the loader

and the step goes on with log-probs, values, advantages and the updates. The sources:

- :class:`PlainSource`: one prompt batch, generated and scored.
- :class:`DynamicSamplingSource`: DAPO's dynamic sampling (``algorithm.filter_groups``):
  prompt batches are generated and scored until ``data.train_batch_size`` groups with
  mixed rewards are kept (:mod:`verl.trainer.rl.dynamic_sampling`).
- :class:`OneStepOffSource`: ``trainer.async_rollout=true``: the batch queued one step
  earlier, generated on a copy of the policy while the previous step trained, scored now;
  the prompts drawn now are queued for generation with the current weights
  (:mod:`verl.trainer.rl.async_rollout`).
- :class:`~verl.trainer.rl.streaming.StreamingSource`: ``trainer.rollout_mode=streaming``
  (with ``async_rollout``): the same rollout copy generates into a bounded buffer of
  groups, each as soon as the engine finishes it; a step takes ``data.train_batch_size``
  groups, dropping those staler than ``trainer.max_staleness`` (and, with
  ``algorithm.filter_groups``, those with identical rewards) (:mod:`verl.trainer.rl.streaming`).

Every prompt batch a source draws advances the loader, so a resumed run continues after the
last batch generated from. :func:`build_batch_source` picks the source from the config.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from verl.protocol import DataProto
from verl.trainer.lifecycle.metrics import timer
from verl.trainer.rl.dynamic_sampling import collect_informative_groups

if TYPE_CHECKING:
    from verl.trainer.rl.async_rollout import AsyncRollout

__all__ = [
    "BatchSource",
    "DynamicSamplingSource",
    "OneStepOffSource",
    "PlainSource",
    "build_batch_source",
    "draws",
]

Scored = tuple[DataProto, dict[str, Any]]
Draw = Callable[[], DataProto]


class BatchSource(Protocol):
    def next(self, draw: Draw) -> Scored:
        """The step's responses, scored (``token_level_scores``, ``uid``, ``score``,
        ``acc``), and the metrics of generating and scoring them."""
        ...


class PlainSource:
    """One prompt batch per step, generated and scored."""

    def __init__(self, generate_and_score: Callable[[DataProto], Scored]) -> None:
        self.generate_and_score = generate_and_score

    def next(self, draw: Draw) -> Scored:
        return self.generate_and_score(draw())


class DynamicSamplingSource:
    """DAPO's dynamic sampling: only groups whose ``metric`` differs within the group, from
    as many prompt batches as it takes (at most ``max_num_gen_batches``; 0 = unbounded)."""

    def __init__(
        self,
        generate_and_score: Callable[[DataProto], Scored],
        *,
        metric: str,
        num_prompts: int,
        max_num_gen_batches: int,
        pad_token_id: int,
    ) -> None:
        self.generate_and_score = generate_and_score
        self.metric = metric
        self.num_prompts = num_prompts
        self.max_num_gen_batches = max_num_gen_batches
        self.pad_token_id = pad_token_id

    def next(self, draw: Draw) -> Scored:
        return collect_informative_groups(
            draw(),
            draw,
            self.generate_and_score,
            metric=self.metric,
            num_prompts=self.num_prompts,
            max_num_gen_batches=self.max_num_gen_batches,
            pad_token_id=self.pad_token_id,
        )


class OneStepOffSource:
    """One-step-off asynchronous rollout: the oldest queued batch, generated with the
    weights of ``version()`` updates ago or fewer, scored on arrival."""

    def __init__(
        self,
        pipeline: AsyncRollout,
        score: Callable[[DataProto, dict[str, Any]], Scored],
        version: Callable[[], int],
    ) -> None:
        self.pipeline = pipeline
        self.score = score
        self.version = version

    def next(self, draw: Draw) -> Scored:
        version = self.version()  # actor updates so far: this step trains on v_{k-1}
        self.pipeline.fill(draw, version)
        metrics: dict[str, Any] = {}
        with timer("gen", metrics):  # the wait for the rollout thread (it generated meanwhile)
            gen, more = self.pipeline.pop(version)
        return self.score(gen, metrics | more)


def draws(first: DataProto, more: Draw | None, purpose: str) -> Draw:
    """A draw function that returns ``first``, then calls ``more`` (a clear error naming
    ``purpose`` when a source needs a second batch and there is none)."""
    pending = [first]

    def draw() -> DataProto:
        if pending:
            return pending.pop()
        if more is None:
            raise ValueError(f"{purpose}: train_step needs next_batch to draw more prompt batches")
        return more()

    return draw


def build_batch_source(
    config: Any,
    *,
    generate_and_score: Callable[[DataProto], Scored],
    score: Callable[..., Scored],
    pipeline: AsyncRollout | None,
    version: Callable[[], int],
    pad_token_id: int,
) -> BatchSource:
    """The source ``config`` asks for: with ``pipeline`` (``trainer.async_rollout``)
    streaming (``trainer.rollout_mode=streaming``) or one-step-off, dynamic sampling with
    ``algorithm.filter_groups.enable``, else plain."""
    if pipeline is not None and config.trainer.rollout_mode == "streaming":
        from verl.trainer.rl.streaming import StreamingSource

        rollout_seed = config.actor_rollout_ref.rollout.seed
        if rollout_seed is not None:
            # the seed the synchronous rollout gives its k-th training call (k from 1)
            pipeline.seed_for = lambda index: rollout_seed + index + 1
        fg = config.algorithm.filter_groups
        rollout = config.actor_rollout_ref.rollout
        return StreamingSource(
            pipeline,
            score,
            version,
            num_groups=config.data.train_batch_size,
            max_staleness=config.trainer.max_staleness,
            buffer_groups=config.trainer.stream_buffer_groups,
            filter_groups=(
                {"metric": fg.metric, "max_num_gen_batches": fg.max_num_gen_batches}
                if fg.enable
                else None
            ),
            baseline=config.estimator_needs("needs_baseline"),
            # an agent loop calls the engine once per turn: its calls' "groups" are turns,
            # so a trajectory's group is handed over when the whole call ends
            stream_groups=not (rollout.multi_turn.enable or rollout.agent.enable),
            pad_token_id=pad_token_id,
        )
    if pipeline is not None:
        return OneStepOffSource(pipeline, score, version)
    fg = config.algorithm.filter_groups
    if fg.enable:
        return DynamicSamplingSource(
            generate_and_score,
            metric=fg.metric,
            num_prompts=config.data.train_batch_size,
            max_num_gen_batches=fg.max_num_gen_batches,
            pad_token_id=pad_token_id,
        )
    return PlainSource(generate_and_score)
