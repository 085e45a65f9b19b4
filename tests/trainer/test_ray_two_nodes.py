"""Two Ray nodes on this machine (issue 20, item 9): a token-protected head and a worker node,
each started by ``ray start`` with one CPU, joined by the driver with
``trainer.ray_address``; a two-rank FSDP2 GRPO run gets one rank on each node (one CPU
each: the placement groups of ``trainer.nnodes=2`` cannot share a node). Killing the
worker node's raylet mid-run fails the driver with ``WorkerDiedError`` naming the role, the
rank and the node (IP and Ray node id).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from verl.config import to_yaml
from verl.trainer.checkpoint import complete_checkpoints, read_manifest
from verl.utils.distributed import find_free_port
from verl.utils.lifetime import kill_processes_with_env, processes_with_env, wait_until_gone

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MARK = "VERL_RAY_TWO_NODES_TEST"
# Documented in docs/reliability.md (Ray, two nodes): the driver's error after the raylet
# of a rank's node is SIGKILLed.
NODE_DEATH_REPORTED_S = 30.0

RUN = (
    "trainer.backend=ray",
    "trainer.device=cpu",
    "trainer.nnodes=2",
    "trainer.n_gpus_per_node=1",
    "trainer.total_training_steps=3",
    "trainer.save_freq=1",
    "trainer.val_before_train=false",
    "algorithm.adv_estimator=grpo",
    "custom_reward_function.name=varied",
)

# argv: config, raylet pid to kill at the 2nd update ("0": none)
CHILD = """
import json, os, signal, sys, time
import psutil
import ray
from verl.config import load_config
from verl.controller import ensure_ray, ray_backend
from verl.trainer import ppo_trainer

cfg = load_config(sys.argv[1])
victim = int(sys.argv[2])
ensure_ray(address=cfg.trainer.ray_address)
deadline = time.monotonic() + 60
while sum(n["Alive"] for n in ray.nodes()) < 2:
    assert time.monotonic() < deadline, "the worker node did not join"
    time.sleep(0.2)
real = ray_backend._RayPending.wait
calls = 0


def wait(self, timeout=None):
    global calls
    if self._method == "update_actor" and victim:
        calls += 1
        if calls == 2:  # submitted: the ranks are running the update of step 2
            workers = psutil.Process(victim).children()
            os.kill(victim, signal.SIGKILL)
            print(f"KILLED {time.time()!r}", file=sys.stderr, flush=True)
            # a tiny run could end before the node's workers notice: go on once they did
            psutil.wait_procs(workers, timeout=30)
    return real(self, timeout)


ray_backend._RayPending.wait = wait
trainer = ppo_trainer.RLTrainer(cfg)
print("NODES " + json.dumps(trainer.actor_rollout_wg.nodes), file=sys.stderr, flush=True)
try:
    trainer.fit()
except BaseException:
    print(f"FAILED {time.time()!r}", file=sys.stderr, flush=True)
    raise
"""


class _Node:
    """A ``ray start --block`` process (a head or a worker node) and its node id."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        ray_cli = Path(sys.executable).with_name("ray")
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [str(ray_cli), "start", *args, "--block"], env=env, stdout=out, stderr=out
            )

    def raylet(self, timeout: float = 60) -> psutil.Process:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"ray start exited: {self.log.read_text()[-2000:]}"
            for child in psutil.Process(self.proc.pid).children():
                with contextlib.suppress(psutil.Error):
                    if Path(child.exe()).name == "raylet":
                        return child
            assert time.monotonic() < deadline, "no raylet started"
            time.sleep(0.2)

    def node_id(self) -> str:
        found = re.search(r"--node_id=([0-9a-f]+)", " ".join(self.raylet().cmdline()))
        assert found, "the raylet's command line has no --node_id"
        return found.group(1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # ray start --block stops its processes on SIGTERM
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(20)


def test_two_nodes_one_rank_each_and_a_killed_raylet_is_named(rl_config, tmp_path):
    mark = uuid.uuid4().hex
    token = tmp_path / "token"
    token.write_text(os.urandom(16).hex())
    port = find_free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_AUTH_MODE="token")
    env |= {"RAY_AUTH_TOKEN_PATH": str(token), MARK: mark}
    for key in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        env.pop(key, None)  # the latter, set to 0, refuses worker nodes
    one_cpu = ["--node-ip-address=127.0.0.1", "--num-cpus=1"]
    (tmp_path / "reward.py").write_text(
        "def varied(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return (len(solution_str) % 5) / 4.0\n"
    )
    config_file = tmp_path / "run.yaml"

    def write_config(run_dir: Path) -> None:
        cfg = rl_config(
            *RUN,
            f"trainer.ray_address=127.0.0.1:{port}",
            f"custom_reward_function.path={tmp_path / 'reward.py'}",
            f"trainer.default_local_dir={run_dir}",
            f"trainer.log_dir={run_dir}",
        )
        config_file.write_text(to_yaml(cfg))

    write_config(tmp_path / "first")
    script = tmp_path / "child.py"
    script.write_text(CHILD)

    nodes: list[_Node] = []
    try:
        head = _Node(
            ["--head", f"--port={port}", *one_cpu, "--include-dashboard=false"],
            env,
            tmp_path / "head.log",
        )
        nodes.append(head)
        head.raylet()
        # a second node on this machine needs its own agent and metrics ports
        ports = [f"--{name}-port={find_free_port()}" for name in _AGENT_PORTS]
        worker = _Node(
            [f"--address=127.0.0.1:{port}", *one_cpu, *ports], env, tmp_path / "worker.log"
        )
        nodes.append(worker)
        head_id, worker_id = head.node_id(), worker.node_id()

        def drive(victim: int) -> tuple[subprocess.CompletedProcess, float]:
            child = subprocess.run(
                [sys.executable, str(script), str(config_file), str(victim)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                cwd=tmp_path,
                timeout=240,
            )
            return child, time.time()

        # 1. a short job across both nodes, to the end
        child, _ = drive(0)
        assert child.returncode == 0, child.stderr[-3000:]
        placed = json.loads(re.search(r"NODES (.*)", child.stderr).group(1))
        assert sorted(n.split(" id ")[1] for n in placed) == sorted(
            [head_id[:12], worker_id[:12]]
        ), f"ranks not one per node: {placed}"
        for _, step_dir in complete_checkpoints(tmp_path / "first"):
            read_manifest(step_dir, verify=True)

        # 2. the same job again (resuming nothing: a fresh directory), the worker node's
        # raylet SIGKILLed while the ranks run the update of step 2
        write_config(tmp_path / "second")
        child, ended = drive(worker.raylet().pid)
        assert child.returncode not in (0, -signal.SIGKILL), child.stderr[-3000:]
        killed_at = float(re.search(r"KILLED ([0-9.]+)", child.stderr).group(1))
        failed_at = float(re.search(r"FAILED ([0-9.]+)", child.stderr).group(1))
        placed = json.loads(re.search(r"NODES (.*)", child.stderr).group(1))
        rank = next(i for i, n in enumerate(placed) if worker_id[:12] in n)
        died = re.search(
            rf"WorkerDiedError: worker actor_rollout_ref \S* ?rank {rank} died during "
            rf"'\w+': \(pid \d+, node \S+ id {worker_id[:12]}\)[^\n]*",
            child.stderr,
        )
        assert died, child.stderr[-3000:]
        print(died.group(0))
        for _, step_dir in complete_checkpoints(tmp_path / "second"):
            read_manifest(step_dir, verify=True)
        reported = failed_at - killed_at
        print(
            f"raylet killed: fit() raised {reported:.1f}s later, driver gone {ended - killed_at:.1f}s"
        )
        assert reported < NODE_DEATH_REPORTED_S, f"{reported:.1f}s"
    finally:
        for node in reversed(nodes):
            node.stop()
        wait_until_gone(MARK, mark, 15, poll_s=0.3)
        kill_processes_with_env(MARK, mark)
    assert not processes_with_env(MARK, mark)


_AGENT_PORTS = (
    "dashboard-agent-listen",
    "dashboard-agent-grpc",
    "runtime-env-agent",
    "metrics-export",
)
