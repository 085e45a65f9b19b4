"""A small pool of worker processes that run a reward function with a per-call timeout.

Why not `concurrent.futures.ProcessPoolExecutor`: it cannot kill the one worker whose call
hung; on timeout we need exactly that, then a fresh worker in its place, while the other
workers keep going. This pool owns its processes: each worker serves calls over a pipe;
the parent hands out calls, waits on all pipes with `multiprocessing.connection.wait`, and
kills (SIGKILL) and replaces a worker whose call passes its deadline or which dies.

Start method: "fork" where available (Linux, macOS), "spawn" otherwise. With fork the
function is inherited, not pickled, so lambdas and closures work and a worker starts in a few
ms; the function should not use torch's thread pools or CUDA in the child (neither survives
fork). With spawn the function must be picklable (module-level, or from
`load_reward_function`, which pickles as its file path).

Results are validated in the worker (`coerce_result`), so only a small `RewardResult`
crosses back; extras that cannot be pickled are dropped with the score kept.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import multiprocessing as mp
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from verl.rewards.results import ERROR, TIMEOUT, RewardResult, call_inline, failed
from verl.utils.lifetime import die_with_parent, forked_from_main_thread

logger = logging.getLogger(__name__)


def _worker_main(
    fn: Callable[..., Any], conn: Connection, parent_pid: int, kernel_signal: bool
) -> None:
    """Serve `(task_id, kwargs)` requests until a `None` request or a closed pipe."""
    die_with_parent(parent_pid, kernel_signal=kernel_signal)
    # A forked worker shares the parent's pages until it writes them, and a garbage
    # collection writes the header of every object it scans: one full collection in the
    # worker copied every page of the trainer's Python objects (98 MiB measured after
    # importing torch, transformers and verl; 7 MiB frozen). The inherited objects are
    # the parent's to collect, so they leave the worker's collections.
    gc.freeze()
    # Ctrl-C goes to the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        task_id, kwargs = request
        result = call_inline(fn, kwargs)
        try:
            conn.send((task_id, result))
        except Exception:
            # Unpicklable extras (e.g. an open file in the returned dict): keep the score.
            conn.send(
                (
                    task_id,
                    RewardResult(
                        score=result.score, failure=result.failure, message=result.message
                    ),
                )
            )


@dataclass
class _Worker:
    process: Any  # multiprocessing.Process of the chosen context
    conn: Connection
    task: int | None = None
    deadline: float = 0.0


class RewardWorkerPool:
    """Run `fn(**kwargs)` for many kwargs in `num_workers` processes, each call time-limited.

    Workers start lazily on the first `map` and persist until `close()` (or the end of a
    `with` block), so their start cost is paid once per run, not per batch.

    Args:
        fn: the reward function.
        num_workers: worker processes (calls run concurrently up to this number).
        timeout_s: seconds one call may take before its worker is killed and replaced.
        start_method: "fork", "spawn" or "forkserver"; None picks fork when available.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        num_workers: int = 2,
        timeout_s: float = 30.0,
        start_method: str | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers} must be >= 1")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0 seconds")
        if start_method is None:
            start_method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        self.fn = fn
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.start_method = start_method
        self._ctx = mp.get_context(start_method)
        self._workers: list[_Worker] = []
        self.num_restarts = 0  # workers killed or found dead and replaced

    def _start_worker(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=_worker_main,
            args=(self.fn, child_conn, os.getpid(), forked_from_main_thread()),
            name="verl-reward-worker",
            daemon=True,
        )
        try:
            process.start()
        except Exception as exc:
            parent_conn.close()
            child_conn.close()
            raise TypeError(
                f"cannot start a reward worker for {self.fn!r} with start_method="
                f"{self.start_method!r}: {type(exc).__name__}: {exc}. With 'spawn' the "
                "function must be picklable (a module-level function or one returned by "
                "load_reward_function)."
            ) from exc
        child_conn.close()
        return _Worker(process=process, conn=parent_conn)

    def _replace(self, worker: _Worker) -> _Worker:
        """Kill `worker` and put a fresh one in its slot."""
        self._stop(worker, graceful=False)
        self.num_restarts += 1
        logger.debug("replaced reward worker pid=%s", worker.process.pid)
        fresh = self._start_worker()
        self._workers[self._workers.index(worker)] = fresh
        return fresh

    @staticmethod
    def _stop(worker: _Worker, graceful: bool) -> None:
        if graceful and worker.process.is_alive():
            try:
                worker.conn.send(None)
                worker.process.join(timeout=1.0)
            except (OSError, ValueError):
                pass
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(timeout=5.0)
        worker.conn.close()

    def map(self, kwargs_list: Sequence[Mapping[str, Any]]) -> list[RewardResult]:
        """Results of `fn(**kw)` for each `kw`, in order; failures are score-0 results."""
        n = len(kwargs_list)
        results: list[RewardResult | None] = [None] * n
        while len(self._workers) < min(self.num_workers, n):
            self._workers.append(self._start_worker())
        pending = deque(range(n))
        send_attempts = [0] * n
        idle = list(self._workers)
        busy: dict[Connection, _Worker] = {}
        while pending or busy:
            while pending and idle:
                worker, task = idle.pop(), pending.popleft()
                send_attempts[task] += 1
                try:
                    worker.conn.send((task, kwargs_list[task]))
                except (BrokenPipeError, ConnectionResetError, EOFError):
                    # The worker died while idle; the call never started, so retry it once.
                    idle.append(self._replace(worker))
                    if send_attempts[task] < 2:
                        pending.appendleft(task)
                    else:
                        results[task] = failed(ERROR, "reward worker died before the call")
                    continue
                except Exception as exc:  # the kwargs themselves cannot be pickled
                    results[task] = failed(ERROR, f"cannot send arguments to worker: {exc}")
                    idle.append(worker)
                    continue
                worker.task, worker.deadline = task, time.monotonic() + self.timeout_s
                busy[worker.conn] = worker
            if not busy:
                continue
            next_deadline = min(w.deadline for w in busy.values())
            for conn in wait(list(busy), timeout=max(0.0, next_deadline - time.monotonic())):
                worker = busy.pop(conn)
                try:
                    task, result = conn.recv()
                except (EOFError, OSError):
                    worker.process.join(timeout=1.0)
                    results[worker.task] = failed(
                        ERROR,
                        f"reward worker process died (exit code {worker.process.exitcode}) "
                        "during the call",
                    )
                    worker = self._replace(worker)
                else:
                    results[task] = result
                idle.append(worker)
            now = time.monotonic()
            for conn, worker in list(busy.items()):
                if worker.deadline <= now:
                    del busy[conn]
                    results[worker.task] = failed(
                        TIMEOUT, f"reward function did not return within {self.timeout_s:g} s"
                    )
                    idle.append(self._replace(worker))
        return results  # type: ignore[return-value]  # every slot is filled above

    def close(self) -> None:
        """Stop all workers (politely, then by force)."""
        for worker in self._workers:
            self._stop(worker, graceful=True)
        self._workers = []

    def __enter__(self) -> RewardWorkerPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
