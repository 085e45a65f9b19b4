"""The files of batches held across a checkpoint: the asynchronous rollout's in-flight
batches and the streaming buffer. Data only: nothing is unpickled when they load.

``{stem}.safetensors`` holds every tensor, ``{stem}.json`` everything else (the per-sample
numpy object arrays and ``meta_info``), each value tagged with its type so that it comes
back as the same type (a tuple stays a tuple, an ``np.int64`` an ``np.int64``, a numeric
array keeps its dtype and bytes). Saving a value of another type (an arbitrary object) is
refused, naming where it is. A checkpoint holding a pickled ``inflight.pt`` (older
versions) is refused on load: unpickling it could run any code the file carries.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.trainer.lifecycle.checkpoint import CheckpointError
from verl.utils.atomic_io import atomic_path, write_json_atomic

__all__ = [
    "INFLIGHT_JSON",
    "INFLIGHT_TENSORS",
    "decode_batches",
    "encode_batches",
    "read_inflight",
    "write_batch_files",
]

INFLIGHT_TENSORS = "inflight.safetensors"
INFLIGHT_JSON = "inflight.json"
LEGACY_INFLIGHT_FILE = "inflight.pt"  # pickled by older versions: refused
INFLIGHT_FORMAT = 1

# {"batch": V, "non_tensor_batch": V, "meta_info": V} and V a value: JSON null, booleans,
# numbers, strings and lists stand for themselves; every other value is a JSON object with
# one key naming its type (so a JSON object is never a plain value):
#   {"dict": [[key V, value V], ...]}    {"tuple": [V, ...]}    {"set" | "frozenset": [V, ...]}
#   {"bytes": base64}                     {"tensor": name in inflight.safetensors}
#   {"ndarray": {"dtype": "<i8", "shape": [..], "data": base64}}   (numeric arrays)
#   {"objects": {"shape": [..], "items": [V, ...]}}                (object arrays, C order)
#   {"npscalar": {"dtype": "<f4", "data": base64}}                 (np.int64(3), ...)

_PLAIN = (bool, int, float, str)


class _Encoder:
    """Values -> JSON-able values, tensors collected under generated names."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}

    def __call__(self, value: Any, where: str) -> Any:
        if value is None or type(value) in _PLAIN:
            return value
        if isinstance(value, torch.Tensor):
            if value.layout != torch.strided or value.is_quantized:
                raise TypeError(f"{where}: a {value.layout} tensor cannot be saved")
            name = str(len(self.tensors))
            # an own, contiguous CPU copy: safetensors refuses tensors that share storage
            self.tensors[name] = value.detach().to("cpu", copy=True).contiguous()
            return {"tensor": name}
        if isinstance(value, np.ndarray):
            if value.dtype == object:
                items = [self(v, f"{where}[{i}]") for i, v in enumerate(value.ravel())]
                return {"objects": {"shape": list(value.shape), "items": items}}
            _check_plain_dtype(value.dtype, where)
            data = base64.b64encode(np.ascontiguousarray(value).tobytes()).decode("ascii")
            return {"ndarray": {"dtype": value.dtype.str, "shape": list(value.shape), "data": data}}
        if isinstance(value, np.generic):
            _check_plain_dtype(value.dtype, where)
            data = base64.b64encode(value.tobytes()).decode("ascii")
            return {"npscalar": {"dtype": value.dtype.str, "data": data}}
        if type(value) is dict:
            return {
                "dict": [
                    [self(k, f"{where} key {k!r}"), self(v, f"{where}[{k!r}]")]
                    for k, v in value.items()
                ]
            }
        if type(value) is list:
            return [self(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if type(value) in (tuple, set, frozenset):
            kind = type(value).__name__
            return {kind: [self(v, f"{where}[{i}]") for i, v in enumerate(value)]}
        if type(value) is bytes:
            return {"bytes": base64.b64encode(value).decode("ascii")}
        raise TypeError(
            f"{where} is a {type(value).__module__}.{type(value).__qualname__}: the in-flight "
            "batches of an async-rollout checkpoint hold data only (None, bool, int, float, "
            "str, bytes, lists, tuples, sets, dicts, numpy arrays and scalars, tensors)"
        )


def _check_plain_dtype(dtype: np.dtype, where: str) -> None:
    if dtype.hasobject or dtype.fields is not None or dtype.kind == "V":
        raise TypeError(f"{where}: numpy dtype {dtype} cannot be saved as plain bytes")


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of :class:`_Encoder` (raises ValueError / TypeError / KeyError on a
    malformed document)."""
    if value is None or type(value) in _PLAIN:
        return value
    if type(value) is list:
        return [_decode(v, tensors) for v in value]
    if type(value) is not dict or len(value) != 1:
        raise ValueError(f"not a tagged value: {str(value)[:80]}")
    ((kind, body),) = value.items()
    if kind == "dict":
        return {_decode(k, tensors): _decode(v, tensors) for k, v in body}
    if kind in ("tuple", "set", "frozenset"):
        return {"tuple": tuple, "set": set, "frozenset": frozenset}[kind](
            _decode(v, tensors) for v in body
        )
    if kind == "bytes":
        return base64.b64decode(body, validate=True)
    if kind == "tensor":
        return tensors[body]
    if kind == "ndarray":
        dtype = np.dtype(body["dtype"])
        _check_plain_dtype(dtype, "ndarray")
        raw = base64.b64decode(body["data"], validate=True)
        return np.frombuffer(raw, dtype=dtype).reshape(body["shape"]).copy()
    if kind == "npscalar":
        dtype = np.dtype(body["dtype"])
        _check_plain_dtype(dtype, "npscalar")
        (scalar,) = np.frombuffer(base64.b64decode(body["data"], validate=True), dtype=dtype)
        return scalar
    if kind == "objects":
        items = [_decode(v, tensors) for v in body["items"]]
        out = np.empty(len(items), dtype=object)
        for i, item in enumerate(items):
            out[i] = item
        return out.reshape(body["shape"])
    raise ValueError(f"unknown value type {kind!r}")


def _encode_proto(encode: _Encoder, data: DataProto, where: str) -> dict[str, Any]:
    return {
        "batch": encode(dict(data.batch), f"{where}.batch"),
        "non_tensor_batch": encode(dict(data.non_tensor_batch), f"{where}.non_tensor_batch"),
        "meta_info": encode(dict(data.meta_info), f"{where}.meta_info"),
    }


def _decode_proto(doc: Any, tensors: dict[str, torch.Tensor]) -> DataProto:
    parts = {key: _decode(doc[key], tensors) for key in ("batch", "non_tensor_batch", "meta_info")}
    if not all(isinstance(v, dict) for v in parts.values()):
        raise ValueError("batch, non_tensor_batch and meta_info must be dicts")
    if not all(isinstance(t, torch.Tensor) for t in parts["batch"].values()):
        raise ValueError("batch holds a value that is not a tensor")
    if not all(isinstance(a, np.ndarray) for a in parts["non_tensor_batch"].values()):
        raise ValueError("non_tensor_batch holds a value that is not a numpy array")
    data = DataProto(
        batch=parts["batch"],
        non_tensor_batch=parts["non_tensor_batch"],
        meta_info=parts["meta_info"],
    )
    # as saved: construction made every array an object array (one assigned later may not be)
    data.non_tensor_batch.update(parts["non_tensor_batch"])
    return data


def encode_batches(
    batches: list[tuple[DataProto, DataProto]],
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``[(prompts, generated), ...]`` as ``(tensors, json document)`` (format above).

    Raises:
        TypeError: a value is not data (e.g. an arbitrary object in ``non_tensor_batch``);
            the message says where, e.g. ``batch 0 gen.non_tensor_batch['x'][3]``.
    """
    encode = _Encoder()
    doc = {
        "format": INFLIGHT_FORMAT,
        "batches": [
            {
                "prompts": _encode_proto(encode, prompts, f"batch {i} prompts"),
                "gen": _encode_proto(encode, gen, f"batch {i} gen"),
            }
            for i, (prompts, gen) in enumerate(batches)
        ],
    }
    return encode.tensors, doc


def decode_batches(tensors: dict[str, torch.Tensor], doc: Any) -> list[tuple[DataProto, DataProto]]:
    """The inverse of :func:`encode_batches` (ValueError on a malformed document)."""
    if not isinstance(doc, dict) or doc.get("format") != INFLIGHT_FORMAT:
        raise ValueError(
            f"format {doc.get('format') if isinstance(doc, dict) else doc!r}, "
            f"expected {INFLIGHT_FORMAT}"
        )
    try:
        return [
            (_decode_proto(b["prompts"], tensors), _decode_proto(b["gen"], tensors))
            for b in doc["batches"]
        ]
    except (KeyError, TypeError, IndexError, AttributeError, RecursionError) as err:
        raise ValueError(f"malformed document ({type(err).__name__}: {err})") from err


def write_batch_files(
    directory: Path, batches: list[tuple[DataProto, DataProto]], stem: str = "inflight"
) -> None:
    """Write ``batches`` as ``{stem}.safetensors`` + ``{stem}.json`` in ``directory`` (the
    format above; atomically, each file). Raises TypeError as :func:`encode_batches`."""
    from safetensors.torch import save_file

    tensors, doc = encode_batches(batches)
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_path(directory / f"{stem}.safetensors") as tmp:
        save_file(tensors, str(tmp))
    write_json_atomic(directory / f"{stem}.json", doc)


def read_inflight(directory: Path, stem: str = "inflight") -> list[tuple[DataProto, DataProto]]:
    """The ``[(prompts, generated), ...]`` saved in ``directory`` (no unpickling); ``stem``
    names the files (``{stem}.safetensors``, ``{stem}.json``).

    Raises:
        CheckpointError: the files are missing or malformed, or the directory holds only a
            pickled ``inflight.pt`` (refused without reading it).
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    json_file = directory / f"{stem}.json"
    tensor_file = directory / f"{stem}.safetensors"
    if not json_file.is_file():
        if stem == "inflight" and (directory / LEGACY_INFLIGHT_FILE).exists():
            raise CheckpointError(
                f"refusing to load {directory / LEGACY_INFLIGHT_FILE}: it is a pickle file, "
                "and unpickling a checkpoint file can run any code it carries; this version "
                f"of verl saves the in-flight batches as {INFLIGHT_TENSORS} + {INFLIGHT_JSON}. "
                "Resume from a checkpoint this version wrote, or start fresh "
                "(trainer.resume_mode=disable)"
            )
        raise CheckpointError(f"{json_file} is missing: the {stem} batches are not saved")
    try:
        tensors = load_file(str(tensor_file))
    except (OSError, SafetensorError) as err:
        raise CheckpointError(f"{tensor_file} is unreadable: {err}") from err
    try:
        doc = json.loads(json_file.read_text(encoding="utf-8"))
        return decode_batches(tensors, doc)
    except (OSError, ValueError, RecursionError) as err:
        raise CheckpointError(f"{json_file} is not a valid in-flight batch file: {err}") from err
