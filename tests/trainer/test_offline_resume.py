"""Periodic checkpoints and exact resume of the offline trainers (SFT, DPO, KTO).

N steps straight against N/2 steps, a SIGKILL of the child process that ran them (forked
from a parent that imported the trainers once for the module: ``prewarmed.py``), and an
auto-resume in this process: every logged metric, every weight and optimizer tensor of the
final checkpoint and the exported model equal bit for bit. The same on two FSDP2 ranks (Ray
actors, gloo): both ranks SIGKILLed in step 3, a new group resumes, bit for bit; for SFT the
resumed group is the one the driver's SIGTERM stops after step 3 (its own checkpoint), and a
third group resumes from that, bit for bit (one chain: each group of ranks is two new
processes importing torch). Also: KTO
after an in-process crash, the refusals (another trainer's checkpoint, changed data),
``resume_path`` and retention. The uninterrupted two-rank run of each trainer is trained
once for the module (``two_rank_straight``): the two-rank tests share the session's Ray
cluster, so they run in one worker.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from verl.cli.export import merge_checkpoint
from verl.config import ConfigError, load_dpo_config, load_sft_config, to_yaml
from verl.controller import Dispatch, WorkerDiedError, register
from verl.engine.dcp_io import read_dcp_tensors
from verl.trainer.lifecycle.checkpoint import (
    LATEST_FILE,
    CheckpointError,
    complete_checkpoints,
    read_manifest,
)
from verl.trainer.lifecycle.stopping import RunInterrupted
from verl.trainer.offline.dpo import DPOTrainer
from verl.trainer.offline.launch import (
    OfflineTrainWorker,
    start_rank_group,
    train_on_ranks,
    wait_forwarding_stops,
)
from verl.trainer.offline.sft import SFTTrainer

from .prewarmed import Prewarmed

try:  # the workers of the two-rank test live here: Ray ships their code by value
    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
except ImportError:  # pragma: no cover - the two-rank test needs the ray_session fixture
    pass

TRAINERS = {"sft": (SFTTrainer, load_sft_config), "dpo": (DPOTrainer, load_dpo_config)}

# Four steps with state that carries from step to step: AdamW moments, a cosine schedule
# with warmup, a shuffled loader whose 10 rows in batches of 4 cross an epoch boundary
# mid-stream (the remainder carries over), and validation every 2 steps.
EXACT = (
    "data.arithmetic.train_size=10",
    "data.arithmetic.val_size=4",
    "data.train_batch_size=4",
    "data.micro_batch_size_per_device=2",
    "optim.lr=1e-3",
    "optim.warmup_style=cosine",
    "optim.lr_warmup_steps=1",
    "trainer.total_training_steps=4",
    "trainer.save_freq=2",
    "trainer.test_freq=2",
    "trainer.val_before_train=false",
    "trainer.logger=[jsonl]",
    "trainer.device=cpu",
)


def make_config(kind: str, model_dir: Path, run_dir: Path, *extra: str) -> Any:
    return TRAINERS[kind][1](
        overrides=[
            f"model.path={model_dir}",
            *EXACT,
            f"trainer.num_threads={torch.get_num_threads()}",  # the same float reductions
            f"trainer.default_local_dir={run_dir}",
            f"trainer.log_dir={run_dir}",
            *extra,
        ]
    )


def comparable(metrics: dict[str, Any]) -> dict[str, float]:
    """The metrics that must repeat exactly (wall-clock ones differ from run to run)."""
    return {
        k: float(v)
        for k, v in metrics.items()
        if not k.startswith("timing_s/") and k not in ("train/tokens_per_s", "step", "time")
    }


def assert_same_metrics(got: list[dict], want: list[dict], tol: float = 0.0) -> None:
    assert len(got) == len(want)
    for step, (a, b) in enumerate(zip(got, want), start=1):
        a, b = comparable(a), comparable(b)
        assert a.keys() == b.keys(), f"step {step}: {a.keys() ^ b.keys()}"
        for key in a:
            if tol == 0.0 or math.isnan(b[key]):
                assert a[key] == b[key] or (math.isnan(a[key]) and math.isnan(b[key])), (
                    f"step {step} {key}: {a[key]!r} != {b[key]!r}"
                )
            else:
                assert abs(a[key] - b[key]) <= tol * max(1.0, abs(b[key])), (step, key)


def logged_steps(run_dir: Path) -> list[dict]:
    """The per-step training rows of ``metrics.jsonl`` (validation-only rows left out)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if "train/loss" in row]


def checkpoint_tensors(step_dir: Path) -> dict[str, torch.Tensor]:
    """Weights and optimizer tensors of a single-engine checkpoint."""
    out = {f"model/{k}": t for k, t in load_file(step_dir / "actor" / "model.safetensors").items()}
    optim = torch.load(step_dir / "actor" / "optim_tensors.pt", weights_only=True)
    return out | {f"optim/{k}": t for k, t in optim.items()}


def assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, f"{len(different)} tensors differ, e.g. {different[:3]}"


_CHILD = """
import sys, time
from pathlib import Path

from verl.config import load_dpo_config, load_sft_config
from verl.trainer.offline.dpo import DPOTrainer
from verl.trainer.offline.sft import SFTTrainer
from verl.trainer.lifecycle.stopping import RunInterrupted

kind, marker, config_file = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
cls, load = {"sft": (SFTTrainer, load_sft_config), "dpo": (DPOTrainer, load_dpo_config)}[kind]
trainer = cls(load(config_file))
real_step = trainer.train_step


def train_step(micro_batches):
    # Checkpoint 2 is complete: wait in the middle of step 3 for the SIGKILL.
    if trainer.global_step >= 3:
        marker.touch()
        time.sleep(600)
    return real_step(micro_batches)


trainer.train_step = train_step
trainer.train()
"""


@pytest.fixture(scope="module")
def children(tmp_path_factory):
    """The module's prewarmed parent of the child runs (``prewarmed.py``)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    modules = ("verl.config", "verl.trainer.offline.sft", "verl.trainer.offline.dpo")
    with Prewarmed(modules, env, tmp_path_factory.mktemp("children")) as parent:
        yield parent


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_killed_child_resumes_bit_for_bit(kind, children, tiny_model_dir, tmp_path):
    cls = TRAINERS[kind][0]
    straight_dir, run_dir = tmp_path / "straight", tmp_path / "killed"
    straight = cls(make_config(kind, tiny_model_dir, straight_dir))
    straight_results = straight.train()
    assert [p.name for _, p in complete_checkpoints(straight_dir)] == [
        "global_step_2",
        "global_step_4",
    ]

    cfg = make_config(kind, tiny_model_dir, run_dir)
    (tmp_path / "child.py").write_text(_CHILD)
    (tmp_path / "run.yaml").write_text(to_yaml(cfg))
    marker = tmp_path / "paused"
    child = children.start(
        ["child.py", kind, marker, "run.yaml"], cwd=tmp_path, stderr=tmp_path / "child.err"
    )
    try:
        deadline = time.monotonic() + 180
        while not marker.exists():
            if child.poll() is not None:
                pytest.fail(f"child exited early: {child.stderr_bytes().decode()[-2000:]}")
            assert time.monotonic() < deadline, "the child never reached step 3"
            time.sleep(0.1)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert (run_dir / LATEST_FILE).read_text().strip() == "2"
    assert not (run_dir / "huggingface").exists()

    resumed = cls(cfg)  # trainer.resume_mode=auto
    results = resumed.train()
    assert resumed.resumed_from == run_dir / "global_step_2"
    # Resumed at the epoch boundary (2 batches of 4 per epoch; 2 rows carried over).
    assert [m["train/epoch"] for m in straight.history] == [0, 0, 1, 1]
    # The child logged steps 1-2 (and 3 never finished); the resumed run 3-4, once each.
    rows = logged_steps(run_dir)
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    assert_same_metrics(rows[:2] + resumed.history, straight.history)
    assert_same_metrics(rows, logged_steps(straight_dir))
    assert results["val_after"] == straight_results["val_after"]
    assert_bitwise(
        checkpoint_tensors(run_dir / "global_step_4"),
        checkpoint_tensors(straight_dir / "global_step_4"),
    )
    assert_bitwise(
        load_file(run_dir / "huggingface" / "model.safetensors"),
        load_file(straight_dir / "huggingface" / "model.safetensors"),
    )


class _Crash(Exception):
    """Stands for a crash of the run in the middle of a step."""


@pytest.mark.slow
def test_kto_resumes_after_a_crash(tiny_model_dir, tmp_path):
    kto = ("algorithm.loss_type=kto", "algorithm.beta=0.2")
    straight = DPOTrainer(make_config("dpo", tiny_model_dir, tmp_path / "straight", *kto))
    straight.train()

    cfg = make_config("dpo", tiny_model_dir, tmp_path / "run", *kto)
    first = DPOTrainer(cfg)
    real_step = first.train_step

    def train_step(micro_batches):
        if first.global_step >= 3:
            raise _Crash
        return real_step(micro_batches)

    first.train_step = train_step
    with pytest.raises(_Crash):
        first.train()
    second = DPOTrainer(cfg)
    second.train()
    assert second.resumed_from == tmp_path / "run" / "global_step_2"
    assert "kto/kl" in second.history[0]
    assert_same_metrics(first.history[:2] + second.history, straight.history)
    assert_bitwise(
        checkpoint_tensors(tmp_path / "run" / "global_step_4"),
        checkpoint_tensors(tmp_path / "straight" / "global_step_4"),
    )


def test_refusals_resume_path_and_retention(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    SFTTrainer(
        make_config(
            "sft", tiny_model_dir, run_dir, "trainer.save_freq=1", "trainer.max_ckpt_to_keep=2"
        )
    ).train()
    assert [step for step, _ in complete_checkpoints(run_dir)] == [3, 4]
    manifest = json.loads((run_dir / "global_step_4" / "checkpoint.json").read_text())
    assert manifest["trainer"] == "sft"
    assert manifest["roles"]["actor_rollout_ref"] == {
        "dir": "actor",
        "world_size": 1,
        "strategy": "single",
    }

    # The policy is exported like the RL actor; the last checkpoint is the final model.
    exported = merge_checkpoint(run_dir / "global_step_4", tmp_path / "hf")
    assert_bitwise(
        load_file(exported / "model.safetensors"),
        load_file(run_dir / "huggingface" / "model.safetensors"),
    )

    # Another trainer's checkpoint in the same directory.
    with pytest.raises(CheckpointError, match="saved by the sft trainer, not by the dpo"):
        DPOTrainer(make_config("dpo", tiny_model_dir, run_dir)).train()
    # Other training data behind the saved position.
    with pytest.raises(CheckpointError, match=r"data\.seed: checkpoint 1, now 7"):
        SFTTrainer(make_config("sft", tiny_model_dir, run_dir, "data.seed=7")).train()

    # resume_path: continue from step 3 to a longer run; disable: start fresh.
    longer = SFTTrainer(
        make_config(
            "sft",
            tiny_model_dir,
            tmp_path / "longer",
            "trainer.total_training_steps=5",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={run_dir / 'global_step_3'}",
        )
    )
    longer.train()
    assert longer.resumed_from == run_dir / "global_step_3"
    assert [len(longer.history), longer.global_step] == [2, 5]
    fresh = SFTTrainer(make_config("sft", tiny_model_dir, run_dir, "trainer.resume_mode=disable"))
    fresh.train()
    assert fresh.resumed_from is None and len(fresh.history) == 4


# ---------------------------------------------------------------------- two FSDP2 ranks

TWO_RANKS = ("trainer.n_gpus_per_node=2", "engine.strategy=fsdp2", "trainer.num_threads=1")


class PausingWorker(OfflineTrainWorker):
    """Trains until step 3 starts, then says so (a marker file) and waits to be killed."""

    def __init__(self, kind, config, marker_dir: str) -> None:
        super().__init__(kind, config)
        self.marker_dir = marker_dir

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    def build_trainer(self):
        trainer = super().build_trainer()
        real_step = trainer.train_step

        def train_step(micro_batches):
            if trainer.global_step >= 3:
                Path(self.marker_dir, f"rank{self.rank}").touch()
                time.sleep(600)
            return real_step(micro_batches)

        trainer.train_step = train_step
        return trainer


def sharded_tensors(step_dir: Path) -> dict[str, torch.Tensor]:
    """Full weights and optimizer tensors of a sharded (DCP) checkpoint."""
    dcp_dir = str(step_dir / "actor" / "model_optim")
    model = {f"model/{k}": t for k, t in read_dcp_tensors(dcp_dir, "model").items()}
    optim = {f"optim/{k}": t for k, t in read_dcp_tensors(dcp_dir, "optim").items()}
    assert model and optim
    return model | optim


@pytest.fixture(scope="module")
def two_rank_straight(tiny_model_dir, tmp_path_factory, ray_session):
    """``straight(kind)``: the uninterrupted two-rank run of ``kind`` (``train_on_ranks``'s
    result, its run directory), trained on the first call and kept for the module."""
    runs: dict[str, tuple[dict[str, Any], Path]] = {}

    def straight(kind: str) -> tuple[dict[str, Any], Path]:
        if kind not in runs:
            run_dir = tmp_path_factory.mktemp(f"straight_{kind}")
            cfg = make_config(kind, tiny_model_dir, run_dir, *TWO_RANKS)
            runs[kind] = train_on_ranks(kind, cfg), run_dir
        return runs[kind]

    return straight


def _kill_in_step_3(kind: str, cfg: Any, marker_dir: Path) -> None:
    """Train ``cfg`` on two new ranks until both are in step 3, then SIGKILL both."""
    marker_dir.mkdir()
    group, stop = start_rank_group(kind, cfg, PausingWorker, marker_dir=str(marker_dir))
    try:
        pids = group.pid()
        future = group.submit("train")
        deadline = time.monotonic() + 300
        while not all((marker_dir / f"rank{r}").exists() for r in (0, 1)):
            assert not future.done(), future.result()
            assert time.monotonic() < deadline, "the ranks never reached step 3"
            time.sleep(0.2)
        for pid in reversed(pids):
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerDiedError):
            future.result(timeout=120)
    finally:
        stop()


def _two_ranks_killed_in_step_3(kind: str, two_rank_straight, model_dir: Path, tmp_path: Path):
    """The straight two-rank run of ``kind`` (its checkpoint is a two-rank FSDP2 one), then
    the same config in ``tmp_path / "run"`` killed in step 3 (step 2 the latest checkpoint).
    Returns the straight run, the killed run's directory and its config."""
    straight_run = two_rank_straight(kind)
    manifest = read_manifest(straight_run[1] / "global_step_4", verify=True)
    assert manifest["roles"]["actor_rollout_ref"]["world_size"] == 2
    assert manifest["roles"]["actor_rollout_ref"]["strategy"] == "fsdp2"
    assert "actor/worker_state_rank1.json" in manifest["files"]
    run_dir = tmp_path / "run"
    cfg = make_config(kind, model_dir, run_dir, *TWO_RANKS)
    _kill_in_step_3(kind, cfg, tmp_path / "killed")
    assert (run_dir / LATEST_FILE).read_text().strip() == "2"
    return straight_run, run_dir, cfg


def _assert_resumed_like_straight(
    resumed: dict[str, Any], run_dir: Path, logged_before: int, straight_run: tuple
) -> None:
    """Steps 1-4 logged once each; the first ``logged_before`` rows (the interrupted runs')
    and the resumed run's history, the validation, the final checkpoint and the export equal
    the straight run's bit for bit."""
    straight, straight_dir = straight_run
    rows = logged_steps(run_dir)
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    assert_same_metrics(rows[:logged_before] + resumed["history"], straight["history"])
    assert resumed["val_after"] == straight["val_after"]
    assert_bitwise(
        sharded_tensors(run_dir / "global_step_4"), sharded_tensors(straight_dir / "global_step_4")
    )
    assert_bitwise(
        load_file(run_dir / "huggingface" / "model.safetensors"),
        load_file(straight_dir / "huggingface" / "model.safetensors"),
    )


@pytest.mark.slow
def test_two_fsdp2_ranks_killed_and_resumed_bit_for_bit_dpo(
    ray_session, two_rank_straight, tiny_model_dir, tmp_path
):
    (straight, straight_dir), run_dir, cfg = _two_ranks_killed_in_step_3(
        "dpo", two_rank_straight, tiny_model_dir, tmp_path
    )

    resumed = train_on_ranks("dpo", cfg)  # a new group of new processes; resume_mode=auto
    assert resumed["resumed_from"] == str(run_dir / "global_step_2")
    _assert_resumed_like_straight(resumed, run_dir, 2, (straight, straight_dir))


def test_rank_settings_are_checked_before_anything_runs(tiny_model_dir, tmp_path, caplog):
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError) as err:
        make_config("sft", tiny_model_dir, run_dir, "trainer.n_gpus_per_node=2")
    assert "engine.strategy=fsdp2 (or auto)" in str(err.value)
    with pytest.raises(ConfigError, match="3 micro-batches per step, which"):
        make_config(
            "dpo",
            tiny_model_dir,
            run_dir,
            "trainer.n_gpus_per_node=2",
            "engine.strategy=auto",
            "data.train_batch_size=6",
        )
    # two nodes of one rank each count as two ranks
    with pytest.raises(ConfigError) as err:
        make_config("sft", tiny_model_dir, run_dir, "trainer.nnodes=2")
    assert "trainer.nnodes=2 x trainer.n_gpus_per_node=1 = 2: the single engine" in str(err.value)
    with pytest.raises(ConfigError, match=r"3 micro-batches per step, which trainer\.nnodes=2 x"):
        make_config(
            "dpo",
            tiny_model_dir,
            run_dir,
            "trainer.nnodes=2",
            "engine.strategy=auto",
            "data.train_batch_size=6",
        )
    # A valid two-rank config, built in one process: the ranks are started elsewhere.
    cfg = make_config("sft", tiny_model_dir, run_dir, *TWO_RANKS)
    with pytest.raises(ValueError, match=r"verl\.trainer\.offline\.launch\.train_on_ranks"):
        SFTTrainer(cfg)
    # fsdp2 on one rank without a process group shards nothing: one process's training
    cfg = make_config("sft", tiny_model_dir, run_dir, "engine.strategy=fsdp2")
    with caplog.at_level(logging.WARNING):
        trainer = SFTTrainer(cfg)
    assert "engine.strategy=fsdp2 on one rank trains as engine.strategy=single" in caplog.text
    trainer.close()


def test_sigterm_stops_after_the_step_with_a_checkpoint_and_resumes(tiny_model_dir, tmp_path):
    straight = SFTTrainer(make_config("sft", tiny_model_dir, tmp_path / "straight"))
    straight.train()
    cfg = make_config("sft", tiny_model_dir, tmp_path / "run", "trainer.save_freq=4")
    first = SFTTrainer(cfg)
    real_step = first.train_step
    handler_before = signal.getsignal(signal.SIGTERM)

    def train_step(micro_batches):
        if first.global_step == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives in the middle of step 1
        return real_step(micro_batches)

    first.train_step = train_step
    with pytest.raises(RunInterrupted) as stopped:
        first.train()
    assert stopped.value.exit_code == 143 and stopped.value.step == 1
    assert stopped.value.checkpoint == tmp_path / "run" / "global_step_1"
    assert not (tmp_path / "run" / "huggingface").exists()
    assert signal.getsignal(signal.SIGTERM) is handler_before  # the run's handler is gone

    second = SFTTrainer(cfg)
    second.train()
    assert second.resumed_from == tmp_path / "run" / "global_step_1"
    assert_same_metrics(first.history + second.history, straight.history)


class StopWaitingWorker(OfflineTrainWorker):
    """At the start of step 3 (after step 2 is done): says so (a marker file) and waits for
    the driver's forwarded stop request before it trains that step."""

    def __init__(self, kind, config, marker_dir: str) -> None:
        super().__init__(kind, config)
        self.marker_dir = marker_dir

    def build_trainer(self):
        trainer = super().build_trainer()
        real_step = trainer.train_step

        def train_step(micro_batches):
            if trainer.global_step == 3:
                Path(self.marker_dir, f"rank{self.rank}").touch()
                deadline = time.monotonic() + 120
                while self.stop_signum is None and time.monotonic() < deadline:
                    time.sleep(0.05)
            return real_step(micro_batches)

        trainer.train_step = train_step
        return trainer


@pytest.mark.slow
def test_two_fsdp2_ranks_killed_then_stopped_by_the_drivers_sigterm_and_resumed_sft(
    ray_session, two_rank_straight, tiny_model_dir, tmp_path
):
    """SIGKILL of both ranks in step 3; a new group resumes from step 2 and the driver's
    SIGTERM, forwarded, stops it after step 3 with its own checkpoint (save_freq=2 would not
    save step 3); a third group resumes from that to the end: bit for bit the straight run.
    Then the two-rank checkpoint loads in one process."""
    (straight, straight_dir), run_dir, cfg = _two_ranks_killed_in_step_3(
        "sft", two_rank_straight, tiny_model_dir, tmp_path
    )
    assert [row["step"] for row in logged_steps(run_dir)] == [1, 2]

    marker_dir = tmp_path / "stopping"
    marker_dir.mkdir()
    handler_before = signal.getsignal(signal.SIGTERM)
    group, stop = start_rank_group("sft", cfg, StopWaitingWorker, marker_dir=str(marker_dir))
    try:
        future = group.submit("train")
        deadline = time.monotonic() + 300
        while not all((marker_dir / f"rank{r}").exists() for r in (0, 1)):
            assert not future.done(), future.result()
            assert time.monotonic() < deadline, "the ranks never reached step 3"
            time.sleep(0.1)
        # A real signal to this process: the handler runs in the main thread, which waits on
        # the ranks in wait_forwarding_stops; it forwards the request to both ranks.
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
        results = wait_forwarding_stops(group, future)
    finally:
        stop()
    assert signal.getsignal(signal.SIGTERM) is handler_before
    # the ranks finished step 3 (it had begun), agreed to stop, saved, and returned
    assert results["stopped"] == (signal.SIGTERM, 3, str(run_dir / "global_step_3"))
    assert [step for step, _ in complete_checkpoints(run_dir)] == [2, 3]
    assert (run_dir / LATEST_FILE).read_text().strip() == "3"
    assert not (run_dir / "huggingface").exists()
    assert [row["step"] for row in logged_steps(run_dir)] == [1, 2, 3]  # resumed from step 2

    resumed = train_on_ranks("sft", cfg)  # a third group of new processes
    assert resumed["resumed_from"] == str(run_dir / "global_step_3")
    _assert_resumed_like_straight(resumed, run_dir, 3, (straight, straight_dir))

    # The two-rank checkpoint in one process (single engine): DCP re-shards to full tensors.
    one = SFTTrainer(
        make_config(
            "sft",
            tiny_model_dir,
            tmp_path / "one",
            "trainer.total_training_steps=5",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={run_dir / 'global_step_4'}",
        )
    )
    one.resume()
    exported = load_file(run_dir / "huggingface" / "model.safetensors")
    loaded = one.engine.state_dict_for_save()
    assert exported.keys() <= loaded.keys()
    assert all(torch.equal(loaded[k], exported[k]) for k in exported)
    one.train()
    assert [one.global_step, len(one.history)] == [5, 1]
    assert math.isfinite(one.history[0]["train/loss"])
