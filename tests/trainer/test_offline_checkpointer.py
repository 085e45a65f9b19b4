"""The offline trainers checkpoint through the RL trainer's ``RunCheckpointer``.

A checkpoint in the layout the offline trainers have always written (``actor/``,
``trainer_state.json`` with the step, data position and RNG, ``config.yaml``, a manifest naming
the trainer), its state and manifest written here field by field, resumes bit for bit and
exports; the ranks of a collective save (threads standing in for processes) write one
checkpoint together, and a shard that fails on any rank fails the save on every rank, with
nothing published; a checkpoint of another trainer is refused.
"""

from __future__ import annotations

import errno
import json
import shutil
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from verl.cli.export import merge_checkpoint
from verl.config import load_sft_config
from verl.trainer.lifecycle.checkpoint import LATEST_FILE, CheckpointError, CheckpointManager
from verl.trainer.lifecycle.resume import RoleSettings, RunCheckpointer
from verl.trainer.offline.checkpoint import OFFLINE_IDENTITY_KEYS, POLICY_ROLE, LocalEngineRole
from verl.trainer.offline.sft import SFTTrainer

STEPS = (
    "data.arithmetic.train_size=10",
    "data.arithmetic.val_size=4",
    "data.train_batch_size=4",
    "data.micro_batch_size_per_device=2",
    "optim.lr=1e-3",
    "optim.warmup_style=cosine",
    "optim.lr_warmup_steps=1",
    "trainer.total_training_steps=4",
    "trainer.save_freq=2",
    "trainer.test_freq=-1",
    "trainer.val_before_train=false",
    "trainer.logger=[jsonl]",
    "trainer.device=cpu",
)


def sft_config(model_dir: Path, run_dir: Path, *extra: str) -> Any:
    return load_sft_config(
        overrides=[
            f"model.path={model_dir}",
            *STEPS,
            f"trainer.num_threads={torch.get_num_threads()}",
            f"trainer.default_local_dir={run_dir}",
            f"trainer.log_dir={run_dir}",
            *extra,
        ]
    )


def write_old_manifest(step_dir: Path, step: int, kind: str, world_size: int, strategy: str):
    """``checkpoint.json`` as the offline trainers wrote it: their fields, every file with
    its size and CRC-32."""
    files = {
        p.relative_to(step_dir).as_posix(): p.stat().st_size
        for p in sorted(step_dir.rglob("*"))
        if p.is_file()
    }
    crc = {name: f"{zlib.crc32((step_dir / name).read_bytes()):08x}" for name in files}
    manifest = {
        "format_version": 1,
        "global_step": step,
        "saved_at": "2000-01-01T00:00:00+0000",
        "trainer": kind,
        "roles": {
            "actor_rollout_ref": {"dir": "actor", "world_size": world_size, "strategy": strategy}
        },
        "total_bytes": sum(files.values()),
        "files": files,
        "crc32": crc,
    }
    (step_dir / "checkpoint.json").write_text(json.dumps(manifest))


@pytest.mark.slow
def test_a_checkpoint_in_the_offline_layout_resumes_bit_for_bit_and_exports(
    tiny_model_dir, tmp_path
):
    straight_dir = tmp_path / "straight"
    straight = SFTTrainer(sft_config(tiny_model_dir, straight_dir))
    straight.train()
    written = straight_dir / "global_step_2"
    # What the checkpointer writes is the layout the offline trainers always wrote.
    state = json.loads((written / "trainer_state.json").read_text())
    assert list(state) == [
        "format_version",
        "trainer",
        "global_step",
        "total_steps",
        "epoch",
        "dataloader",
        "rng",
    ]
    assert [state["trainer"], state["global_step"], state["total_steps"]] == ["sft", 2, 4]
    manifest = json.loads((written / "checkpoint.json").read_text())
    assert manifest["trainer"] == "sft"
    assert manifest["roles"] == {
        "actor_rollout_ref": {"dir": "actor", "world_size": 1, "strategy": "single"}
    }
    assert {n.split("/")[0] for n in manifest["files"]} == {
        "actor",
        "trainer_state.json",
        "config.yaml",
    }

    # The fixture: the engine's files (the engine's own format) and the config, with the
    # trainer state and the manifest written here in the old writer's form.
    old = tmp_path / "old" / "global_step_2"
    old.mkdir(parents=True)
    shutil.copytree(written / "actor", old / "actor")
    shutil.copy(written / "config.yaml", old / "config.yaml")
    sampler = state["dataloader"]["sampler"]
    old_state = {
        "format_version": 1,
        "trainer": "sft",
        "global_step": 2,
        "total_steps": 4,
        "epoch": sampler["epoch"],
        "dataloader": {"sampler": dict(sampler)},
        "rng": state["rng"],
    }
    (old / "trainer_state.json").write_text(json.dumps(old_state))
    write_old_manifest(old, 2, "sft", 1, "single")

    run_dir = tmp_path / "run"
    resumed = SFTTrainer(
        sft_config(
            tiny_model_dir,
            run_dir,
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={old}",
        )
    )
    resumed.train()
    assert resumed.resumed_from == old
    assert [m["train/loss"] for m in resumed.history] == [
        m["train/loss"] for m in straight.history[2:]
    ]
    for name in ("global_step_4/actor/model.safetensors", "huggingface/model.safetensors"):
        a, b = load_file(run_dir / name), load_file(straight_dir / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    optim = "global_step_4/actor/optim_tensors.pt"
    a = torch.load(run_dir / optim, weights_only=True)
    b = torch.load(straight_dir / optim, weights_only=True)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # python -m verl.model_merger exports it: the weights of the checkpoint it copies.
    a = load_file(merge_checkpoint(old, tmp_path / "hf_old") / "model.safetensors")
    b = load_file(merge_checkpoint(written, tmp_path / "hf") / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------------- ranks together


class ThreadRanks:
    """The collectives of the offline trainer's ranks, for threads of one process; a
    protocol mismatch breaks the barrier (an error, not a hang)."""

    def __init__(self, rank: int, shared: dict[str, Any]) -> None:
        self.rank, self.world_size, self.shared = rank, 2, shared

    def broadcast(self, obj: Any) -> Any:
        if self.rank == 0:
            self.shared["value"] = obj
        self.shared["barrier"].wait()
        value = self.shared["value"]
        self.shared["barrier"].wait()
        return value

    def all_gather(self, obj: Any) -> list[Any]:
        self.shared["box"][self.rank] = obj
        self.shared["barrier"].wait()
        out = list(self.shared["box"])
        self.shared["barrier"].wait()
        return out


class ShardEngine:
    """An engine whose checkpoint is one file per rank (its write fails if told)."""

    module = torch.nn.Linear(1, 1)  # no HF config: only the shards are written

    def __init__(self, rank: int, fail: bool = False) -> None:
        self.rank, self.fail, self.loaded = rank, fail, []

    def save_checkpoint(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        time.sleep(0.05 * self.rank)  # rank 1 finishes last
        if self.fail:
            raise OSError(errno.EACCES, "Permission denied", path)
        (Path(path) / f"shard_rank{self.rank}.bin").write_bytes(bytes([self.rank]) * 8)

    def load_checkpoint(self, path: str) -> None:
        self.loaded.append((Path(path) / f"shard_rank{self.rank}.bin").read_bytes())


class Progress:
    def __init__(self, step: int = 0, fail: bool = False) -> None:
        self.global_step, self.fail = step, fail

    def state_dict(self) -> dict[str, Any]:
        if self.fail:
            raise RuntimeError("state unavailable")
        return {"global_step": self.global_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step = state["global_step"]


def rank_checkpointers(cfg, root: Path, *, kind="sft", fail_rank=None, progress_fails=False):
    shared = {"barrier": threading.Barrier(2, timeout=20), "box": [None, None], "value": None}
    out = []
    for rank in (0, 1):
        engine = ShardEngine(rank, fail=rank == fail_rank)
        out.append(
            RunCheckpointer(
                cfg,
                CheckpointManager(root),
                progress=Progress(3, fail=progress_fails and rank == 0),
                components={},
                roles={POLICY_ROLE: LocalEngineRole(engine, None, rank=rank, world_size=2)},
                role_settings={POLICY_ROLE: RoleSettings("fsdp2", "engine.strategy")},
                kind=kind,
                identity_keys=OFFLINE_IDENTITY_KEYS,
                drivers=ThreadRanks(rank, shared),
            )
        )
    return out


def on_both_ranks(fn, checkpointers) -> list[Any]:
    """``fn(checkpointer)`` on two threads at once: each rank's result or exception."""
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(fn, c) for c in checkpointers]
        return [f.exception(timeout=60) or f.result() for f in futures]


def test_ranks_save_one_checkpoint_together_and_a_failed_shard_fails_every_rank(
    tiny_model_dir, tmp_path
):
    cfg = sft_config(tiny_model_dir, tmp_path / "cfg")
    root = tmp_path / "ckpt"
    saved = on_both_ranks(lambda c: c.save(3), rank_checkpointers(cfg, root))
    assert saved == [root / "global_step_3"] * 2
    manifest = json.loads((root / "global_step_3" / "checkpoint.json").read_text())
    assert manifest["trainer"] == "sft"
    assert manifest["roles"][POLICY_ROLE] == {"dir": "actor", "world_size": 2, "strategy": "fsdp2"}
    assert set(manifest["files"]) == {
        "actor/shard_rank0.bin",
        "actor/shard_rank1.bin",
        "actor/worker_state_rank0.json",
        "actor/worker_state_rank1.json",
        "trainer_state.json",
        "config.yaml",
    }

    # Every rank loads its own shard and the progress.
    loaders = rank_checkpointers(cfg, root)
    for c in loaders:
        c.progress.global_step = 0
    on_both_ranks(lambda c: c.load(root / "global_step_3"), loaders)
    assert [c.progress.global_step for c in loaders] == [3, 3]
    assert [c.roles[POLICY_ROLE].engine.loaded for c in loaders] == [[b"\0" * 8], [b"\1" * 8]]

    # Rank 1's shard fails: both ranks raise, nothing is published.
    failing = rank_checkpointers(cfg, root, fail_rank=1)
    rank0, rank1 = on_both_ranks(lambda c: c.save(5), failing)
    assert isinstance(rank0, CheckpointError)
    assert "failed on another rank (rank 1: PermissionError: [Errno 13] Permission denied" in str(
        rank0
    )
    assert isinstance(rank1, PermissionError)
    assert sorted(p.name for p in root.iterdir()) == ["global_step_3", LATEST_FILE]
    assert (root / LATEST_FILE).read_text().strip() == "3"

    # Rank 0 fails before the shards are written: rank 1 is told and writes nothing.
    rank0, rank1 = on_both_ranks(
        lambda c: c.save(6), rank_checkpointers(cfg, root, progress_fails=True)
    )
    assert isinstance(rank0, CheckpointError) and "state unavailable" in str(rank0)
    assert isinstance(rank1, CheckpointError)
    assert "rank 0 failed to save checkpoint 6" in str(rank1)
    assert sorted(p.name for p in root.iterdir()) == ["global_step_3", LATEST_FILE]


def test_a_checkpoint_of_another_trainer_is_refused(tiny_model_dir, tmp_path):
    cfg = sft_config(tiny_model_dir, tmp_path / "cfg")
    root = tmp_path / "ckpt"
    on_both_ranks(lambda c: c.save(3), rank_checkpointers(cfg, root))
    for kind, words in (
        ("dpo", "the sft trainer, not by the dpo trainer"),
        (None, "the sft trainer, not by the RL trainer"),
    ):
        c = rank_checkpointers(cfg, root, kind=kind)[0]
        with pytest.raises(CheckpointError, match=words):
            c.load(root / "global_step_3")
