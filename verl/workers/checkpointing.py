"""One worker rank's share of a run checkpoint (see ``verl/trainer/lifecycle/checkpoint.py``).

A trainable role's directory in a checkpoint holds its engine checkpoint (model, optimizer,
LR schedule, written by ``TrainEngine.save_checkpoint``: sharded DCP under FSDP2, one set of
files for the single engine) plus one ``worker_state_rank{r}.json`` per rank: that rank's
random-generator states and the worker's call counters (which seed the PPO mini-batch
shuffles and, with a fixed ``rollout.seed``, the rollouts). Rank 0 also writes the
HuggingFace config and tokenizer files once, so the checkpoint alone can be exported to a
HF model directory (``python -m verl.model_merger``).

Saving runs inside :func:`~verl.utils.rng.preserved_rng`: writing a checkpoint never changes
which random numbers the run draws next, so a run that saves and one that does not take the
same steps.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import Any

from verl.models.vision_processor import save_processor_files
from verl.utils.atomic_io import write_json_atomic
from verl.utils.rng import preserved_rng, rng_state, set_rng_state

logger = logging.getLogger(__name__)

__all__ = [
    "WORKER_STATE_FILE",
    "load_worker_checkpoint",
    "save_hf_metadata",
    "save_role_checkpoint",
    "save_worker_checkpoint",
]

WORKER_STATE_FILE = "worker_state_rank{rank}.json"
_FORMAT_VERSION = 1


def save_worker_checkpoint(
    engine: Any, path: str, *, rank: int, world_size: int, counters: dict[str, int]
) -> None:
    """Write ``engine``'s checkpoint and this rank's RNG + ``counters`` under ``path``.

    Collective when the engine is sharded: every rank of the role must call it.
    """
    with preserved_rng():
        state = {
            "format_version": _FORMAT_VERSION,
            "rank": rank,
            "world_size": world_size,
            "counters": dict(counters),
            "rng": rng_state(),
        }
        engine.save_checkpoint(path)  # creates `path` (rank 0) and ends with a barrier
        os.makedirs(path, exist_ok=True)
        write_json_atomic(os.path.join(path, WORKER_STATE_FILE.format(rank=rank)), state)


def save_role_checkpoint(
    engine: Any,
    tokenizer: Any,
    path: str,
    *,
    rank: int,
    world_size: int,
    counters: dict[str, int],
    hf_config_dir: str | None,
    write_hf_model: Callable[[str | None], Any] | None,
) -> None:
    """A trainable worker's ``save_checkpoint``: :func:`save_worker_checkpoint`, then for
    export either the whole HF model (``write_hf_model(hf_config_dir)``, when given: the
    role's own writer, which refuses what it cannot write) or, on rank 0, the HF metadata
    (:func:`save_hf_metadata`) in ``hf_config_dir``, plus the LoRA config of a LoRA model
    (export folds the adapters in, ``verl.model_merger``). Collective when sharded."""
    save_worker_checkpoint(engine, path, rank=rank, world_size=world_size, counters=counters)
    if write_hf_model is not None:
        write_hf_model(hf_config_dir)
    elif hf_config_dir is not None and rank == 0:
        from verl.models.lora import is_lora_model, lora_config_of

        save_hf_metadata(engine.module, tokenizer, hf_config_dir)
        if is_lora_model(engine.module):
            lora_config_of(engine.module).save_pretrained(hf_config_dir)


def load_worker_checkpoint(engine: Any, path: str, *, rank: int, world_size: int) -> dict[str, int]:
    """Restore ``engine`` and this rank's RNG from ``path``; returns the saved counters.

    With as many ranks as were saved, rank ``r`` gets rank ``r``'s generators back (an exact
    continuation). With another number of ranks the engine state is re-sharded, ranks that
    did not exist keep their generators and every rank takes rank 0's counters; the run
    continues correctly but not bit for bit (the batch is split differently anyway).
    """
    rank0_file = os.path.join(path, WORKER_STATE_FILE.format(rank=0))
    if not os.path.isfile(rank0_file):
        raise FileNotFoundError(
            f"incomplete role checkpoint at {path}: {os.path.basename(rank0_file)} is missing"
        )
    engine.load_checkpoint(path)
    own_file = os.path.join(path, WORKER_STATE_FILE.format(rank=rank))
    with open(own_file if os.path.isfile(own_file) else rank0_file) as f:
        state = json.load(f)
    if state.get("format_version") != _FORMAT_VERSION:
        raise ValueError(
            f"{own_file} has format_version={state.get('format_version')}, "
            f"this code reads {_FORMAT_VERSION}"
        )
    saved_world = int(state["world_size"])
    if saved_world != world_size:
        logger.warning(
            "checkpoint %s was saved by %d ranks and is loaded by %d: the state is re-sharded, "
            "but random streams and data split differ, so the continuation is not bit-exact",
            path,
            saved_world,
            world_size,
        )
    if int(state["rank"]) == rank:
        set_rng_state(state["rng"])  # last: loading must not move the restored generators
    return {key: int(value) for key, value in state["counters"].items()}


def save_hf_metadata(module: Any, tokenizer: Any, out_dir: str) -> None:
    """Write what a HF model directory needs besides the weights: config, generation
    config, tokenizer files. ``module`` is the (possibly sharded) HF model or a critic
    whose ``config`` is its body's."""
    os.makedirs(out_dir, exist_ok=True)
    config = getattr(module, "config", None)
    if config is None:
        logger.warning(
            "%s has no HF config: the checkpoint cannot be exported with verl.cli.export",
            type(module).__name__,
        )
        return
    config.save_pretrained(out_dir)
    generation_config = getattr(module, "generation_config", None)
    if generation_config is not None:
        generation_config.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
        save_processor_files(module, tokenizer, out_dir)  # a vision-language model's
