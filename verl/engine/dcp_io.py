"""Reading ``torch.distributed.checkpoint`` (DCP) directories without arbitrary unpickling.

DCP stores tensors in ``.distcp`` files and everything else with pickle: the ``.metadata``
file, and every non-tensor value of the saved state dict (the optimizer's ``param_groups``:
learning rate, betas, flags, parameter names) as a ``torch.save`` blob that DCP's default
planner reads back with ``torch.load(weights_only=False)``. A checkpoint directory may come
from anywhere, so here:

- :class:`MetadataSafeReader` unpickles ``.metadata`` with an unpickler that admits only
  DCP's metadata classes and the few torch / stdlib values they hold;
- :class:`WeightsOnlyLoadPlanner` loads every non-tensor value with
  ``torch.load(weights_only=True)``, which refuses anything but tensors, containers and
  primitives;
- :func:`read_dcp_tensors` reads the full, unsharded tensors under a key prefix in one
  process with no process group (the offline export path, ``verl.cli.export``);
- :func:`load_dcp_state` restores a module (+ optimizer) from a DCP checkpoint, resharding
  to whatever layout the module has (FSDP2 on any number of ranks, or a plain module).
"""

from __future__ import annotations

import io
import pickle
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

__all__ = [
    "MetadataSafeReader",
    "WeightsOnlyLoadPlanner",
    "dcp_tensor_keys",
    "load_dcp_state",
    "read_dcp_tensors",
]


class MetadataSafeReader(FileSystemReader):
    """A DCP reader whose ``.metadata`` unpickler only admits DCP's metadata classes."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        path = self._get_metadata_path(rank)
        with self.fs.create_stream(path, "rb") as f:
            metadata = _RestrictedUnpickler(f).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError(f"{path} does not hold DCP Metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _RestrictedUnpickler(pickle.Unpickler):
    """Admits DCP's metadata classes and the few torch / stdlib values they hold.

    Every admitted global is named exactly: a dotted name (pickle protocol 4 resolves
    ``module`` + ``"os.system"`` attribute by attribute, reaching anything a module
    imports) and any other name of DCP's modules are refused.
    """

    _ALLOWED = frozenset(
        {
            ("torch", "Size"),
            ("torch.serialization", "_get_layout"),  # a lookup of torch.strided etc. by name
            ("pathlib", "PosixPath"),
            ("pathlib", "PurePosixPath"),
            ("collections", "OrderedDict"),
        }
    )
    # DCP's metadata dataclasses and enum (torch.distributed.checkpoint.metadata /
    # .filesystem; admitted from any DCP module, as long as the name is such a class there)
    _DCP_CLASSES = frozenset(
        {
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
            "_StorageInfo",
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        if "." not in name:
            if (module, name) in self._ALLOWED:
                return super().find_class(module, name)
            if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
                return super().find_class(module, name)
            if module.startswith("torch.distributed.checkpoint.") and name in self._DCP_CLASSES:
                found = super().find_class(module, name)
                if isinstance(found, type):
                    return found
        raise pickle.UnpicklingError(
            f"refusing to unpickle {module}.{name} from a checkpoint's DCP metadata"
        )


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, but non-tensor values are read with
    ``torch.load(weights_only=True)`` (DCP's own ``load_bytes`` uses ``weights_only=False``),
    which refuses any global that is not a tensor, container or primitive.

    A value is put where the target state dict has it: the targets here are built from the
    module's and optimizer's own state dicts, so every saved path exists in them.
    """

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            raise pickle.UnpicklingError(
                f"refusing checkpoint value {fqn!r}: it is not plain data (tensors, "
                f"containers, numbers, strings): {err}"
            ) from err
        if not self.flatten_state_dict:
            self.state_dict[fqn] = obj
            return
        *parents, last = self.mappings[fqn]
        container: Any = self.original_state_dict
        for key in parents:
            container = container[key]
        container[last] = obj


@contextmanager
def _quiet_no_dist() -> Iterator[None]:
    # DCP warns on every load without a process group; in these paths that is the intent.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single")
        yield


def dcp_tensor_keys(dcp_dir: str) -> dict[str, TensorStorageMetadata]:
    """The tensor entries of a DCP checkpoint (flattened keys, e.g. ``model.lm_head.weight``)."""
    metadata = MetadataSafeReader(dcp_dir).read_metadata()
    return {
        key: meta
        for key, meta in metadata.state_dict_metadata.items()
        if isinstance(meta, TensorStorageMetadata)
    }


def read_dcp_tensors(dcp_dir: str, prefix: str) -> dict[str, torch.Tensor]:
    """Full (unsharded) CPU tensors of every entry under ``prefix`` (e.g. ``"model"``).

    Keys are returned without the prefix: ``{"lm_head.weight": tensor, ...}``. Runs in one
    process whatever the number of ranks that wrote the checkpoint; nothing is unpickled
    but the restricted metadata.
    """
    lead = prefix + "."
    entries = {k: m for k, m in dcp_tensor_keys(dcp_dir).items() if k.startswith(lead)}
    if not entries:
        raise KeyError(f"the DCP checkpoint at {dcp_dir} has no tensors under {prefix!r}")
    target = {
        prefix: {
            key[len(lead) :]: torch.empty(meta.size, dtype=meta.properties.dtype)
            for key, meta in entries.items()
        }
    }
    with _quiet_no_dist():
        dcp.load(
            target,
            storage_reader=MetadataSafeReader(dcp_dir),
            planner=WeightsOnlyLoadPlanner(),
            no_dist=True,
        )
    return target[prefix]


def load_dcp_state(
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    dcp_dir: str,
    *,
    no_dist: bool = False,
) -> None:
    """Load ``{"model": ..., "optim": ...}`` from ``dcp_dir`` into ``module`` (+ optimizer).

    The state dicts are built from the module's own layout, so a checkpoint written by any
    number of FSDP2 ranks loads into any other number, or (``no_dist=True``) into a plain,
    unsharded module in one process. A collective unless ``no_dist``.
    """
    if optimizer is None:
        target: dict[str, Any] = {"model": get_model_state_dict(module)}
    else:
        model_sd, optim_sd = get_state_dict(module, optimizer)
        target = {"model": model_sd, "optim": optim_sd}
    with _quiet_no_dist():
        dcp.load(
            target,
            storage_reader=MetadataSafeReader(dcp_dir),
            planner=WeightsOnlyLoadPlanner(),
            no_dist=no_dist,
        )
    options = StateDictOptions(strict=True)
    if optimizer is None:
        set_model_state_dict(module, target["model"], options=options)
    else:
        set_state_dict(
            module,
            optimizer,
            model_state_dict=target["model"],
            optim_state_dict=target["optim"],
            options=options,
        )
