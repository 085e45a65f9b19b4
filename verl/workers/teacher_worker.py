"""The distillation teacher on a pool of its own (``algorithm.distill.teacher_pool=separate``).

A worker group that holds the teacher alone, on ``resource_pool.teacher_devices`` (null: the
actor's devices, as a worker of its own in the actor's processes), for a teacher larger than
the student. Each worker loads ``algorithm.distill.teacher_path`` frozen
(``requires_grad=False``, eval mode, :func:`verl.workers.actor_setup.teacher_module`: the
tokenizer check against the student's, the precision of ``teacher_precision``) into an
inference-only engine: no optimizer, every forward under ``torch.no_grad``. Its engine is
fsdp2 over the pool when the pool has several devices (the teacher's weights sharded over
them), else the single engine; it draws no random numbers.

Contract of :meth:`TeacherWorker.compute_teacher_log_prob` (``DP_COMPUTE``: each rank scores
its slice of the batch): reads ``input_ids``, ``attention_mask``, ``position_ids``,
``response_mask`` ``(batch, seq_len)`` and the log-prob ``temperature``; returns
``teacher_log_probs`` ``(batch, response_len)`` float32. With ``estimator=topk`` it also
reads ``distill_topk_ids`` ``(batch, response_len, k)`` int64 (the student's top-k, computed
in the actor's group by ``ActorRolloutRefWorker.compute_distill_topk_ids``) and returns
``teacher_topk_log_probs`` ``(batch, response_len, k)`` float32 at those ids. The passes cut
micro-batches with the actor's split and run under the actor's autocast
(:class:`~verl.workers.specs.TeacherPoolSpec`), so they give what the colocated teacher does.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from verl.controller import Dispatch, Worker, register
from verl.engine import build_engine
from verl.models import load_tokenizer
from verl.protocol import DataProto
from verl.utils.device import resolve_device
from verl.workers.actor_setup import teacher_module
from verl.workers.actor_update import SEQUENCE_KEYS
from verl.workers.common import ensure_process_group
from verl.workers.log_prob_passes import response_log_probs, teacher_scores_at
from verl.workers.specs import TeacherPoolSpec, check_spec

logger = logging.getLogger(__name__)

__all__ = ["TeacherWorker"]


class TeacherWorker(Worker):
    """The teacher alone, frozen, in an inference-only engine (see the module docstring).

    Args:
        spec: :func:`verl.workers.specs.teacher_pool_spec` of the run's config.
        tokenizer: the student's tokenizer (else loaded from ``model.tokenizer_path``); the
            teacher's must map text to the same ids.
    """

    def __init__(self, spec: TeacherPoolSpec, tokenizer: Any = None, **worker_kwargs: Any) -> None:
        super().__init__(**worker_kwargs)
        check_spec(spec, TeacherPoolSpec, "teacher_pool_spec")
        self.spec = spec
        self.tokenizer = tokenizer or load_tokenizer(
            spec.model.tokenizer_path, trust_remote_code=spec.model.trust_remote_code
        )
        self.device = resolve_device(spec.device, self.local_rank or 0)
        self.engine = None
        self._head_size = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the teacher into its engine. The process's random generators are left as
        they were (loading may draw from them; the actor's draws must not depend on it)."""
        spec = self.spec
        if spec.strategy == "fsdp2":
            ensure_process_group(self.rank, self.world_size, self.device.type)
        with torch.random.fork_rng(devices=[]):
            module = teacher_module(spec, self.tokenizer, self.device)
        options = spec.teacher.engine.replace(
            device=self.device, autocast_dtype=spec.autocast_dtype
        )
        self.engine = build_engine(spec.strategy, module, None, options)
        self._head_size = output_head_size(module)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, rank_zero_result=True)
    def head_size(self) -> int:
        """The teacher's output head size: the student's top-k ids are taken among that many
        (heads may be padded apart)."""
        return self._head_size

    @register(
        dispatch_mode=Dispatch.DP_COMPUTE,
        reads=SEQUENCE_KEYS,
        optional=("distill_topk_ids",),
        meta=("temperature",),
    )
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """The teacher's scores of the student's samples (see the module docstring)."""
        if self.engine is None:
            raise RuntimeError("TeacherWorker.compute_teacher_log_prob before init_model")
        teacher = self.spec.teacher
        mbs = teacher.log_prob_micro_batch_size
        if not teacher.needs_topk:
            with self.engine.eval_mode():
                log_probs, _, _ = response_log_probs(
                    self.engine, self.engine.module, data, mbs, self.spec, self.device, False
                )
            return DataProto.from_dict(tensors={"teacher_log_probs": log_probs})
        if "distill_topk_ids" not in data.batch:
            raise KeyError(
                "algorithm.distill.estimator=topk with teacher_pool=separate: the batch has no "
                "distill_topk_ids; the actor's group computes them first "
                "(ActorRolloutRefWorker.compute_distill_topk_ids)"
            )
        ids = data.batch["distill_topk_ids"]
        scores = teacher_scores_at(self.engine, data, ids, mbs, self.spec, self.device)
        return DataProto.from_dict(tensors=scores)


def output_head_size(module: torch.nn.Module) -> int:
    """Rows of the output head (the logits' width), else ``config.vocab_size``."""
    head = module.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return int(getattr(head, "out_features", weight.shape[0]))
    return int(module.config.vocab_size)
