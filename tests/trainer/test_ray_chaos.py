"""Chaos on Ray: a GRPO run on two FSDP2 ranks (``trainer.backend=ray``, ``save_freq=1``),
run as a child driver, SIGKILLed mid-call and resumed each time (issue 20, item 9).

A kill lands while the ranks run a call: the child driver wraps the Ray backend's wait for
a worker call (``RayPending.wait``) and, at the n-th call of the chosen method, either
SIGKILLs itself (the driver) or SIGKILLs rank 1's actor process and then waits (a worker).
Either way the call's work is under way on the ranks when the kill lands.

One run directory takes every kill (``chaos_run``, once for the module): rank 1 killed in
step 2, then the driver killed three times, each run resuming after the last, then a run to
the end. After the worker kill the driver fails with ``WorkerDiedError`` naming role and
rank within the documented time; after a driver kill nothing the run started (its local Ray
cluster: GCS, raylet, workers, the watchdog; its reward workers) is alive within the
documented time. After every kill every published checkpoint verifies. At the end the final
checkpoint equals an uninterrupted two-rank run bit for bit and ``metrics.jsonl`` holds one
row per step with the uninterrupted run's values. The two tests assert on that one sequence
(the worker kill's phase, the driver kills' phases; both the end).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from verl.config import load_config, to_yaml
from verl.testing import assert_bitwise, assert_same_metrics, checkpoint_tensors
from verl.trainer.lifecycle.checkpoint import complete_checkpoints, read_manifest
from verl.trainer.rl.trainer import RLTrainer
from verl.utils.lifetime import kill_processes_with_env, processes_with_env

from .conftest import BASE_OVERRIDES
from .prewarmed import Prewarmed

pytestmark = pytest.mark.slow

STEPS = 4
MARK = "VERL_RAY_CHAOS_TEST"
# Documented in docs/reliability.md (Ray, the driver killed mid-step / a worker killed):
GONE_AFTER_DRIVER_KILL_S = 10.0
WORKER_DEATH_REPORTED_S = 15.0

RUN = (
    "trainer.backend=ray",
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=2",
    f"trainer.total_training_steps={STEPS}",
    "trainer.save_freq=1",
    "trainer.val_before_train=false",
    "data.arithmetic.train_size=8",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.optim.warmup_style=cosine",
)

REWARD = (
    "def varied(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return {'score': (len(solution_str) % 5) / 4.0, 'acc': float(len(solution_str) % 2)}\n"
)

# What every child driver imports: its prewarmed parent imports them once.
CHILD_IMPORTS = ("verl.config", "verl.controller.ray_calls", "verl.trainer.rl.trainer")

# argv: config, method, nth, victim ("driver" | "worker" | "none")
CHILD = """
import os, signal, sys, time
from verl.config import load_config
from verl.controller import ray_calls
from verl.trainer.rl import trainer as ppo_trainer

method, nth, victim = sys.argv[2], int(sys.argv[3]), sys.argv[4]
real = ray_calls.RayPending.wait
calls = 0


def wait(self, timeout=None):
    global calls
    if self._method == method:
        calls += 1
        # the call is submitted: the ranks are starting or running it
        if calls == nth and victim == "driver":
            print(f"KILLED {time.time()!r}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if calls == nth and victim == "worker":
            os.kill(self._actors.pids[1], signal.SIGKILL)
            print(f"KILLED {time.time()!r}", file=sys.stderr, flush=True)
    return real(self, timeout)


ray_calls.RayPending.wait = wait
try:
    ppo_trainer.RLTrainer(load_config(sys.argv[1])).fit()
except BaseException:
    print(f"FAILED {time.time()!r}", file=sys.stderr, flush=True)  # after fit's clean-up
    raise
"""


def _config(rl_config, tmp_path: Path, run_dir: Path):
    (tmp_path / "reward.py").write_text(REWARD)
    return rl_config(
        *RUN,
        f"custom_reward_function.path={tmp_path / 'reward.py'}",
        "custom_reward_function.name=varied",
        f"trainer.default_local_dir={run_dir}",
        f"trainer.log_dir={run_dir}",
    )


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def rl_config_module(tiny_model_dir):
    """``make(tmp_path)``: the ``rl_config`` fixture's factory for a directory of the module's
    (the chaos sequence outlives each test's ``tmp_path``)."""

    def make(tmp_path: Path):
        def config(*extra: str):
            return load_config(
                overrides=[
                    f"actor_rollout_ref.model.path={tiny_model_dir}",
                    *BASE_OVERRIDES,
                    f"trainer.default_local_dir={tmp_path}",
                    f"trainer.log_dir={tmp_path}",
                    *extra,
                ]
            )

        return config

    return make


@pytest.fixture(scope="module")
def straight_run(rl_config_module, tmp_path_factory, ray_session) -> tuple[list[dict], Path]:
    """The uninterrupted two-rank run (on the session's cluster, once per module): its
    history and directory."""
    tmp = tmp_path_factory.mktemp("straight")
    trainer = RLTrainer(_config(rl_config_module(tmp), tmp, tmp / "run"))
    try:
        trainer.fit()
    finally:
        trainer.close()  # its reward workers (children of this process) too
    return trainer.history, tmp / "run"


class _Chaos:
    """Child drivers of one run directory, all carrying one env mark, forked from one parent
    that imported the trainer once (``prewarmed.py``; left out of the mark's processes)."""

    def __init__(self, rl_config, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.run_dir = tmp_path / "chaos"
        self.config_file = tmp_path / "chaos.yaml"
        self.config_file.write_text(to_yaml(_config(rl_config, tmp_path, self.run_dir)))
        self.script = tmp_path / "child.py"
        self.script.write_text(CHILD)
        self.mark = uuid.uuid4().hex
        env = {**os.environ, MARK: self.mark}
        env.pop("RAY_ADDRESS", None)  # each child starts (and owns) its local cluster
        self.parent = Prewarmed(CHILD_IMPORTS, env, tmp_path)

    def run(self, method: str, nth: int, victim: str) -> tuple[subprocess.CompletedProcess, float]:
        """The child driver's run: its exit code and stderr, and how long it ran."""
        start = time.monotonic()
        child = self.parent.run(
            [self.script, self.config_file, method, nth, victim],
            cwd=self.tmp_path,
            stderr=self.tmp_path / "driver.err",
            timeout=240,
        )
        child.stderr = child.stderr.decode(errors="replace")
        return child, time.monotonic() - start

    def left_alive_after(self, seconds: float) -> dict[int, str]:
        """What the run started (every process with the mark but the parent) still alive
        after up to ``seconds``; returns as soon as nothing is."""
        deadline = time.monotonic() + seconds
        while True:
            alive = processes_with_env(MARK, self.mark)
            alive.pop(self.parent.pid, None)
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(0.2)

    def check_checkpoints(self) -> None:
        for _, step_dir in complete_checkpoints(self.run_dir):
            read_manifest(step_dir, verify=True)  # raises on a damaged file

    def kill_all(self) -> None:
        self.parent.close()
        kill_processes_with_env(MARK, self.mark)

    def check_final(self, straight_run) -> None:
        history, straight_dir = straight_run
        final = f"global_step_{STEPS}"
        assert_bitwise(
            checkpoint_tensors(self.run_dir / final), checkpoint_tensors(straight_dir / final)
        )
        for rank in (0, 1):  # each rank's random generators and call counters
            name = f"actor/worker_state_rank{rank}.json"
            got = json.loads((self.run_dir / final / name).read_text())
            assert got == json.loads((straight_dir / final / name).read_text()), name
        rows = [r for r in _rows(self.run_dir / "metrics.jsonl") if "actor/pg_loss" in r]
        assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
        strip = {"step", "time"}
        got = [{k: v for k, v in r.items() if k not in strip} for r in rows]
        assert_same_metrics(got, history)


@dataclass
class _Phase:
    """One child driver of the chaos sequence, as the tests read it afterwards."""

    point: str
    child: subprocess.CompletedProcess
    ended: float  # time.time() when the child had exited
    left_alive: dict[int, str]  # what the run started, still alive after the grace time
    gone: float  # time.time() when nothing the run started was alive (or the grace ended)
    checkpoints: list[str]  # the complete checkpoints after it, each verified
    damaged: str | None  # the first checkpoint that did not verify, with the error


# (method waited on, its n-th call in that driver), each run resuming after the last: rank 1
# killed mid-update of step 2 (the step-1 checkpoint stays the newest); then the driver
# killed mid-rollout of step 3 (the resumed run's second rollout), mid-update of the resumed
# step 3 and mid-save of step 4 (the resumed run's second save); a last run trains step 4.
WORKER_KILL = ("update_actor", 2)
DRIVER_KILLS = (("generate_sequences", 2), ("update_actor", 1), ("save_checkpoint", 2))


@pytest.fixture(scope="module")
def chaos_run(rl_config_module, tmp_path_factory, straight_run) -> dict:
    """The whole chaos sequence in one run directory: ``{"worker": _Phase, "drivers":
    [_Phase, ...], "final": _Phase, "final_error": str | None}``; ``final_error`` says how the
    final checkpoint or metrics differ from the uninterrupted run's (None: they equal)."""
    tmp_path = tmp_path_factory.mktemp("chaos")
    chaos = _Chaos(rl_config_module(tmp_path), tmp_path)

    def phase(method: str, nth: int, victim: str) -> _Phase:
        child, _ = chaos.run(method, nth, victim)
        ended = time.time()
        alive = chaos.left_alive_after(GONE_AFTER_DRIVER_KILL_S)
        gone = time.time()
        damaged = None
        try:
            chaos.check_checkpoints()
        except Exception as err:  # read_manifest(verify=True) names the damaged file
            damaged = f"{type(err).__name__}: {err}"
        names = [p.name for _, p in complete_checkpoints(chaos.run_dir)]
        point = f"{victim} killed in {method} call {nth}" if victim != "none" else "last run"
        return _Phase(point, child, ended, alive, gone, names, damaged)

    result: dict = {}
    try:
        result["worker"] = phase(*WORKER_KILL, "worker")
        result["drivers"] = [phase(method, nth, "driver") for method, nth in DRIVER_KILLS]
        result["final"] = phase("none", 0, "none")
    finally:
        chaos.kill_all()
    try:
        chaos.check_final(straight_run)
        result["final_error"] = None
    except Exception as err:  # a differing tensor or row, or a file the runs did not write
        result["final_error"] = f"{type(err).__name__}: {err}"
    return result


def _assert_the_end(chaos_run: dict) -> None:
    final = chaos_run["final"]
    assert final.child.returncode == 0, final.child.stderr[-3000:]
    assert not final.left_alive, f"{final.point}: left alive {final.left_alive}"
    assert final.damaged is None, final.damaged
    assert chaos_run["final_error"] is None, chaos_run["final_error"]


def test_driver_killed_three_times_on_two_ranks_resumes_bit_identical(chaos_run):
    assert len(chaos_run["drivers"]) == len(DRIVER_KILLS)
    for phase in chaos_run["drivers"]:
        child, point = phase.child, phase.point
        assert child.returncode == -signal.SIGKILL, f"{point}: {child.stderr[-3000:]}"
        assert not phase.left_alive, f"{point}: left alive {phase.left_alive}"
        # the run ends when the last process it started is gone
        killed_at = float(re.search(r"KILLED ([0-9.]+)", child.stderr).group(1))
        gone = phase.gone - killed_at
        assert gone < GONE_AFTER_DRIVER_KILL_S, f"{point}: {gone:.1f}s"
        print(f"{point}: everything gone {gone:.2f}s after the kill")
        assert phase.damaged is None, f"{point}: {phase.damaged}"
    _assert_the_end(chaos_run)


def test_killed_rank_fails_the_driver_with_role_and_rank_then_resume_matches(chaos_run):
    phase = chaos_run["worker"]
    child = phase.child
    assert child.returncode not in (0, -signal.SIGKILL), child.stderr[-3000:]
    killed_at = float(re.search(r"KILLED ([0-9.]+)", child.stderr).group(1))
    failed_at = float(re.search(r"FAILED ([0-9.]+)", child.stderr).group(1))
    assert "WorkerDiedError" in child.stderr, child.stderr[-3000:]
    died = re.search(
        r"WorkerDiedError: worker actor_rollout_ref .*? rank 1 died during '(\w+)'",
        child.stderr,
    )
    assert died and died.group(1) == "update_actor", child.stderr[-3000:]
    # fit() has raised and released the workers; the driver's exit then stops its cluster
    reported, gone = failed_at - killed_at, phase.ended - killed_at
    print(f"rank 1 killed: fit() raised {reported:.1f}s later, driver gone {gone:.1f}s")
    assert reported < WORKER_DEATH_REPORTED_S, f"{reported:.1f}s"
    assert not phase.left_alive, f"{phase.point}: left alive {phase.left_alive}"
    assert phase.damaged is None, phase.damaged
    assert phase.checkpoints == ["global_step_1"]
    # the runs after it resumed from that checkpoint and ended bit-identical
    _assert_the_end(chaos_run)
