"""Checkpoint files that are hostile or damaged, and the run's own files in odd places.

- the async rollout's in-flight batches are data (safetensors + tagged JSON): every value
  type comes back as itself, a value that is not data is refused at save time naming where
  it is, and a pickled ``inflight.pt`` planted in a real checkpoint (its manifest fixed) is
  refused on resume without running its payload;
- the run lock never follows a planted symlink and refuses a lock path that is a directory;
- a truncated model or checkpoint weights file is an error naming it, not the reader's.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.lifecycle.checkpoint import MANIFEST_FILE, CheckpointError, _crc32, _file_sizes
from verl.trainer.lifecycle.run_lock import LOCK_FILE, RunLock, RunLockError
from verl.trainer.rl.inflight_files import (
    INFLIGHT_JSON,
    INFLIGHT_TENSORS,
    decode_batches,
    encode_batches,
    read_inflight,
)
from verl.trainer.rl.trainer import RLTrainer

ASYNC = ("trainer.async_rollout=true", "actor_rollout_ref.actor.rollout_is_threshold=2.0")


def _objects(*values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _same(a, b) -> bool:
    """Equal values of the same types, recursively (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype == object:
            return all(_same(x, y) for x, y in zip(a.ravel(), b.ravel()))
        return a.tobytes() == b.tobytes()
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, dict):
        return (
            list(a) == list(b)
            and all(_same(x, y) for x, y in zip(a, b))
            and all(_same(a[k], b[k]) for k in a)
        )
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and a != a:
        return b != b
    return a == b


def test_inflight_values_come_back_as_the_same_types(tmp_path):
    prompts = DataProto.from_dict(
        tensors={
            "input_ids": torch.arange(12).reshape(3, 4),
            "mask": torch.tensor([[True, False]] * 3),
            "bf16": torch.randn(3, 2).to(torch.bfloat16),
            "view": torch.arange(30.0).reshape(3, 10)[:, ::3],  # not contiguous
        },
        non_tensors={
            "uid": ["a", "b", "c"],
            "messages": [[{"role": "user", "content": "hi"}], [], [{"k": (1, 2.5)}]],
            "scalars": _objects(np.int64(3), np.float32(0.1), np.bool_(True)),
            "mixed": _objects(None, float("nan"), -0.0),
            "arrays": _objects(np.arange(3, dtype=np.int16), np.array(["x", "yz"]), b"\x00\xff"),
            "keys": _objects({1: "int key", (2, 3): "tuple key"}, {"s"}, frozenset({4})),
            "big": [2**80, -(2**70), 1e308],
        },
        meta_info={"seed": 7, "temperature": 0.7, "t": torch.tensor([1.5]), "inf": float("inf")},
    )
    gen = prompts.union(
        DataProto.from_dict(tensors={"responses": torch.ones(3, 2, dtype=torch.int32)})
    )
    gen.non_tensor_batch["numeric"] = np.array([1, 2, 3])  # assigned directly: not object
    tensors, doc = encode_batches([(prompts, gen)])
    json.dumps(doc)  # plain JSON

    from safetensors.torch import load_file, save_file

    save_file(tensors, tmp_path / INFLIGHT_TENSORS)
    (tmp_path / INFLIGHT_JSON).write_text(json.dumps(doc))
    [(p2, g2)] = read_inflight(tmp_path)
    for want, got in ((prompts, p2), (gen, g2)):
        assert _same(dict(got.batch), dict(want.batch))
        assert _same(dict(got.non_tensor_batch), dict(want.non_tensor_batch))
        assert _same(got.meta_info, want.meta_info)
    assert decode_batches(load_file(tmp_path / INFLIGHT_TENSORS), doc)[0][0].equals(prompts)


def test_a_value_that_is_not_data_is_refused_at_save_naming_it():
    class Custom:
        pass

    data = DataProto.from_dict(tensors={"x": torch.zeros(2)}, non_tensors={"obj": [1, Custom()]})
    with pytest.raises(
        TypeError, match=r"batch 0 prompts\.non_tensor_batch\['obj'\]\[1\] is a .*Custom"
    ):
        encode_batches([(data, data)])


@pytest.mark.parametrize(
    "doc",
    [
        {"format": 99, "batches": []},
        {"format": 1, "batches": [{"prompts": {"batch": {"eval": "x"}}}]},
        {"format": 1, "batches": [{"prompts": {"batch": {"tensor": "missing"}}}]},
        {
            "format": 1,
            "batches": [{"prompts": {"batch": [], "non_tensor_batch": [], "meta_info": []}}],
        },
        {
            "format": 1,
            "batches": [
                {
                    "prompts": {
                        "batch": {"dict": []},
                        "non_tensor_batch": {
                            "dict": [["a", {"ndarray": {"dtype": "|O", "shape": [1], "data": ""}}]]
                        },
                        "meta_info": {"dict": []},
                    }
                }
            ],
        },
    ],
    ids=["format", "unknown-tag", "missing-tensor", "not-dicts", "object-dtype"],
)
def test_malformed_inflight_json_is_a_checkpoint_error(tmp_path, doc):
    from safetensors.torch import save_file

    save_file({}, tmp_path / INFLIGHT_TENSORS)
    (tmp_path / INFLIGHT_JSON).write_text(json.dumps(doc))
    with pytest.raises(
        CheckpointError, match=r"inflight\.json is not a valid in-flight batch file"
    ):
        read_inflight(tmp_path)


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_planted_pickle_in_a_real_async_checkpoint_is_refused_on_resume(rl_config, tmp_path):
    """The crafted ``inflight.pt`` replaces the saved batches and the manifest is fixed to
    match (sizes and CRC-32): resume refuses it, naming the file, and nothing runs."""
    first = RLTrainer(rl_config(*ASYNC, "trainer.save_freq=2"))
    first.fit()
    step_dir = tmp_path / "global_step_2"
    inflight = step_dir / "async_rollout"
    for name in (INFLIGHT_JSON, INFLIGHT_TENSORS):
        (inflight / name).unlink()
    marker = tmp_path / "payload_ran"
    torch.save([{"prompts": _Payload(marker), "gen": None}], inflight / "inflight.pt")
    manifest = json.loads((step_dir / MANIFEST_FILE).read_text())
    files = {k: v for k, v in _file_sizes(step_dir).items() if k != MANIFEST_FILE}
    manifest["files"] = files
    manifest["crc32"] = {name: _crc32(step_dir / name) for name in files}
    (step_dir / MANIFEST_FILE).write_text(json.dumps(manifest))

    second = RLTrainer(rl_config(*ASYNC, "trainer.total_training_steps=3"))
    try:
        with pytest.raises(
            CheckpointError, match=r"refusing to load .*inflight\.pt: it is a pickle"
        ):
            second.fit()
    finally:
        second.close()
    assert not marker.exists()


# ---------------------------------------------------------------------- the run lock


def test_run_lock_does_not_follow_a_planted_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious contents\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.symlink(victim, run_dir / LOCK_FILE)
    lock = RunLock([run_dir])
    with pytest.raises(RunLockError, match=rf"{LOCK_FILE} is a symbolic link"):
        lock.acquire()
    with pytest.raises(RunLockError, match=str(run_dir / LOCK_FILE)):
        lock.check()
    assert victim.read_text() == "precious contents\n"
    assert not lock.held
    # a dangling link is no better: nothing is created where it points
    (run_dir / LOCK_FILE).unlink()
    os.symlink(tmp_path / "elsewhere", run_dir / LOCK_FILE)
    with pytest.raises(RunLockError, match="symbolic link"):
        RunLock([run_dir]).acquire()
    assert not (tmp_path / "elsewhere").exists()


def test_run_lock_refuses_a_directory_or_a_fifo(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / LOCK_FILE).mkdir()
    with pytest.raises(RunLockError, match=r"\.verl-run\.lock is a directory"):
        RunLock([tmp_path / "a"]).acquire()
    (tmp_path / "b").mkdir()
    os.mkfifo(tmp_path / "b" / LOCK_FILE)
    with pytest.raises(RunLockError, match="not a regular file"):
        RunLock([tmp_path / "b"]).acquire()


def test_a_run_on_a_directory_with_a_planted_lock_symlink_is_refused(rl_config, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    os.symlink(victim, tmp_path / LOCK_FILE)
    with pytest.raises(RunLockError, match="symbolic link"):
        RLTrainer(rl_config())
    assert victim.read_text() == "keep me"


# ---------------------------------------------------------------------- truncated weights


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_a_truncated_model_is_a_message_naming_the_file(rl_config, tiny_model_dir, tmp_path):
    model = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    _truncate(model / "model.safetensors")
    with pytest.raises(
        ValueError, match=r"model weights '.*model\.safetensors' are not a readable"
    ):
        RLTrainer(rl_config(f"actor_rollout_ref.model.path={model}"))


def test_a_truncated_checkpoint_file_is_a_checkpoint_error(rl_config, tmp_path):
    """Truncated with its manifest made to match (the size check cannot see it): the
    engine's reader error becomes a CheckpointError naming the role's directory."""
    RLTrainer(rl_config("trainer.save_freq=2")).fit()
    step_dir = tmp_path / "global_step_2"
    weights = step_dir / "actor" / "model.safetensors"
    _truncate(weights)
    manifest = json.loads((step_dir / MANIFEST_FILE).read_text())
    manifest["files"]["actor/model.safetensors"] = weights.stat().st_size
    manifest["crc32"]["actor/model.safetensors"] = _crc32(weights)
    (step_dir / MANIFEST_FILE).write_text(json.dumps(manifest))
    second = RLTrainer(rl_config("trainer.total_training_steps=3"))
    try:
        with pytest.raises(
            CheckpointError, match=r"the actor_rollout_ref files under .*actor cannot be read"
        ):
            second.fit()
    finally:
        second.close()
