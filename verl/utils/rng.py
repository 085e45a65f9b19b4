"""The global random-number generators of one process, as JSON-able state.

A resumed run must draw the same random numbers the uninterrupted run would have drawn
after the checkpoint: the native rollout samples from torch's global generator when
``rollout.seed`` is null, dropout draws from it in training, and user code may use
NumPy's or Python's. :func:`rng_state` captures all of them (torch CPU, every CUDA device,
NumPy's legacy global ``RandomState``, Python's ``random``) as plain JSON values, so a
checkpoint never needs pickle for them; :func:`set_rng_state` puts them back.
:func:`preserved_rng` runs a block (e.g. writing a checkpoint) without moving any of them.
:func:`seed_all` seeds all of them, as every worker process does from ``trainer.seed`` and
its rank (a Ray actor process otherwise starts from a random torch seed, and a run would not
repeat).
"""

from __future__ import annotations

import base64
import contextlib
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

__all__ = ["preserved_rng", "rng_state", "seed_all", "set_rng_state"]


def _bytes_tensor_to_text(state: torch.Tensor) -> str:
    return base64.b64encode(state.cpu().numpy().tobytes()).decode("ascii")


def _text_to_bytes_tensor(text: str) -> torch.Tensor:
    raw = np.frombuffer(base64.b64decode(text.encode("ascii")), dtype=np.uint8).copy()
    return torch.from_numpy(raw)


def seed_all(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CPU and every CUDA device) global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """The state of every global generator of this process, as JSON-able values."""
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "torch_cpu": _bytes_tensor_to_text(torch.get_rng_state()),
        "numpy": {
            "kind": kind,
            "keys": keys.tolist(),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "torch_cuda": [],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = [_bytes_tensor_to_text(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned (CUDA only when this process has as many
    initialised devices as were saved)."""
    torch.set_rng_state(_text_to_bytes_tensor(state["torch_cpu"]))
    n = state["numpy"]
    np.random.set_state(
        (
            n["kind"],
            np.asarray(n["keys"], dtype=np.uint32),
            n["pos"],
            n["has_gauss"],
            n["cached_gaussian"],
        )
    )
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss_next"]))
    cuda = state.get("torch_cuda") or []
    if cuda and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all([_text_to_bytes_tensor(s) for s in cuda])


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Run the block, then put every global generator back where it was.

    Used around checkpoint writes, so that saving (or not saving) a checkpoint never changes
    which random numbers the run draws next.
    """
    saved = rng_state()
    try:
        yield
    finally:
        set_rng_state(saved)
