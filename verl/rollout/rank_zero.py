"""One serving engine (vLLM, SGLang) for several FSDP2 ranks: the engine lives on rank 0.

A serving engine keeps its own full copy of the weights. With ``W`` data-parallel actor
ranks, :class:`RankZeroRollout` is the rollout every rank holds:

- **generation**: each rank sends its prompts to rank 0 (``gather_object``), rank 0 runs one
  engine call over all of them and sends each rank its rows back (``scatter_object_list``),
  so the trainer's data-parallel contract (every rank returns the samples of its own
  prompts) is unchanged. A failure on rank 0 is sent to every rank, which raises it.
- **weight sync**: every rank walks the same buckets of its state dict; before each bucket
  rank 0 broadcasts "gather" and all ranks call ``DTensor.full_tensor()`` on it (a
  collective), after which rank 0 hands the full tensors to its engine. When rank 0's push
  fails (a timeout, a loader error) it broadcasts "abort" and every rank raises, instead of
  the others waiting in a gather that never comes.

Why one engine on rank 0 rather than one per rank: the gather is an all-gather either way,
but one engine holds one KV cache and one copy of the weights instead of ``W``, batches all
prompts in one call (what serving engines are fast at), and leaves the other ranks' memory
to training. Its cost: the other ranks wait while rank 0 generates; on a GPU node an engine
per rank (or vLLM's own data parallelism) would generate in parallel.

Multi-turn rollouts (``multi_turn.enable``) call ``generate`` a rank-dependent number of
times, which this lock-step scheme cannot serve: the worker refuses that combination.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from verl.rollout.base import RolloutEngine, SamplingParams, validate_prompts
from verl.rollout.weight_sync import WeightSyncError, iter_buckets

logger = logging.getLogger(__name__)

__all__ = ["RankZeroRollout", "build_rank_rollout"]

_GATHER, _DONE, _ABORT = 1, 2, 0
_PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")


class RankZeroRollout(RolloutEngine):
    """The rollout of one of ``world_size`` ranks; the engine ``build()`` makes is on rank 0.

    Args:
        build: makes the serving engine (called on rank 0 only).
        module / tokenizer: the actor's module and tokenizer (pad / eos ids, as every engine).
        rank / world_size: this rank in the default ``torch.distributed`` group.
        role: names the worker role in errors.
    """

    owns_weights = True

    def __init__(
        self,
        build: Callable[[], RolloutEngine],
        module: torch.nn.Module,
        tokenizer: Any,
        *,
        rank: int,
        world_size: int,
        role: str = "actor_rollout_ref",
    ) -> None:
        super().__init__(module, tokenizer)
        if not dist.is_initialized() or dist.get_world_size() != world_size:
            raise RuntimeError(
                f"{role}: a rollout engine on rank 0 for {world_size} ranks needs the ranks' "
                "torch.distributed group, which is not initialised"
            )
        self.rank, self.world_size, self.role = rank, world_size, role
        self.engine, failure = None, None
        if rank == 0:
            try:
                self.engine = build()
                if not self.engine.owns_weights:
                    raise TypeError(f"{type(self.engine).__name__} samples from the module")
            except Exception as exc:
                failure = exc
        # The other ranks walk the same buckets as rank 0's engine, or hear why it failed.
        news: list[Any] = [None]
        if rank == 0:
            news = [f"{type(failure).__name__}: {failure}" if failure else self.engine.bucket_bytes]
        dist.broadcast_object_list(news, src=0)
        if failure is not None:
            raise failure
        if isinstance(news[0], str):
            raise RuntimeError(f"{role}: the rollout engine on rank 0 failed to start: {news[0]}")
        self.bucket_bytes = int(news[0])

    @property
    def last_stats(self) -> dict[str, float]:
        return dict(getattr(self.engine, "last_stats", {}))

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: Any, params: SamplingParams) -> Any:
        """Sample for every rank's prompts on rank 0; returns this rank's ``B * n`` rows."""
        from verl.protocol import DataProto

        tensors = dict(zip(_PROMPT_KEYS, (t.cpu() for t in validate_prompts(prompts))))
        device = prompts.batch["input_ids"].device
        mine = DataProto.from_dict(tensors=tensors, meta_info=dict(prompts.meta_info))
        parts: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(mine, parts, dst=0)
        replies: list[Any] = [None] * self.world_size
        if self.rank == 0:
            replies = self._generate_for_all(parts, params)
        received: list[Any] = [None]
        dist.scatter_object_list(received, replies if self.rank == 0 else None, src=0)
        (reply,) = received
        if isinstance(reply, str):
            raise RuntimeError(f"{self.role}: the rollout engine on rank 0 failed: {reply}")
        # Keys the prompts carried beyond the engine's input come back as the engine would
        # have returned them (repeated n times in repeat_interleave order).
        extra = prompts.select(
            batch_keys=[k for k in prompts.batch if k not in _PROMPT_KEYS], meta_keys=[]
        ).to("cpu")
        if len(extra.batch) or len(extra.non_tensor_batch):
            reply = reply.union(extra.repeat(params.n, interleave=True))
        reply.meta_info = dict(prompts.meta_info) | reply.meta_info
        return reply.to(device)

    def _generate_for_all(self, parts: list[Any], params: SamplingParams) -> list[Any]:
        from verl.protocol import DataProto

        try:
            width = max(p.batch["input_ids"].shape[1] for p in parts)
            merged = DataProto.concat([_left_pad(p, width) for p in parts])
            out = self.engine.generate(merged, params).to("cpu")
            replies, start = [], 0
            for p in parts:
                rows = len(p) * params.n
                # a copy: a pickled slice would carry the whole batch's storage
                replies.append(_strip_left(out[start : start + rows].clone(), width, p))
                start += rows
            return replies
        except Exception as exc:  # every rank must hear of it, not wait for its rows
            logger.exception("%s: generation on rank 0 failed", self.role)
            return [f"{type(exc).__name__}: {exc}"] * self.world_size

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
        """Gather the full weights bucket by bucket on every rank; rank 0 pushes them."""
        if self.rank != 0:
            return self._join_push(named_tensors)

        def announce(_bucket: int) -> None:
            _broadcast_flag(_GATHER)

        try:
            stats = self.engine.update_weights(named_tensors, before_bucket=announce)
        except BaseException:
            _broadcast_flag(_ABORT)
            raise
        _broadcast_flag(_DONE)
        return stats

    def _join_push(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
        """The other ranks' half: gather each bucket rank 0 announces, until it is done.

        Returns the time this rank spent in the sync, the buckets it gathered and their MiB.
        """
        start = time.perf_counter()
        buckets = iter(iter_buckets(named_tensors, self.bucket_bytes))
        gathered, nbytes = 0, 0
        while True:
            flag = _broadcast_flag(None)
            if flag == _DONE:
                seconds = time.perf_counter() - start
                return {"seconds": seconds, "buckets": float(gathered), "megabytes": nbytes / 2**20}
            if flag == _ABORT:
                raise WeightSyncError(
                    f"{self.role} rank {self.rank}: the weight push on rank 0 failed after "
                    f"{gathered} buckets (rank 0's error says why)"
                )
            bucket = next(buckets, None)
            if bucket is None:
                raise WeightSyncError(
                    f"{self.role} rank {self.rank}: rank 0 announced bucket {gathered + 1} but "
                    f"this rank's state dict has only {gathered}; the ranks' models differ"
                )
            for _, tensor in bucket:
                if hasattr(tensor, "full_tensor"):
                    tensor.detach().full_tensor()
                nbytes += tensor.numel() * tensor.element_size()
            gathered += 1

    # ------------------------------------------------------------------ memory
    def sleep(self) -> None:
        if self.engine is not None:
            self.engine.sleep()

    def wake_up(self) -> None:
        if self.engine is not None:
            self.engine.wake_up()

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()


def _broadcast_flag(flag: int | None) -> int:
    """Rank 0 sends ``flag``; every rank returns it."""
    t = torch.tensor([flag if flag is not None else -1], dtype=torch.int64)
    dist.broadcast(t, src=0)
    return int(t.item())


def _left_pad(part: Any, width: int) -> Any:
    """Prompts left-padded to ``width`` columns (mask 0, position 0, pad id)."""
    ids = part.batch["input_ids"]
    extra = width - ids.shape[1]
    if extra == 0:
        return part
    from verl.protocol import DataProto

    pad = torch.zeros(ids.shape[0], extra, dtype=ids.dtype)
    tensors = {k: torch.cat([pad.to(part.batch[k].dtype), part.batch[k]], 1) for k in _PROMPT_KEYS}
    return DataProto.from_dict(tensors=tensors, meta_info=dict(part.meta_info))


def _strip_left(out: Any, width: int, part: Any) -> Any:
    """Undo :func:`_left_pad` on the prompt columns of the engine's output rows."""
    extra = width - part.batch["input_ids"].shape[1]
    if extra == 0:
        return out
    for key in ("prompts", *_PROMPT_KEYS):
        out.batch[key] = out.batch[key][:, extra:]
    return out


def build_rank_rollout(
    rollout_cls: type[RolloutEngine],
    module: torch.nn.Module,
    tokenizer: Any,
    options: dict[str, Any],
    *,
    rank: int,
    world_size: int,
    role: str = "actor_rollout_ref",
) -> RolloutEngine:
    """The rollout for one of ``world_size`` ranks: the engine itself, or a rank-0 share of it.

    An engine that samples from the module in place (``native``, ``hf``) and any engine on
    one rank is built as is. A serving engine on several ranks becomes a
    :class:`RankZeroRollout`; it starts without pushing the weights (the gather is a
    collective), so the caller pushes them on every rank before the first generation.
    """
    if not rollout_cls.owns_weights or world_size == 1:
        return rollout_cls(module, tokenizer, **options)
    return RankZeroRollout(
        lambda: rollout_cls(module, tokenizer, push_initial_weights=False, **options),
        module,
        tokenizer,
        rank=rank,
        world_size=world_size,
        role=role,
    )
