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
Ray actor of its own (a resource pool of one process beside the device map's), the thread
here then only waits on its calls. Weights reach it through the same bucketed push the
vLLM backend takes them with (:func:`verl.rollout.weight_sync.push_weights`).

Correctness of the weights: the rollout thread runs one task after another (load weights,
generate), so the copy's weights never change during a generation; the trainer only hands
it a snapshot (``state_dict_for_save``, CPU copies) taken at the step boundary, and the
actor's optimizer never touches the copy.

Sampling is seeded per generation batch (``trainer.seed`` and the batch's index), so a
batch's responses depend only on the prompts and the weights, not on the thread's timing.

Checkpoints: the in-flight batches are **saved** with the checkpoint (prompts, responses,
policy version; ``async_rollout/inflight.pt``), after waiting for them to finish; the
loader position saved beside them points after the last one queued. A resumed run trains on
exactly those batches and then continues as the uninterrupted run would.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto

logger = logging.getLogger(__name__)

__all__ = ["AsyncRollout", "StalenessError"]

INFLIGHT_FILE = "inflight.pt"


class StalenessError(RuntimeError):
    """A batch would train more than ``trainer.max_staleness`` updates after it was sampled."""


@dataclass
class _InFlight:
    prompts: DataProto
    version: int  # actor updates in the weights that generate it
    index: int  # generation batch number (seeds the sampling)
    result: Future | None = None
    gen: DataProto | None = None  # the finished generation (a loaded checkpoint's)


class AsyncRollout:
    """The queue of generation batches ahead of training, on a thread of its own.

    Args:
        rollout_group: worker group of :class:`~verl.workers.rollout_copy.RolloutCopyWorker`.
        generate: ``(group, prompts) -> responses`` (the trainer's ``_generate``: rollout
            plus the prompts' per-sample fields joined back on).
        weights: returns the actor's current full state dict (CPU copies).
        max_staleness: how many batches generation runs ahead (``trainer.max_staleness``).
        seed: base of the per-batch sampling seeds.
    """

    def __init__(
        self,
        rollout_group: Any,
        generate: Callable[[Any, DataProto], DataProto],
        weights: Callable[[], dict[str, torch.Tensor]],
        *,
        max_staleness: int,
        seed: int,
    ) -> None:
        if max_staleness < 1:
            raise ValueError(f"trainer.max_staleness={max_staleness} must be >= 1")
        self.group = rollout_group
        self._generate = generate
        self._weights = weights
        self.max_staleness = max_staleness
        self.seed = seed
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verl-rollout")
        self._queue: deque[_InFlight] = deque()
        self._launched = 0  # generation batches queued since the start of the run
        self._copy_version: int | None = None  # what the copy holds (None: unknown)
        self._pending_meta: list[dict[str, Any]] = []  # load_state_dict -> load_files

    def __len__(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------------ the pipeline
    def fill(self, next_prompts: Callable[[], DataProto], version: int) -> None:
        """Queue batches from ``next_prompts`` with the weights of ``version`` updates until
        ``max_staleness + 1`` are in flight (the one to train now and those ahead)."""
        while len(self._queue) <= self.max_staleness:
            prompts = next_prompts()
            # One id per prompt: the n responses of a prompt share it (the GRPO group).
            prompts.non_tensor_batch["uid"] = np.array(
                [f"{self._launched}-{i}" for i in range(len(prompts))], dtype=object
            )
            item = _InFlight(prompts, version, self._launched)
            self._launched += 1
            item.result = self._executor.submit(self._run, item, self._weights_for(version))
            self._queue.append(item)

    def _weights_for(self, version: int) -> dict[str, torch.Tensor] | None:
        """A snapshot of the actor's weights (taken now, at the step boundary) for the copy
        to load before generating with ``version``; None when it will hold them already."""
        if self._copy_version == version:
            return None
        self._copy_version = version
        return self._weights()

    def _run(self, item: _InFlight, weights: dict[str, torch.Tensor] | None) -> DataProto:
        """On the rollout thread: load ``weights`` (if any), then generate ``item``."""
        sync_s = 0.0
        if weights is not None:
            sync_s = self.group.load_policy_weights(weights, item.version)[0][
                "async/weight_sync_seconds"
            ]
        start = time.perf_counter()
        prompts = DataProto.from_dict(
            tensors=dict(item.prompts.batch),
            non_tensors=dict(item.prompts.non_tensor_batch),
            meta_info={**item.prompts.meta_info, "seed": self.seed * 1_000_003 + item.index},
        )
        gen = self._generate(self.group, prompts)
        gen.meta_info["async_gen_seconds"] = time.perf_counter() - start
        gen.meta_info["async_weight_sync_seconds"] = sync_s
        return gen

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

    def state_dict(self) -> dict[str, Any]:
        """Counters (JSON); the in-flight batches go to a file (:meth:`save_files`)."""
        return {
            "launched": self._launched,
            "inflight": [{"version": i.version, "index": i.index} for i in self._queue],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._drop_queue()
        self._launched = int(state["launched"])
        self._copy_version = None  # the copy's weights are pushed again before use
        self._pending_meta = list(state["inflight"])

    def save_files(self, directory: Path) -> None:
        """Write the in-flight batches (waiting for their generation to finish)."""
        self._finish()
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(
            [{"prompts": i.prompts, "gen": i.gen} for i in self._queue], directory / INFLIGHT_FILE
        )

    def load_files(self, directory: Path) -> None:
        """Restore the in-flight batches :meth:`save_files` wrote (after
        :meth:`load_state_dict`)."""
        meta = self._pending_meta
        saved = torch.load(directory / INFLIGHT_FILE, weights_only=False) if meta else []
        if len(saved) != len(meta):
            raise ValueError(
                f"{directory / INFLIGHT_FILE}: {len(saved)} in-flight batches, the trainer "
                f"state lists {len(meta)}"
            )
        for m, s in zip(meta, saved):
            self._queue.append(
                _InFlight(s["prompts"], int(m["version"]), int(m["index"]), gen=s["gen"])
            )
        self._pending_meta = []

    def _drop_queue(self) -> None:
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
    backend, one more Ray actor on the Ray backend. Its model is loaded like the actor's, or
    is ``module`` (a copy of the actor's initial module). It joins ``placement``'s pools, so
    it is shut down with the roles.
    """
    from verl.controller.factory import make_worker_group
    from verl.controller.resource_pool import ResourcePool
    from verl.utils.device import resolve_device
    from verl.workers.rollout_copy import RolloutCopyWorker

    device_type = resolve_device(cfg.trainer.device).type
    pool = ResourcePool([1], use_gpu=device_type == "cuda", name="async_rollout")
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
        config=cfg,
        module=module,
        tokenizer=copy.deepcopy(tokenizer),  # fast tokenizers are not safe across threads
        ray_options=options,
    )
    placement.pools.append(group)
    group.init_model(total_steps=1)  # its optimizer never steps
    return AsyncRollout(
        group,
        generate,
        lambda: actor_group.state_dict_for_save()[0],  # rank 0 holds the full dict
        max_staleness=cfg.trainer.max_staleness,
        seed=cfg.trainer.seed,
    )
