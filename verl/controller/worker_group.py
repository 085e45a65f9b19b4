"""WorkerGroup: the driver-side proxy for ``world_size`` workers of one class.

Every method of the worker class marked ``@register(dispatch_mode=...)`` becomes a method
of the group with the same name. Calling it splits the inputs by the dispatch mode, runs
the method on every rank (how is the backend's business: in-process for ``local``, one
actor per rank for ``ray``), and gathers the outputs. Unregistered methods are not
reachable through the group.

Every call also has a non-blocking form, the same for every backend so the trainer needs
no backend branches: ``future = wg.submit("compute_values", batch)`` (or
``wg.compute_values.submit(batch)``) starts the call and returns a ``GroupFuture``;
``future.result()`` waits for every rank and gathers. In-process backends run the call at
``submit`` and hand back a completed future; a remote backend returns at once, so calls on
groups in different resource pools run at the same time.

A backend subclasses ``WorkerGroup`` and implements ``_execute`` (run one method on every
rank with per-rank arguments) and ``_role_view`` (a group for one role of a colocated
worker, sharing the same processes); a remote backend also overrides ``_start`` (begin the
call, return its ``PendingOutputs``) and ``shutdown``.
"""

from __future__ import annotations

import functools
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from verl.controller.colocate import ColocatedWorker
from verl.controller.dispatch import (
    MethodDispatch,
    collect_outputs,
    get_method_dispatch,
    select_inputs,
    split_inputs,
)
from verl.controller.worker import Worker

logger = logging.getLogger(__name__)

__all__ = [
    "CompletedOutputs",
    "GroupFuture",
    "PendingOutputs",
    "WorkerDiedError",
    "WorkerGroup",
    "WorkerStalledError",
    "registered_methods",
]


class WorkerDiedError(RuntimeError):
    """A worker process of a group died (killed, out of memory, crashed) during or before a call.

    ``role`` names the worker class (or colocated role), ``rank`` the dead rank and ``cause``
    what the backend reported. The group cannot be used afterwards: its collectives have
    lost a member, and the surviving ranks may stay blocked in one until ``shutdown()``
    kills them. Create a new group (or restart the run from a checkpoint).
    """

    def __init__(self, role: str, rank: int, cause: str, method: str | None = None) -> None:
        self.role = role
        self.rank = rank
        self.cause = cause
        self.method = method
        during = f" during {method!r}" if method else ""
        super().__init__(f"worker {role} rank {rank} died{during}: {cause}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.role, self.rank, self.cause, self.method))


class WorkerStalledError(WorkerDiedError):
    """A worker process stopped responding: alive, but its heartbeat went unanswered.

    Raised instead of waiting for the call (and the collective timeout) when a rank's
    process no longer runs (stopped by SIGSTOP, frozen, hung in native code holding the
    interpreter lock). Like a dead worker, it leaves the group unusable.
    """

    def __init__(self, role: str, rank: int, cause: str, method: str | None = None) -> None:
        self.role = role
        self.rank = rank
        self.cause = cause
        self.method = method
        during = f" during {method!r}" if method else ""
        RuntimeError.__init__(
            self, f"worker {role} rank {rank} stopped responding{during}: {cause}"
        )


class PendingOutputs(ABC):
    """The per-rank outputs of a started group call, not yet gathered."""

    @abstractmethod
    def wait(self, timeout: float | None = None) -> list[Any]:
        """Block until every rank finished; the outputs in rank order.

        Raises the first rank's error as soon as it is known (without waiting for the
        others), or ``TimeoutError`` when ``timeout`` seconds pass first.
        """

    @abstractmethod
    def done(self) -> bool:
        """Whether ``wait`` would return (or raise) without blocking."""


class CompletedOutputs(PendingOutputs):
    """Outputs of a call that already ran (in-process backends), or the error it raised."""

    def __init__(self, outputs: list[Any] | None = None, error: BaseException | None = None):
        self._outputs = outputs
        self._error = error

    def wait(self, timeout: float | None = None) -> list[Any]:
        if self._error is not None:
            raise self._error
        assert self._outputs is not None
        return self._outputs

    def done(self) -> bool:
        return True


class GroupFuture:
    """The result of ``WorkerGroup.submit``: ``result()`` waits for every rank and gathers.

    The gathered value (or the error) is kept, so ``result()`` may be called again.
    """

    def __init__(self, method: str, pending: PendingOutputs, collect: Callable[[list[Any]], Any]):
        self.method = method
        self._pending = pending
        self._collect = collect
        self._finished = False
        self._value: Any = None
        self._error: Exception | None = None

    def done(self) -> bool:
        """Whether every rank has finished (successfully or not)."""
        return self._finished or self._pending.done()

    def result(self, timeout: float | None = None) -> Any:
        """The gathered output, as the blocking call would return it.

        Raises the worker's error (noting its rank), ``WorkerDiedError`` if a worker process
        died, or ``TimeoutError`` if ``timeout`` seconds pass first (the call goes on; ask
        again later).
        """
        if not self._finished:
            try:
                self._value = self._collect(self._pending.wait(timeout))
            except TimeoutError:
                raise
            except Exception as e:
                self._error = e
            self._finished = True
            self._pending = CompletedOutputs([])  # drop references to the per-rank outputs
        if self._error is not None:
            raise self._error
        return self._value

    def __repr__(self) -> str:
        return f"GroupFuture({self.method!r}, done={self.done()})"


def registered_methods(worker_cls: type[Worker]) -> dict[str, MethodDispatch]:
    """``{method_name: dispatch spec}`` of every ``@register``-ed method of ``worker_cls``."""
    found = {}
    for name in dir(worker_cls):
        if name.startswith("__"):
            continue
        spec = get_method_dispatch(getattr(worker_cls, name, None))
        if spec is not None:
            found[name] = spec
    return found


class WorkerGroup(ABC):
    """Proxy for ``world_size`` workers; registered worker methods become group methods.

    ``role`` is set on the per-role groups that ``spawn()`` returns for a colocated worker.
    """

    def __init__(self, worker_cls: type[Worker], world_size: int, role: str | None = None):
        if not (isinstance(worker_cls, type) and issubclass(worker_cls, Worker)):
            raise TypeError(f"{worker_cls!r} is not a subclass of verl.controller.Worker")
        if world_size < 1:
            raise ValueError(f"world_size={world_size} must be >= 1")
        self._worker_cls = worker_cls
        self._world_size = world_size
        self._role = role
        self._target_cls = (
            worker_cls if role is None else worker_cls.role_specs[role].cls  # type: ignore[attr-defined]
        )
        self._methods = registered_methods(self._target_cls)
        for name, spec in self._methods.items():
            if hasattr(type(self), name):
                raise ValueError(
                    f"{self._target_cls.__name__}.{name} clashes with WorkerGroup.{name}; "
                    "rename the worker method"
                )
            setattr(self, name, self._make_proxy(name, spec))

    def _make_proxy(self, name: str, spec: MethodDispatch) -> Any:
        method = getattr(self._target_cls, name)

        @functools.wraps(method)
        def proxy(*args: Any, **kwargs: Any) -> Any:
            return self._submit(name, spec, args, kwargs).result()

        def submit(*args: Any, **kwargs: Any) -> GroupFuture:
            return self._submit(name, spec, args, kwargs)

        submit.__doc__ = f"Start ``{name}`` on every rank without waiting; see WorkerGroup.submit."
        proxy.submit = submit  # type: ignore[attr-defined]
        return proxy

    def submit(self, method_name: str, /, *args: Any, **kwargs: Any) -> GroupFuture:
        """Start registered method ``method_name`` on every rank; return its ``GroupFuture``.

        ``wg.submit("compute_values", batch).result()`` equals ``wg.compute_values(batch)``.
        Under a remote backend ``submit`` returns at once, so calls on groups in different
        resource pools overlap; calls on one group run one after another, in submit order.
        """
        spec = self._methods.get(method_name)
        if spec is None:
            raise AttributeError(
                f"{self._target_cls.__name__}.{method_name} is not a registered method; "
                f"registered: {sorted(self._methods)}"
            )
        return self._submit(method_name, spec, args, kwargs)

    def _submit(
        self, name: str, spec: MethodDispatch, args: tuple, kwargs: dict[str, Any]
    ) -> GroupFuture:
        # Only the keys the method declares cross to the workers (the data contract).
        args, kwargs = select_inputs(spec, args, kwargs, f"{self._target_cls.__name__}.{name}")
        plan = split_inputs(spec.mode, self._world_size, args, kwargs)
        pending = self._start(name, plan.calls)
        return GroupFuture(
            name, pending, lambda outputs: collect_outputs(spec, plan, outputs, method=name)
        )

    def _start(self, method_name: str, calls: list[tuple[tuple, dict[str, Any]]]) -> PendingOutputs:
        """Begin ``method_name`` on every rank. Default: run it now through ``_execute``."""
        try:
            return CompletedOutputs(self._execute(method_name, calls))
        except Exception as e:
            return CompletedOutputs(error=e)

    def __getattr__(self, name: str) -> Any:
        # only reached when normal lookup fails: explain unregistered worker methods
        target = self.__dict__.get("_target_cls")
        if target is not None and not name.startswith("__") and hasattr(target, name):
            registered = sorted(self.__dict__.get("_methods", {}))
            raise AttributeError(
                f"{target.__name__}.{name} is not registered for dispatch; decorate it with "
                f"@register(dispatch_mode=...) to call it through a worker group "
                f"(registered: {registered})"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def worker_cls(self) -> type[Worker]:
        """The class whose registered methods this group exposes (the role's, for a view)."""
        return self._target_cls

    @property
    def method_names(self) -> list[str]:
        return sorted(self._methods)

    def spawn(self) -> dict[str, WorkerGroup]:
        """For a group over a colocated worker: one group per role, sharing these processes."""
        if self._role is not None or not issubclass(self._worker_cls, ColocatedWorker):
            raise TypeError(
                f"spawn() needs a group over create_colocated_worker_cls(...), "
                f"not {self._target_cls.__name__}"
            )
        return {role: self._role_view(role) for role in self._worker_cls.role_specs}

    def shutdown(self) -> None:
        """Close the workers (``Worker.close``) and release the group's processes.

        A remote backend kills its workers after closing them; the per-role groups of
        ``spawn()`` share them, so shutting down one role's group shuts down every role.
        Calls afterwards raise (remote); in-process workers stay readable, closed. Idempotent.
        """
        return None

    @abstractmethod
    def request_stop(self, signum: int) -> None:
        """Ask every worker to stop its long-running call at its next stopping point.

        Sets ``Worker.stop_signum`` (the first request wins) and returns at once; a call
        that polls it (the offline trainer's step loop) ends as it would on that signal. A
        remote backend delivers it while a call runs, on the worker's heartbeat thread.
        """

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    @abstractmethod
    def _execute(self, method_name: str, calls: list[tuple[tuple, dict[str, Any]]]) -> list[Any]:
        """Run ``method_name`` on rank ``r`` with ``calls[r]``; return outputs in rank order."""

    @abstractmethod
    def _role_view(self, role: str) -> WorkerGroup:
        """A group exposing ``role``'s registered methods on this group's workers."""
