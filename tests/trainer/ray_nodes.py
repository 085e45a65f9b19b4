"""Two Ray nodes on this machine for the multi-node tests: a token-protected head and a
worker node, each a ``ray start --block`` process with one CPU on 127.0.0.1.

    with two_ray_nodes(tmp_path, mark_var, mark) as cluster:
        subprocess.run([...], env=cluster.env)   # trainer.ray_address=cluster.address
        cluster.head.node_id(), cluster.worker.raylet()

Every process started carries ``mark_var=mark`` in its environment; on exit the nodes are
stopped and anything still carrying the mark is killed.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from verl.utils.distributed import find_free_port
from verl.utils.lifetime import kill_processes_with_env, wait_until_gone

from .prewarmed import Prewarmed

ROOT = Path(__file__).resolve().parents[2]
# What the drivers of the tests import (the RL child script, main_sft): imported once.
DRIVER_IMPORTS = (
    "psutil",
    "ray",
    "verl.config",
    "verl.controller",
    "verl.trainer.rl.trainer",
    "verl.cli.sft",
)
# a second node on this machine needs its own agent and metrics ports
_AGENT_PORTS = (
    "dashboard-agent-listen",
    "dashboard-agent-grpc",
    "runtime-env-agent",
    "metrics-export",
)


class RayNode:
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


@dataclass
class TwoNodes:
    address: str  # for trainer.ray_address
    env: dict[str, str]  # for the driver: the token, the mark, this checkout on PYTHONPATH
    head: RayNode
    worker: RayNode
    drivers: Prewarmed | None = None

    def drive(self, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
        """``python args...`` as a driver of this cluster; its stderr is kept. Drivers are
        forked from one parent that imported the trainers once (``prewarmed.py``)."""
        if self.drivers is None:
            self.drivers = Prewarmed(DRIVER_IMPORTS, self.env, cwd)
        child = self.drivers.run(args, cwd=cwd, stderr=cwd / "driver.err", timeout=240)
        child.stderr = child.stderr.decode(errors="replace")
        return child


@contextlib.contextmanager
def two_ray_nodes(tmp_path: Path, mark_var: str, mark: str) -> Iterator[TwoNodes]:
    token = tmp_path / "token"
    token.write_text(os.urandom(16).hex())
    port = find_free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_AUTH_MODE="token")
    env |= {"RAY_AUTH_TOKEN_PATH": str(token), mark_var: mark}
    for key in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
        env.pop(key, None)  # the latter, set to 0, refuses worker nodes
    one_cpu = ["--node-ip-address=127.0.0.1", "--num-cpus=1"]
    nodes: list[RayNode] = []
    cluster: TwoNodes | None = None
    try:
        head = RayNode(
            ["--head", f"--port={port}", *one_cpu, "--include-dashboard=false"],
            env,
            tmp_path / "head.log",
        )
        nodes.append(head)
        head.raylet()
        ports = [f"--{name}-port={find_free_port()}" for name in _AGENT_PORTS]
        worker = RayNode(
            [f"--address=127.0.0.1:{port}", *one_cpu, *ports], env, tmp_path / "worker.log"
        )
        nodes.append(worker)
        worker.raylet()
        cluster = TwoNodes(f"127.0.0.1:{port}", env, head, worker)
        yield cluster
    finally:
        if cluster is not None and cluster.drivers is not None:
            cluster.drivers.close()
        for node in reversed(nodes):
            node.stop()
        wait_until_gone(mark_var, mark, 15, poll_s=0.3)
        kill_processes_with_env(mark_var, mark)
