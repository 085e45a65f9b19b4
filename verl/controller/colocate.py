"""Colocation: several role workers (e.g. actor-rollout-ref and critic) in one process per rank.

``create_colocated_worker_cls({"actor_rollout_ref": ClassWithInitArgs(ActorCls, cfg),
"critic": ClassWithInitArgs(CriticCls, cfg)})`` returns a ``Worker`` class whose instance
holds one instance of each role class, all with the same rank. A worker group over it
(``WorkerGroup.spawn()``) hands out one group per role; calls reach the role's worker
directly in the local backend, or through ``ColocatedWorker.call_role`` in a remote one
(one Ray actor per rank can only expose its own methods).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from verl.controller.worker import Worker, instantiate_worker

__all__ = ["ClassWithInitArgs", "ColocatedWorker", "create_colocated_worker_cls"]


class ClassWithInitArgs:
    """A worker class with the constructor arguments to create it with later, on each rank."""

    def __init__(self, cls: type[Worker], *args: Any, **kwargs: Any) -> None:
        if not (isinstance(cls, type) and issubclass(cls, Worker)):
            raise TypeError(f"{cls!r} is not a subclass of verl.controller.Worker")
        self.cls = cls
        self.args = args
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"ClassWithInitArgs({self.cls.__name__}, args={self.args}, kwargs={self.kwargs})"


class ColocatedWorker(Worker):
    """One process-rank holding a worker per role; built by ``create_colocated_worker_cls``."""

    role_specs: ClassVar[dict[str, ClassWithInitArgs]] = {}

    def __init__(self) -> None:
        super().__init__()
        if not self.role_specs:
            raise TypeError("use create_colocated_worker_cls(...) to build a colocated worker")
        self.role_workers: dict[str, Worker] = {
            role: instantiate_worker(spec.cls, self.dist_info, spec.args, spec.kwargs)
            for role, spec in self.role_specs.items()
        }

    def close(self) -> None:
        for worker in self.role_workers.values():
            worker.close()

    def call_role(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` of the ``role`` worker on this rank (the remote-backend entry)."""
        return getattr(self.role_workers[role], method)(*args, **kwargs)


def create_colocated_worker_cls(
    specs: Mapping[str, ClassWithInitArgs | type[Worker]],
) -> type[ColocatedWorker]:
    """A ``Worker`` class that creates one worker per role (``{role: class or spec}``)."""
    if not specs:
        raise ValueError("create_colocated_worker_cls: no roles given")
    normalized: dict[str, ClassWithInitArgs] = {}
    for role, spec in specs.items():
        if not isinstance(role, str) or not role.isidentifier():
            raise ValueError(f"colocated role names must be identifiers, got {role!r}")
        normalized[role] = spec if isinstance(spec, ClassWithInitArgs) else ClassWithInitArgs(spec)
    name = "Colocated_" + "_".join(normalized)
    return type(name, (ColocatedWorker,), {"role_specs": normalized})
