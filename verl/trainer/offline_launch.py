"""Running an offline trainer (SFT, DPO / IPO / KTO) on several FSDP2 ranks through Ray.

``trainer.n_gpus_per_node=N`` (N > 1) starts N Ray actors, one per device (CPU processes on
a machine without GPUs), joined in one ``torch.distributed`` group by the Ray backend
(``verl.controller``). Each actor builds the same trainer with ``engine.strategy=fsdp2``
and runs :meth:`~verl.trainer.offline_trainer.OfflineTrainer.train` SPMD: the ranks read the
same batches and split each step's micro-batches; rank 0 logs, holds the run lock and
writes the files other than the engine shards. The driver waits and gets rank 0's results.

    from verl.trainer.offline_launch import train_on_ranks
    results = train_on_ranks("sft", cfg)           # cfg.trainer.n_gpus_per_node = 2

``python -m verl.trainer.main_sft trainer.n_gpus_per_node=2`` does the same. A run killed
in the middle (driver or a rank) resumes from its last checkpoint like a one-process run.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from verl.config import DPOConfig, SFTConfig
from verl.controller import Dispatch, ResourcePool, Worker, WorkerGroup, make_worker_group, register
from verl.utils.device import resolve_device

logger = logging.getLogger(__name__)

__all__ = ["OfflineTrainWorker", "start_rank_group", "train_on_ranks"]


def trainer_class(kind: str) -> type:
    """The trainer of ``kind`` (``sft`` or ``dpo``)."""
    if kind == "sft":
        from verl.trainer.sft_trainer import SFTTrainer

        return SFTTrainer
    if kind == "dpo":
        from verl.trainer.dpo_trainer import DPOTrainer

        return DPOTrainer
    raise ValueError(f"kind={kind!r}: use sft or dpo")


class OfflineTrainWorker(Worker):
    """One rank of an offline run: builds the trainer in its process when asked to train."""

    def __init__(self, kind: str, config: SFTConfig | DPOConfig) -> None:
        super().__init__()
        self.kind = kind
        self.config = config

    def build_trainer(self) -> Any:
        """The trainer of this rank (the process group is joined already)."""
        return trainer_class(self.kind)(self.config)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, rank_zero_result=True)
    def train(self) -> dict[str, Any]:
        """Build the trainer and train; rank 0's results (history, checkpoint, hf_dir, ...)."""
        return self.build_trainer().train()


def start_rank_group(
    kind: str,
    config: SFTConfig | DPOConfig,
    worker_cls: type[OfflineTrainWorker] | None = None,
    **worker_kwargs: Any,
) -> tuple[WorkerGroup, Any]:
    """Start ``trainer.n_gpus_per_node`` ranks of ``worker_cls`` (default
    :class:`OfflineTrainWorker`, built with ``kind``, ``config`` and ``worker_kwargs``) on
    Ray; returns the group and a function that stops it (and Ray, if this call started it)."""
    import ray

    from verl.controller.ray_backend import RayOptions, ensure_ray

    ranks = config.trainer.n_gpus_per_node
    device_type = resolve_device(config.trainer.device).type
    started = not ray.is_initialized()
    ensure_ray(num_cpus=max(os.cpu_count() or 1, ranks))
    try:
        group = make_worker_group(
            "ray",
            worker_cls or OfflineTrainWorker,
            ResourcePool([ranks], use_gpu=device_type == "cuda", name=kind),
            kind=kind,
            config=config,
            **worker_kwargs,
            ray_options=RayOptions(device_type=device_type),
        )
    except BaseException:
        if started:
            ray.shutdown()
        raise

    def stop() -> None:
        group.shutdown()
        if started:
            ray.shutdown()

    return group, stop


def train_on_ranks(kind: str, config: SFTConfig | DPOConfig) -> dict[str, Any]:
    """Train ``config`` (``kind``: sft or dpo) on ``trainer.n_gpus_per_node`` FSDP2 ranks;
    returns rank 0's results."""
    config.validate()
    group, stop = start_rank_group(kind, config)
    try:
        logger.info("%s on %d FSDP2 ranks (Ray)", kind, group.world_size)
        return group.train()
    finally:
        stop()
