"""WorkerGroup: the driver-side proxy for ``world_size`` workers of one class.

Every method of the worker class marked ``@register(dispatch_mode=...)`` becomes a method
of the group with the same name. Calling it splits the inputs by the dispatch mode, runs
the method on every rank (how is the backend's business: in-process for ``local``, one
actor per rank for ``ray``), and gathers the outputs. Unregistered methods are not
reachable through the group.

A backend subclasses ``WorkerGroup`` and implements ``_execute`` (run one method on every
rank with per-rank arguments) and ``_role_view`` (a group for one role of a colocated
worker, sharing the same processes).
"""

from __future__ import annotations

import functools
import logging
from abc import ABC, abstractmethod
from typing import Any

from verl.controller.colocate import ColocatedWorker
from verl.controller.dispatch import (
    MethodDispatch,
    collect_outputs,
    get_method_dispatch,
    split_inputs,
)
from verl.controller.worker import Worker

logger = logging.getLogger(__name__)

__all__ = ["WorkerGroup", "registered_methods"]


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
            return self._call(name, spec, args, kwargs)

        return proxy

    def _call(self, name: str, spec: MethodDispatch, args: tuple, kwargs: dict[str, Any]) -> Any:
        plan = split_inputs(spec.mode, self._world_size, args, kwargs)
        outputs = self._execute(name, plan.calls)
        return collect_outputs(spec, plan, outputs, method=name)

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

    @abstractmethod
    def _execute(self, method_name: str, calls: list[tuple[tuple, dict[str, Any]]]) -> list[Any]:
        """Run ``method_name`` on rank ``r`` with ``calls[r]``; return outputs in rank order."""

    @abstractmethod
    def _role_view(self, role: str) -> WorkerGroup:
        """A group exposing ``role``'s registered methods on this group's workers."""
