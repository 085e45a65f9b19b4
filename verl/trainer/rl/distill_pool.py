"""Where the distillation teacher scores the student's samples: in the actor's workers, or in
a worker group of its own (``algorithm.distill.teacher_pool``, docs/distillation.md).

``colocated`` (default): ``actor_rollout_ref.compute_teacher_log_prob``; the actor's workers
hold the teacher beside the student. ``separate``: the ``teacher`` group
(:class:`~verl.workers.teacher_worker.TeacherWorker`, on ``resource_pool.teacher_devices``;
null = the actor's devices) holds the teacher alone. For ``k1``/``k3`` it scores the batch
by itself (concurrently with the reference and the critic when on devices of its own). For
``topk`` the pass is split: the actor's group computes the student's top-k ids
(``compute_distill_topk_ids``, among the teacher's head size), they travel in the batch
(``distill_topk_ids``, ``(batch, response_len, k)`` int64: ``8 k`` bytes per response token)
to the teacher's group, which returns its log-probs at them (``4 k`` bytes per token) and at
the sampled tokens.

:func:`teacher_scorer` gives the trainer one object for either, whose ``submit(gen)`` returns
a future of the teacher's keys; :func:`check_teacher_pool` refuses the keys that do not fit
(the config checks import this module: it imports no torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from verl.registry import DISTILL_ESTIMATORS

if TYPE_CHECKING:
    from verl.config import TrainerConfig
    from verl.protocol import DataProto
    from verl.trainer.config_checks import Checks

__all__ = ["SeparateTeacher", "check_teacher_pool", "teacher_scorer"]

_POOL, _DEVICES = "algorithm.distill.teacher_pool", "resource_pool.teacher_devices"


class _Colocated:
    """The teacher in the actor's workers: one call scores (and, for topk, picks the ids)."""

    def __init__(self, actor_wg: Any) -> None:
        self.actor_wg = actor_wg

    def submit(self, gen: DataProto) -> Any:
        return self.actor_wg.compute_teacher_log_prob.submit(gen)


class SeparateTeacher:
    """The teacher's own worker group; for ``topk`` the actor's group picks the ids first.

    ``submit(gen)`` returns a future of ``teacher_log_probs`` (and, for ``topk``,
    ``teacher_topk_log_probs``); the student's ``distill_topk_ids`` are added to ``gen``
    itself before the teacher's group is called.
    """

    def __init__(self, actor_wg: Any, teacher_wg: Any, needs_topk: bool) -> None:
        self.actor_wg = actor_wg
        self.teacher_wg = teacher_wg
        self.needs_topk = needs_topk
        self._head_size: int | None = None

    def submit(self, gen: DataProto) -> Any:
        if self.needs_topk:
            if self._head_size is None:
                self._head_size = int(self.teacher_wg.head_size())
            view = gen.select()  # the same tensors, a meta_info of its own
            view.meta_info["distill_vocab"] = self._head_size
            gen.union(self.actor_wg.compute_distill_topk_ids(view))
        return self.teacher_wg.compute_teacher_log_prob.submit(gen)


def teacher_scorer(
    cfg: TrainerConfig, roles: dict[str, Any]
) -> _Colocated | SeparateTeacher | None:
    """The teacher pass of ``cfg`` over the placed worker groups ``roles`` (None without
    distillation)."""
    d = cfg.algorithm.distill
    if not d.enable:
        return None
    if "teacher" not in roles:
        return _Colocated(roles["actor_rollout_ref"])
    needs_topk = bool(DISTILL_ESTIMATORS.needs(d.estimator, "needs_topk"))
    return SeparateTeacher(roles["actor_rollout_ref"], roles["teacher"], needs_topk)


def check_teacher_pool(c: Checks, cfg: TrainerConfig) -> None:
    """``teacher_pool=separate`` needs distillation on; ``teacher_devices`` needs
    ``teacher_pool=separate`` (the device lists themselves are checked with the others)."""
    d = cfg.algorithm.distill
    if d.teacher_pool == "separate" and not d.enable:
        c.error(
            (_POOL, "algorithm.distill.enable"),
            f"{_POOL}=separate without algorithm.distill.enable=true: there is no teacher to "
            f"place; enable distillation or leave {_POOL}=colocated",
        )
    devices = cfg.resource_pool.teacher_devices
    if devices is not None and not (d.enable and d.teacher_pool == "separate"):
        c.error(
            (_DEVICES, _POOL),
            f"{_DEVICES}={devices} places the distillation teacher, which needs "
            f"algorithm.distill.enable=true and {_POOL}=separate (now enable="
            f"{str(d.enable).lower()}, teacher_pool={d.teacher_pool}); set them or drop "
            f"{_DEVICES}",
        )
