"""The single-process train engine: one module on one device, no wrapping.

Used for CPU runs, tests and one-GPU jobs. Checkpoints are a directory of three files:

- ``model.safetensors``: the weights (tied weights stored once);
- ``optim_tensors.pt``: every tensor of the optimizer / scheduler / scaler state as a flat
  ``{name: tensor}`` dict, loaded with ``torch.load(weights_only=True)``;
- ``engine_state.json``: everything else (param groups, step counters, the schedule's
  position, the loss-scale), with placeholders naming the tensors in ``optim_tensors.pt``.

Each file is written to a temporary name and renamed, the JSON last.

It also loads a checkpoint of the ``fsdp2`` engine written by any number of ranks
(``model_optim/``, a ``torch.distributed.checkpoint``): the shards are read into this
unsharded module in one process, so a multi-rank run can be resumed on one device.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import torch
from safetensors.torch import load_model, save_model
from torch import nn

from verl.engine.base import OptimSpec, TrainEngine
from verl.engine.dcp_io import load_dcp_state
from verl.engine.options import EngineOptions
from verl.engine.sharded_checkpoint import DCP_DIR, check_sharded_state, scalar_state
from verl.utils.atomic_io import atomic_path, write_json_atomic

logger = logging.getLogger(__name__)

MODEL_FILE = "model.safetensors"
TENSORS_FILE = "optim_tensors.pt"
STATE_FILE = "engine_state.json"
_FORMAT_VERSION = 1


class SingleProcessEngine(TrainEngine):
    """:class:`TrainEngine` for one process on one device (see the base class for args).

    The fsdp2-only options (:data:`verl.engine.options.FSDP2_ONLY`) are refused when they
    ask for anything this engine cannot do (:meth:`EngineOptions.check_single_process`).
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer_cfg: OptimSpec | None,
        options: EngineOptions | None = None,
        **overrides: Any,
    ) -> None:
        options = EngineOptions.of(options, **overrides)
        options.check_single_process()
        super().__init__(module, optimizer_cfg, options)

    def _prepare_module(self, module: nn.Module) -> nn.Module:
        module.to(self.device)
        if self.param_dtype is not None:
            module.to(self.param_dtype)
        return module

    def state_dict_for_save(self) -> dict[str, torch.Tensor]:
        """Full model state dict, copied to CPU (tied weights appear under each name)."""
        return {
            name: tensor.detach().to("cpu", copy=True)
            for name, tensor in self.module.state_dict().items()
        }

    def save_checkpoint(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        with atomic_path(os.path.join(path, MODEL_FILE)) as tmp:
            save_model(self.module, str(tmp))

        # the weights went to MODEL_FILE above (tied weights once); the rest of state_dict()
        # is JSON, with its tensors in TENSORS_FILE
        engine_state = self.state_dict()
        tensors: dict[str, torch.Tensor] = {}
        state = {
            "format_version": _FORMAT_VERSION,
            "param_names": self._param_names(),
            "skipped_steps": engine_state["skipped_steps"],
            "consecutive_skipped": engine_state["consecutive_skipped"],
        }
        for key, prefix in (("optimizer", "optim"), ("scheduler", "sched"), ("scaler", "scaler")):
            state[key] = _encode(engine_state[key], prefix, tensors)
        with atomic_path(os.path.join(path, TENSORS_FILE)) as tmp:
            torch.save(tensors, tmp)
        write_json_atomic(os.path.join(path, STATE_FILE), state)
        logger.info("saved engine checkpoint to %s", path)

    def load_checkpoint(self, path: str) -> None:
        if os.path.isdir(os.path.join(path, DCP_DIR)):
            self._load_sharded_checkpoint(path)
            return
        files = [os.path.join(path, name) for name in (MODEL_FILE, TENSORS_FILE, STATE_FILE)]
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            raise FileNotFoundError(f"incomplete engine checkpoint at {path}: missing {missing}")
        with open(files[2]) as f:
            state = json.load(f)
        if state.get("format_version") != _FORMAT_VERSION:
            raise ValueError(
                f"{files[2]} has format_version={state.get('format_version')}, "
                f"this code reads {_FORMAT_VERSION}"
            )
        if state["param_names"] != self._param_names():
            raise ValueError(
                f"checkpoint at {path} was saved for different trainable parameters "
                f"({len(state['param_names'])} saved vs {len(self._param_names())} here); "
                "load it into the same model architecture"
            )
        load_model(self.module, files[0], strict=True, device=str(self.device))
        tensors = torch.load(files[1], map_location="cpu", weights_only=True)
        parts = ("optimizer", "scheduler", "scaler")
        engine_state = {key: _decode(state[key], tensors) for key in parts}
        engine_state["skipped_steps"] = state["skipped_steps"]
        engine_state["consecutive_skipped"] = state.get("consecutive_skipped", 0)
        try:
            self.load_state_dict(engine_state)  # no "model": loaded from MODEL_FILE above
        except ValueError as err:
            raise ValueError(f"checkpoint at {path}: {err}") from err
        logger.info("loaded engine checkpoint from %s (step %d)", path, self.global_step)

    def _load_sharded_checkpoint(self, path: str) -> None:
        """Load an fsdp2 engine checkpoint (DCP shards of any number of ranks) in-process."""
        state_file = os.path.join(path, STATE_FILE)
        if not os.path.isfile(state_file):
            raise FileNotFoundError(
                f"incomplete fsdp2 engine checkpoint at {path}: {STATE_FILE} is missing"
            )
        with open(state_file) as f:
            state = json.load(f)
        check_sharded_state(state, path, self._param_names(), self.optimizer is not None)
        load_dcp_state(self.module, self.optimizer, os.path.join(path, DCP_DIR), no_dist=True)
        self.load_state_dict(scalar_state(state, self.optimizer is not None))
        logger.info(
            "loaded the fsdp2 checkpoint of %s ranks at %s into one process (step %d)",
            state.get("world_size"),
            path,
            self.global_step,
        )

    def _param_names(self) -> list[str]:
        return [name for name, p in self.module.named_parameters() if p.requires_grad]


def _encode(obj: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """JSON-able copy of ``obj``; tensors go to ``tensors`` and leave a named placeholder.

    Tuples and dicts with non-string keys (the optimizer's ``{param_index: state}``) are
    tagged so :func:`_decode` restores them exactly.
    """
    if isinstance(obj, torch.Tensor):
        tensors[prefix] = obj.detach().cpu()
        return {"__tensor__": prefix}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: _encode(v, f"{prefix}.{k}", tensors) for k, v in obj.items()}
        return {"__items__": [[k, _encode(v, f"{prefix}.{k}", tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [_encode(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"cannot checkpoint {prefix}={obj!r} of type {type(obj).__name__}")


def _decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if set(obj) == {"__tensor__"}:
        return tensors[obj["__tensor__"]]
    if set(obj) == {"__tuple__"}:
        return tuple(_decode(v, tensors) for v in obj["__tuple__"])
    if set(obj) == {"__items__"}:
        return {k: _decode(v, tensors) for k, v in obj["__items__"]}
    return {k: _decode(v, tensors) for k, v in obj.items()}
