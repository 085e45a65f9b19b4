"""Helpers for tests that compare whole runs: the tensors of a checkpoint, bitwise tensor
equality, and metric histories that must repeat exactly (wall-clock metrics and the
streaming buffer's progress snapshots left out).

Used by the project's own resume and chaos tests; usable by anyone checking that their
run resumes exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

# How far the rollout thread got when a streaming step took its batch (prompts still queued,
# finished groups waiting in the buffer): thread timing, not the run's data, sets these; the
# samples, versions and updates do not depend on them.
PROGRESS_SNAPSHOTS = frozenset({"stream/queued_prompts", "stream/buffered_groups"})


def comparable_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics of a step that must repeat exactly (timings, throughput and the streaming
    buffer's progress snapshots differ)."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if not k.startswith("timing_s/")
        and k != "perf/throughput_tokens_per_s"
        and k not in PROGRESS_SNAPSHOTS
    }


def assert_same_metrics(
    got: Sequence[Mapping[str, Any]], want: Sequence[Mapping[str, Any]], tol: float = 0.0
) -> None:
    """Step by step, the same metric names and values (NaN equals NaN; ``tol`` relative)."""
    assert len(got) == len(want), f"{len(got)} steps vs {len(want)}"
    for step, (a, b) in enumerate(zip(got, want), start=1):
        a, b = comparable_metrics(a), comparable_metrics(b)
        assert a.keys() == b.keys(), f"step {step}: {a.keys() ^ b.keys()}"
        for key in a:
            if math.isnan(b[key]):
                assert math.isnan(a[key]), f"step {step} {key}: {a[key]} vs nan"
            elif tol == 0.0:
                assert a[key] == b[key], f"step {step} {key}: {a[key]!r} != {b[key]!r}"
            else:
                assert abs(a[key] - b[key]) <= tol * max(1.0, abs(b[key])), (step, key)


def checkpoint_tensors(step_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint: weights and optimizer state, all roles.

    A single-engine role has ``model.safetensors`` and ``optim_tensors.pt``; an FSDP2 role
    (several ranks) has a ``torch.distributed.checkpoint`` directory ``model_optim/``, read
    here as full (unsharded) tensors, names as the checkpoint keeps them.
    """
    step_dir = Path(step_dir)
    out = {}
    for role in ("actor", "critic"):
        role_dir = step_dir / role
        if not role_dir.is_dir():
            continue
        if (role_dir / "model_optim").is_dir():
            out |= {f"{role}/{k}": t for k, t in _dcp_tensors(role_dir / "model_optim").items()}
            continue
        for name, t in load_file(role_dir / "model.safetensors").items():
            out[f"{role}/model/{name}"] = t
        optim = torch.load(role_dir / "optim_tensors.pt", weights_only=True)
        out |= {f"{role}/optim/{name}": t for name, t in optim.items()}
    return out


def _dcp_tensors(dcp_dir: Path) -> dict[str, torch.Tensor]:
    """The tensors of a distributed checkpoint as ``{top-level key}/{flattened name}``
    (``model/lm_head.weight``, ``optim/state.model.lm_head.weight.exp_avg``), read through
    :mod:`verl.engine.dcp_io`'s restricted loaders (nothing is unpickled freely)."""
    from verl.engine.dcp_io import dcp_tensor_keys, read_dcp_tensors

    prefixes = sorted({key.split(".", 1)[0] for key in dcp_tensor_keys(str(dcp_dir))})
    out: dict[str, torch.Tensor] = {}
    for prefix in prefixes:
        tensors = read_dcp_tensors(str(dcp_dir), prefix)
        out |= {f"{prefix}/{name}": t for name, t in tensors.items()}
    return out


def assert_bitwise(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> None:
    """The same names, and every tensor equal bit for bit."""
    assert a.keys() == b.keys(), f"names differ: {sorted(a.keys() ^ b.keys())[:5]}"
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"
