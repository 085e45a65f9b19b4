"""Running an offline trainer (SFT, DPO / IPO / KTO) on several FSDP2 ranks through Ray.

``trainer.nnodes x trainer.n_gpus_per_node`` > 1 starts one Ray actor per device (CPU
processes on a machine without GPUs), ``n_gpus_per_node`` on each of ``nnodes`` nodes of the
Ray cluster (``trainer.ray_address`` joins one; the nodes share the run's directories, as
with the RL trainer), joined in one ``torch.distributed`` group by the Ray backend
(``verl.controller``). Each actor builds the same trainer with ``engine.strategy=fsdp2``
and runs :meth:`~verl.trainer.offline.base.OfflineTrainer.train` SPMD: the ranks read the
same batches and split each step's micro-batches; rank 0 logs, holds the run lock and
writes the files other than the engine shards. The driver waits and gets rank 0's results.

    from verl.trainer.offline.launch import train_on_ranks
    results = train_on_ranks("sft", cfg)           # cfg.trainer.n_gpus_per_node = 2

``python -m verl.trainer.main_sft trainer.n_gpus_per_node=2`` does the same. A run killed
in the middle (driver or a rank) resumes from its last checkpoint like a one-process run.

Launched by ``torchrun`` instead (upstream verl's way: ``torchrun --nproc_per_node=N -m
verl.trainer.fsdp_sft_trainer ...``), each process is one rank already:
:func:`train_in_process_group` joins torchrun's process group and trains SPMD without Ray
(``main_sft`` / ``main_dpo`` take this path when torchrun's environment says so).

SIGTERM / SIGINT to the driver stop the run as they stop a one-process run: the driver
forwards the request to the ranks (``WorkerGroup.request_stop``), rank 0 reads it after the
step under way and broadcasts it, every rank saves the stop's checkpoint (when
``trainer.save_freq > 0``) and returns, and :func:`train_on_ranks` raises
:class:`~verl.trainer.lifecycle.stopping.RunInterrupted` (exit code 143 / 130 on the command line). A
second signal stops at once: the ranks are killed, the last complete checkpoint stays.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from verl.config import DPOConfig, SFTConfig
from verl.controller import (
    Dispatch,
    GroupFuture,
    ResourcePool,
    Worker,
    WorkerGroup,
    make_worker_group,
    register,
)
from verl.trainer.lifecycle.stopping import RunInterrupted, StopRequests
from verl.utils.device import resolve_device

logger = logging.getLogger(__name__)

__all__ = [
    "OfflineTrainWorker",
    "launched_by_torchrun",
    "start_rank_group",
    "train_in_process_group",
    "train_offline",
    "train_on_ranks",
    "wait_forwarding_stops",
]


def trainer_class(kind: str) -> type:
    """The trainer of ``kind`` (``sft``, ``dpo`` or ``rm``)."""
    if kind == "sft":
        from verl.trainer.offline.sft import SFTTrainer

        return SFTTrainer
    if kind == "dpo":
        from verl.trainer.offline.dpo import DPOTrainer

        return DPOTrainer
    if kind == "rm":
        from verl.trainer.offline.rm import RMTrainer

        return RMTrainer
    raise ValueError(f"kind={kind!r}: use sft, dpo or rm")


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
        """Build the trainer and train; rank 0's results (history, checkpoint, hf_dir, ...).

        A run stopped by a forwarded signal returns ``{"stopped": (signum, step,
        checkpoint)}`` instead of raising (Ray would report the ``KeyboardInterrupt`` it is
        as a failure of the task)."""
        trainer = self.build_trainer()
        trainer.stop_source = lambda: self.stop_signum
        try:
            return trainer.train()
        except RunInterrupted as stopped:
            checkpoint = None if stopped.checkpoint is None else str(stopped.checkpoint)
            return {"stopped": (stopped.signum, stopped.step, checkpoint)}


def start_rank_group(
    kind: str,
    config: SFTConfig | DPOConfig,
    worker_cls: type[OfflineTrainWorker] | None = None,
    **worker_kwargs: Any,
) -> tuple[WorkerGroup, Any]:
    """Start ``trainer.nnodes x trainer.n_gpus_per_node`` ranks of ``worker_cls`` (default
    :class:`OfflineTrainWorker`, built with ``kind``, ``config`` and ``worker_kwargs``) on
    Ray; returns the group and a function that stops it (and Ray, if this call started it)."""
    import ray

    from verl.controller.ray_backend import RayOptions, ensure_ray

    t = config.trainer
    device_type = resolve_device(t.device).type
    started = not ray.is_initialized()
    ensure_ray(num_cpus=max(os.cpu_count() or 1, t.world_size), address=t.ray_address)
    try:
        group = make_worker_group(
            "ray",
            worker_cls or OfflineTrainWorker,
            ResourcePool([t.n_gpus_per_node] * t.nnodes, use_gpu=device_type == "cuda", name=kind),
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
    """Train ``config`` (``kind``: sft or dpo) on ``trainer.nnodes x
    trainer.n_gpus_per_node`` FSDP2 ranks; returns rank 0's results."""
    config.validate()
    group, stop = start_rank_group(kind, config)
    try:
        logger.info(
            "%s on %d FSDP2 ranks (Ray), nodes by rank: %s",
            kind,
            group.world_size,
            ", ".join(str(node) for node in group.nodes),
        )
        results = wait_forwarding_stops(group, group.train.submit())
    finally:
        stop()
    if "stopped" in results:
        signum, step, checkpoint = results["stopped"]
        raise RunInterrupted(signum, step, None if checkpoint is None else Path(checkpoint))
    return results


def wait_forwarding_stops(group: WorkerGroup, future: GroupFuture, poll_s: float = 0.5) -> Any:
    """``future.result()``, forwarding a SIGTERM / SIGINT that reaches this (main) thread
    meanwhile to ``group`` once; a second signal raises ``RunInterrupted`` here at once."""
    forwarded = False
    with StopRequests() as requests:
        while True:
            try:
                return future.result(timeout=poll_s)
            except TimeoutError:
                if requests.signum is not None and not forwarded:
                    group.request_stop(requests.signum)
                    forwarded = True


def launched_by_torchrun() -> bool:
    """Whether this process is one of several ranks that ``torchrun`` started."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "LOCAL_WORLD_SIZE" in os.environ


def train_in_process_group(kind: str, config: SFTConfig | DPOConfig) -> dict[str, Any]:
    """Train ``config`` as this rank of a ``torchrun`` launch; returns this rank's results.

    The ranks' layout comes from torchrun's environment (``WORLD_SIZE``, ``RANK``,
    ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` / ``MASTER_PORT``): a config left at one device
    takes it (``nnodes`` x ``n_gpus_per_node``), one that names another layout is refused,
    and ``engine.strategy`` single becomes fsdp2 (one copy per rank would train nothing
    together). A SIGTERM / SIGINT that torchrun passes on stops every rank after the same
    step (rank 0's request is broadcast), with the stop's checkpoint.
    """
    import torch.distributed as dist

    from verl.utils.distributed import init_distributed

    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    t = config.trainer
    if t.world_size == 1:
        t.nnodes, t.n_gpus_per_node = world // per_node, per_node
    elif t.world_size != world:
        raise ValueError(
            f"trainer.nnodes x trainer.n_gpus_per_node = {t.world_size}, but torchrun started "
            f"{world} ranks: leave them at 1 (torchrun's layout is taken) or make them agree"
        )
    if config.engine.strategy == "single":
        logger.info("engine.strategy=single on %d torchrun ranks: training with fsdp2", world)
        config.engine.strategy = "fsdp2"
    config.validate()
    init_distributed(
        rank,
        world,
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        device_type=resolve_device(t.device).type,
    )
    try:
        trainer = trainer_class(kind)(config)
        requests = StopRequests()
        trainer.stop_source = lambda: requests.signum
        with requests:
            return trainer.train()
    finally:
        dist.destroy_process_group()


def train_offline(kind: str, config: SFTConfig | DPOConfig) -> dict[str, Any]:
    """Train ``config`` (``kind``: sft or dpo) where it says: as this rank of a torchrun
    launch, on ``nnodes x n_gpus_per_node`` Ray ranks, or in this process."""
    if launched_by_torchrun():
        return train_in_process_group(kind, config)
    if config.trainer.world_size > 1:
        return train_on_ranks(kind, config)
    return trainer_class(kind)(config).train()
