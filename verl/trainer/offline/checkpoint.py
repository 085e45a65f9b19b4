"""What an offline run (SFT, DPO / IPO / KTO) checkpoints, and how it resumes bit for bit.

The format is the RL trainer's (``verl.trainer.lifecycle.checkpoint``: atomic ``global_step_N``
directories with a CRC-32 manifest, the ``latest`` pointer, retention), with the trained
policy in the actor's place, so ``python -m verl.model_merger`` exports it too::

    global_step_N/
      actor/                   the policy engine: model, optimizer, LR schedule (single: one
                               set of files; fsdp2: sharded DCP) + worker_state_rank{r}.json
                               (RNG states) + huggingface/ (config and tokenizer, for export)
      trainer_state.json       step, data-loader epoch and position, the driver's RNG
      config.yaml              the resolved config
      checkpoint.json          manifest (written last): trainer kind, roles, files + CRC-32

Nothing else is needed for an exact continuation: the datasets are read (or the built-in
set regenerated) again, and DPO's reference log-probs are recomputed from the initial
model (``model.path``) before anything is loaded. ``trainer.resume_mode`` and the refusal of
a checkpoint whose model, tokenizer, data or loss settings changed
(:data:`OFFLINE_IDENTITY_KEYS`, overridden by ``trainer.resume_force``) work as for the RL
trainer; see ``docs/checkpoints.md``.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from verl.config import to_yaml
from verl.trainer.lifecycle.checkpoint import (
    CONFIG_FILE,
    FORMAT_VERSION,
    HF_CONFIG_DIR,
    ROLE_DIRS,
    TRAINER_STATE_FILE,
    CheckpointError,
    CheckpointManager,
    read_manifest,
)
from verl.trainer.lifecycle.resume import check_resume_config
from verl.utils.atomic_io import write_json_atomic, write_text_atomic
from verl.utils.rng import rng_state, set_rng_state
from verl.workers.checkpointing import (
    load_worker_checkpoint,
    save_hf_metadata,
    save_worker_checkpoint,
)

if TYPE_CHECKING:
    from verl.trainer.offline.base import OfflineTrainer

logger = logging.getLogger(__name__)

__all__ = ["OFFLINE_IDENTITY_KEYS", "load_offline_checkpoint", "save_offline_checkpoint"]

# The policy plays the actor's part: its directory and manifest entry are the actor's, so
# the export tool and the layout docs apply unchanged.
POLICY_ROLE = "actor_rollout_ref"

# Keys whose change makes resuming meaningless (another model or tokenizer, other rows
# behind the saved data position, another batch order, another loss); a key covers its
# section. Refused unless trainer.resume_force=true. Keys of the other trainer's schema are
# simply absent (a DPO checkpoint has algorithm.loss_type, an SFT config has not: refused).
OFFLINE_IDENTITY_KEYS = (
    "model.path",
    "model.tokenizer_path",
    "model.override_config",
    "data.train_files",
    "data.messages_key",
    "data.prompt_key",
    "data.response_key",
    "data.apply_chat_template",
    "data.max_length",
    "data.max_prompt_length",
    "data.truncation",
    "data.packing",
    "data.train_batch_size",
    "data.shuffle",
    "data.seed",
    "data.builtin",
    "data.arithmetic",
    "algorithm.loss_type",
    "trainer.project_name",
    "trainer.experiment_name",
)


def _policy_entry(trainer: OfflineTrainer) -> dict[str, Any]:
    return {
        "dir": ROLE_DIRS[POLICY_ROLE],
        "world_size": trainer.world_size,
        "strategy": trainer.strategy,
    }


def _save_engine(trainer: OfflineTrainer, role_dir: Path) -> None:
    """This rank's share of the policy's directory (collective under fsdp2)."""
    try:
        save_worker_checkpoint(
            trainer.engine,
            str(role_dir),
            rank=trainer.rank,
            world_size=trainer.world_size,
            counters={},
        )
        if trainer.rank == 0:
            save_hf_metadata(
                trainer.engine.module, trainer.tokenizer, str(role_dir / HF_CONFIG_DIR)
            )
    finally:
        if trainer.world_size > 1:
            # Every rank's files are in before rank 0 writes the manifest; reached on a
            # failure too, so that rank 0 can then tell the others the save failed.
            dist.barrier()


def save_offline_checkpoint(trainer: OfflineTrainer, manager: CheckpointManager) -> Path:
    """Write the complete state of ``trainer`` after step ``trainer.global_step``.

    Collective: on several ranks, rank 0 runs the atomic save and sends the temporary
    directory to the others, which write their engine shards into it; every rank returns
    once the checkpoint is in place (or raises if the save failed).
    """

    def write(tmp: Path) -> dict[str, Any]:
        # The driver's generators first: the engine's save leaves every generator untouched.
        state = {
            "format_version": FORMAT_VERSION,
            "trainer": trainer.kind,
            "global_step": trainer.global_step,
            "total_steps": trainer.total_steps,
            "epoch": trainer.train_loader.epoch,
            "dataloader": trainer.train_loader.state_dict(),
            "rng": rng_state(),
        }
        trainer.broadcast(str(tmp))
        _save_engine(trainer, tmp / ROLE_DIRS[POLICY_ROLE])
        write_json_atomic(tmp / TRAINER_STATE_FILE, state)
        write_text_atomic(tmp / CONFIG_FILE, to_yaml(trainer.config))
        return {"trainer": trainer.kind, "roles": {POLICY_ROLE: _policy_entry(trainer)}}

    if trainer.world_size == 1:
        return manager.save(trainer.global_step, write)
    if trainer.rank != 0:
        tmp = trainer.broadcast(None)
        if not tmp:
            raise CheckpointError(f"rank 0 failed to save checkpoint {trainer.global_step}")
        _save_engine(trainer, Path(tmp) / ROLE_DIRS[POLICY_ROLE])
        final = trainer.broadcast(None)
        if not final:
            raise CheckpointError(f"rank 0 failed to save checkpoint {trainer.global_step}")
        return Path(final)
    try:
        path = manager.save(trainer.global_step, write)
    except BaseException:
        trainer.broadcast("")
        raise
    trainer.broadcast(str(path))
    return path


def _check_manifest(path: Path, manifest: dict[str, Any], trainer: OfflineTrainer) -> None:
    kind = manifest.get("trainer")
    if kind != trainer.kind:
        saved_by = f"the {kind} trainer" if kind else "the RL trainer"
        raise CheckpointError(
            f"checkpoint {path} was saved by {saved_by}, not by the {trainer.kind} trainer; "
            "resume it with the trainer that wrote it, or start fresh "
            "(trainer.resume_mode=disable or another trainer.default_local_dir)"
        )
    saved = manifest["roles"][POLICY_ROLE]
    size, strategy = trainer.world_size, trainer.strategy
    if saved["strategy"] == "single" and strategy == "fsdp2":
        raise CheckpointError(
            f"checkpoint {path} was saved by the single-process engine and this run uses "
            f"fsdp2 on {size} rank(s); only sharded fsdp2 checkpoints can be re-sharded. "
            "Resume with engine.strategy=single, or train with engine.strategy=fsdp2 from "
            "the start"
        )
    if saved["world_size"] != size:
        logger.warning(
            "checkpoint %s was saved by %d rank(s) and is re-sharded to %d; training "
            "continues correctly but not bit for bit (other reductions and random streams)",
            path,
            saved["world_size"],
            size,
        )


def _restore_data_position(trainer: OfflineTrainer, saved: dict[str, Any], path: Path) -> None:
    """The loader's position; with ``resume_force`` and other batching, the saved epoch and
    position are kept as far as they fit the new batching."""
    try:
        trainer.train_loader.load_state_dict(saved)
    except ValueError as err:
        if not trainer.config.trainer.resume_force:
            raise CheckpointError(f"checkpoint {path}: {err}") from err
        sampler = saved["sampler"]
        epoch, position = int(sampler["epoch"]), int(sampler["position"])
        if position > len(trainer.train_loader):
            epoch, position = epoch + 1, 0
        trainer.train_loader.sampler.load_state_dict({"epoch": epoch, "position": position})
        logger.warning(
            "trainer.resume_force=true: the data order changed (%s); continuing at epoch %d, "
            "batch %d of the new order",
            err,
            epoch,
            position,
        )


def load_offline_checkpoint(
    trainer: OfflineTrainer, path: str | os.PathLike[str], verify: bool = True
) -> None:
    """Restore ``trainer`` (engine, data position, step, RNG) from checkpoint ``path``.

    ``verify``: check every file's CRC-32 first (False where the caller just did).
    """
    path = Path(path)
    manifest = read_manifest(path, verify=verify)
    _check_manifest(path, manifest, trainer)
    check_resume_config(path, trainer.config, OFFLINE_IDENTITY_KEYS)
    state = json.loads((path / TRAINER_STATE_FILE).read_text())
    role_dir = path / manifest["roles"][POLICY_ROLE]["dir"]
    # Restores this rank's generators too (rank r gets rank r's when the sizes match).
    load_worker_checkpoint(
        trainer.engine, str(role_dir), rank=trainer.rank, world_size=trainer.world_size
    )
    trainer.global_step = int(state["global_step"])
    _restore_data_position(trainer, state["dataloader"], path)
    if trainer.rank == 0:
        set_rng_state(state["rng"])  # last: nothing above may move the restored generators
    logger.info("resumed from %s at step %d", path, trainer.global_step)
