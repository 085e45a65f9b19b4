"""The layout of an fsdp2 engine checkpoint, and the checks every reader of one shares.

An fsdp2 engine checkpoint is a directory holding ``model_optim/`` (:data:`DCP_DIR`, a
``torch.distributed.checkpoint`` of the sharded model and optimizer) and
``engine_state.json`` (:data:`STATE_FILE`: the format version, the world and sequence-parallel
sizes it was written by, the trainable parameter names, the schedule and the non-finite
step counters). Two engines read it: :class:`verl.engine.fsdp.FSDP2Engine` on any number of
ranks, and :class:`verl.engine.single.SingleProcessEngine` in one process; both check it
with :func:`check_sharded_state` and restore the scalar part with :func:`scalar_state`.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = [
    "DCP_DIR",
    "FORMAT_VERSION",
    "SINGLE_ENGINE_MODEL_FILE",
    "STATE_FILE",
    "check_sharded_state",
    "scalar_state",
]

DCP_DIR = "model_optim"
STATE_FILE = "engine_state.json"
FORMAT_VERSION = 1
# The single-process engine's weights file (see verl.engine.single): its presence marks a
# checkpoint in that engine's format.
SINGLE_ENGINE_MODEL_FILE = "model.safetensors"


def check_sharded_state(
    state: dict[str, Any], path: str, param_names: list[str], has_optimizer: bool
) -> None:
    """Check an ``engine_state.json`` of a DCP checkpoint against the engine loading it."""
    state_file = os.path.join(path, STATE_FILE)
    if state.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{state_file} has format_version={state.get('format_version')}, "
            f"this code reads {FORMAT_VERSION}"
        )
    if state["param_names"] != param_names:
        raise ValueError(
            f"checkpoint at {path} was saved for different trainable parameters "
            f"({len(state['param_names'])} saved vs {len(param_names)} here); "
            "load it into the same model architecture"
        )
    if state["has_optimizer"] != has_optimizer:
        raise ValueError(
            f"checkpoint at {path} has optimizer state={state['has_optimizer']} but this "
            f"engine has an optimizer={has_optimizer}; build it with the "
            "same optimizer_cfg it was saved with"
        )


def scalar_state(saved: dict[str, Any], has_optimizer: bool) -> dict[str, Any]:
    """The part of ``TrainEngine.state_dict()`` an fsdp2 checkpoint keeps in
    ``engine_state.json`` (the model and optimizer are in the DCP shards)."""
    return {
        "scheduler": saved["scheduler"] if has_optimizer else None,
        "skipped_steps": saved["skipped_steps"],
        "consecutive_skipped": saved.get("consecutive_skipped", 0),
    }
