"""Overlap scoring with generation: the rollout batch is generated in chunks of prompts, and
chunk k is scored in a background thread while chunk k+1 is generated.

    overlap = RewardOverlap(reward, num_chunks=4)
    gen = overlap.generate(generate, prompts)     # generate: prompts -> responses
    scores, metrics, extras = reward(gen)         # waits for the chunks still being scored

Only the per-response phase of a :class:`~verl.rewards.sources.SourceReward` runs in the
background (:meth:`~verl.rewards.sources.SourceReward.score_raw`, which moves no state);
the failure bound, the shaping (running statistics included) and the metrics run once, on
the whole batch, when the reward is called with the very batch :meth:`RewardOverlap.generate`
returned. The scores are therefore exactly those of scoring the same responses after
generation, in the same order (``tests/rewards/test_overlap.py``).

The prompts are split into ``num_chunks`` contiguous chunks (sizes differ by at most one;
a prompt's ``n`` responses stay in one chunk, so GRPO groups are whole), generated one after
another and joined in order (``DataProto.concat``). Each chunk is one rollout call: with a
fixed ``rollout.seed`` every call draws its own seed, so chunked responses are samples as
good as one call's, not the same ones. ``num_workers`` threads score chunks (1: in order).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from verl.protocol import DataProto
from verl.rewards.sources import SourceReward

logger = logging.getLogger(__name__)

__all__ = ["RewardOverlap", "chunk_bounds"]


def chunk_bounds(size: int, num_chunks: int) -> list[tuple[int, int]]:
    """``[start, end)`` of ``min(num_chunks, size)`` contiguous chunks of ``size`` rows."""
    if num_chunks < 1:
        raise ValueError(f"num_chunks={num_chunks} must be >= 1")
    k = max(1, min(num_chunks, size))
    base, extra = divmod(size, k)
    bounds, start = [], 0
    for i in range(k):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


class RewardOverlap:
    """Generation in chunks with their scoring in the background (module docstring).

    Args:
        reward: the reward the trainer calls next on the generated batch.
        num_chunks: prompt chunks per rollout batch (>= 1).
        num_workers: background scoring threads.
    """

    def __init__(self, reward: SourceReward, num_chunks: int, num_workers: int = 1) -> None:
        if not isinstance(reward, SourceReward):
            raise TypeError(
                f"reward overlap needs a per-response reward source (SourceReward), got "
                f"{type(reward).__name__}: the judge, remote and mixture rewards are; set "
                "reward_model.overlap.num_chunks=1 for other rewards"
            )
        if num_chunks < 1 or num_workers < 1:
            raise ValueError(f"num_chunks={num_chunks} and num_workers={num_workers} must be >= 1")
        self.reward = reward
        self.num_chunks = num_chunks
        self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix="reward-overlap")

    def generate(self, generate: Callable[[Any], Any], prompts: Any) -> Any:
        """The responses of ``prompts`` (``generate``'s output for them, chunk after chunk,
        joined), with their chunks' scoring handed to the reward (still running)."""
        pending: list[Future] = []
        outputs = []
        try:
            for start, end in chunk_bounds(len(prompts), self.num_chunks):
                gen = generate(prompts[start:end])
                outputs.append(gen)
                pending.append(self._pool.submit(self.reward.score_raw, gen))
        except BaseException:
            for future in pending:
                future.cancel()
            raise
        gen = outputs[0] if len(outputs) == 1 else DataProto.concat(outputs)
        self.reward.prescore(gen, pending)
        return gen

    def close(self) -> None:
        self._pool.shutdown(wait=True)
