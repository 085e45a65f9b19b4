"""Reliability of the Ray backend (issue 20): a local cluster listens on loopback only, the
dashboard works or is refused with the install command, a stopped worker is reported by
its heartbeat, and nothing of a killed driver's cluster outlives it.

The driver-level tests run ``ray_driver.py`` (beside this file) as a subprocess, so that
the process tree and sockets they inspect are that run's alone.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

ray = pytest.importorskip("ray")

from verl.controller import (  # noqa: E402
    Dispatch,
    RayOptions,
    RayWorkerGroup,
    ResourcePool,
    Worker,
    WorkerDiedError,
    WorkerStalledError,
    register,
)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

DRIVER = Path(__file__).with_name("ray_driver.py")
ROOT = Path(__file__).resolve().parents[2]

# Documented in docs/reliability.md ("Ray"): after the driver is killed, every process of
# its local cluster is gone within these many seconds (measured 0.4 s and 3 s).
GONE_AFTER_SIGKILL_S = 5.0
GONE_AFTER_SIGTERM_S = 10.0


def _is_loopback(host: str) -> bool:
    address = ipaddress.ip_address(host.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


class _Driver:
    """A running ``ray_driver.py`` and every process it started."""

    def __init__(self, *args: str) -> None:
        path = [str(ROOT), str(DRIVER.parent), os.environ.get("PYTHONPATH", "")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
        env.pop("RAY_ADDRESS", None)
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVER), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        line = self.proc.stdout.readline()
        if not line:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the driver exited with {self.proc.returncode} before starting")
        self.info = json.loads(line)

    def processes(self) -> list[psutil.Process]:
        """The driver and all its descendants (GCS, raylet, agents, workers, watchdog)."""
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]

    def close(self, procs: list[psutil.Process]) -> None:
        with contextlib.suppress(Exception):
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.kill()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def _gone_within(procs: list[psutil.Process], limit_s: float) -> list[psutil.Process]:
    """The processes still alive after waiting up to ``limit_s`` for all to end."""
    deadline = time.monotonic() + limit_s
    while (alive := _alive(procs)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _listening(procs: list[psutil.Process]) -> list[tuple[int, str, str, int]]:
    found = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            for conn in p.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((p.pid, p.name(), conn.laddr.ip, conn.laddr.port))
    return found


# --------------------------------------------------------------------------- loopback


@pytest.mark.slow
def test_local_cluster_listens_on_loopback_only():
    driver = _Driver()
    procs = driver.processes()
    try:
        sockets = _listening(procs)
        names = {name for _, name, _, _ in sockets}
        # the GCS, the raylet, the workers (with the gloo store of rank 0) and the driver
        assert {"gcs_server", "raylet"} <= names, sockets
        ranks = set(driver.info["ranks"])
        assert ranks <= {pid for pid, *_ in sockets}, (ranks, sockets)
        exposed = [s for s in sockets if not _is_loopback(s[2])]
        assert exposed == [], f"listening beyond loopback: {exposed}"
        assert driver.info["gcs_address"].startswith("127.0.0.1:")
    finally:
        driver.close(procs)
    assert _gone_within(procs, GONE_AFTER_SIGKILL_S) == []  # a normal end leaves nothing


def _dashboard_installed() -> bool:
    try:
        import ray.dashboard.optional_deps  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _dashboard_installed(), reason="ray[default] not installed")
def test_dashboard_on_loopback_answers_with_the_clusters_token():
    driver = _Driver("--dashboard")
    procs = driver.processes()
    try:
        url = driver.info["dashboard_url"]
        host, port = url.rsplit(":", 1)
        assert host == "127.0.0.1"
        assert (int(port), "127.0.0.1") in {(s[3], s[2]) for s in _listening(procs)}
        exposed = [s for s in _listening(procs) if not _is_loopback(s[2])]
        assert exposed == [], f"listening beyond loopback: {exposed}"
        with pytest.raises(urllib.error.HTTPError) as refused:  # token authentication
            urllib.request.urlopen(f"http://{url}/api/version", timeout=10)
        assert refused.value.code == 401
        token = (Path.home() / ".ray" / "auth_token").read_text().strip()
        request = urllib.request.Request(
            f"http://{url}/api/version", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert json.loads(answer.read())["ray_version"] == ray.__version__
    finally:
        driver.close(procs)
    assert _gone_within(procs, GONE_AFTER_SIGKILL_S) == []  # a normal end leaves nothing


def test_dashboard_without_its_packages_fails_before_starting_with_the_install_command():
    code = (
        "import sys; sys.modules['ray.dashboard.optional_deps'] = None\n"
        "import ray\n"
        "from verl.controller import ensure_ray\n"
        "try:\n"
        "    ensure_ray(num_cpus=1, include_dashboard=True)\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, ray.is_initialized()); print(e)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    first, message = out.stdout.split("\n", 1)
    assert first == "DashboardUnavailableError False", out.stdout + out.stderr
    assert f"pip install 'ray[default]=={ray.__version__}'" in message
    assert "trainer.ray_dashboard" in message


# --------------------------------------------------------------------------- driver death


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig, limit_s",
    [(signal.SIGKILL, GONE_AFTER_SIGKILL_S), (signal.SIGTERM, GONE_AFTER_SIGTERM_S)],
    ids=["SIGKILL", "SIGTERM"],
)
def test_nothing_outlives_a_killed_driver(sig, limit_s):
    driver = _Driver()
    procs = driver.processes()
    try:
        names = sorted(p.name() for p in procs)
        assert any("raylet" in n for n in names) and len(procs) >= 7, names
        start = time.monotonic()
        os.kill(driver.proc.pid, sig)  # the driver alone, mid-call
        driver.proc.wait(timeout=limit_s)
        alive = _gone_within(procs, limit_s - (time.monotonic() - start))
        took = time.monotonic() - start
        left = [(p.pid, p.name()) for p in alive]
        assert left == [], f"alive {took:.1f}s after {sig.name} of the driver: {left}"
    finally:
        driver.close(procs)


# --------------------------------------------------------------------------- heartbeat


class Stoppable(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce_after(self, seconds: float) -> float:
        import torch
        import torch.distributed as dist

        time.sleep(seconds)
        t = torch.ones(1)
        dist.all_reduce(t)
        return t.item()


def test_heartbeat_timeout_is_validated():
    from verl.config import TrainerConfig
    from verl.trainer.rl.placement import _start_ray

    with pytest.raises(ValueError, match="heartbeat_timeout_s=0 must be > 0"):
        RayOptions(heartbeat_timeout_s=0)
    assert RayOptions().heartbeat_timeout_s == 60.0
    cfg = TrainerConfig()
    assert cfg.trainer.worker_heartbeat_timeout == 60.0
    cfg.trainer.worker_heartbeat_timeout = -1.0
    with pytest.raises(ValueError, match=r"trainer.worker_heartbeat_timeout=-1.0 must be > 0"):
        _start_ray(cfg, 2, "cpu")  # refused before Ray starts


@pytest.mark.slow
def test_stopped_worker_is_reported_by_the_heartbeat(ray_session):
    timeout_s = 5.0
    group = RayWorkerGroup(
        Stoppable,
        ResourcePool([2], name="stall"),
        ray_options=RayOptions(heartbeat_timeout_s=timeout_s),
    )
    pids = group.pid()
    stopped = psutil.Process(pids[1])
    try:
        future = group.submit("all_reduce_after", 1.0)
        stopped.suspend()  # SIGSTOP before it reaches the collective: rank 0 waits for it
        start = time.monotonic()
        with pytest.raises(WorkerStalledError) as caught:
            future.result()
        took = time.monotonic() - start
        print(f"stall of rank 1 reported {took:.2f}s after SIGSTOP (timeout {timeout_s}s)")
        error = caught.value
        assert isinstance(error, WorkerDiedError)  # handled wherever a death is
        assert (error.role, error.rank, error.method) == ("Stoppable", 1, "all_reduce_after")
        assert f"pid {pids[1]}" in str(error) and "node 127.0.0.1" in str(error)
        assert "stopped responding" in str(error)
        # reported after the timeout, and within one ping interval (+ scheduling slack) of it
        assert timeout_s - 1.5 <= took <= timeout_s + 5.0, took
        with pytest.raises(WorkerStalledError):  # the group refuses further calls
            group.pid()
    finally:
        group.shutdown()
        with contextlib.suppress(psutil.NoSuchProcess):
            stopped.wait(timeout=10)  # ray.kill reaches a stopped process too
        if _alive([stopped]):
            stopped.resume()
            stopped.kill()
            pytest.fail("shutdown() left the stopped worker alive")


@pytest.mark.slow
def test_busy_worker_keeps_answering_its_heartbeat(ray_session):
    group = RayWorkerGroup(
        Stoppable, ResourcePool([2], name="busy"), ray_options=RayOptions(heartbeat_timeout_s=1.0)
    )
    try:
        # 3 s in a method, three times the heartbeat timeout: no stall reported
        assert group.all_reduce_after(3.0) == [2.0, 2.0]
    finally:
        group.shutdown()


# --------------------------------------------------------------------------- joining


_JOIN = """
import sys
import ray
from verl.controller import ensure_ray
try:
    ensure_ray(address=sys.argv[1])
    print("joined", ray.cluster_resources().get("CPU"))
except Exception as e:
    print("refused", type(e).__name__, e)
"""


@pytest.mark.slow
def test_joining_a_cluster_needs_its_token(tmp_path):
    from verl.utils.distributed import find_free_port

    (tmp_path / "token").write_text(os.urandom(16).hex())
    (tmp_path / "other").write_text(os.urandom(16).hex())
    port = find_free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)
    head_env = dict(env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(tmp_path / "token"))
    ray_cli = Path(sys.executable).with_name("ray")
    args = ["start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=1"]
    head = subprocess.Popen(
        [str(ray_cli), *args, "--include-dashboard=false", "--block"],
        env=head_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    procs: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while not any(s[3] == port for s in _listening(procs)):
            assert head.poll() is None and time.monotonic() < deadline, "the head did not start"
            time.sleep(0.3)
            procs = [psutil.Process(head.pid), *psutil.Process(head.pid).children(True)]

        def join(token_file: str, **extra_env: str) -> str:
            # RAY_AUTH_MODE unset: ensure_ray asks for token authentication itself
            join_env = {k: v for k, v in env.items() if k != "RAY_AUTH_MODE"}
            join_env["RAY_AUTH_TOKEN_PATH"] = str(tmp_path / token_file)
            join_env.update(extra_env)
            out = subprocess.run(
                [sys.executable, "-c", _JOIN, f"127.0.0.1:{port}"],
                env=join_env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            return out.stdout.strip()

        assert join("token") == "joined 1.0"
        # Ray retries a refused connection once a second for 20 s by default, as it would for
        # a head still starting: one attempt gives the same refusal and message
        refused = join("other", RAY_gcs_server_port_wait_time_s="1")
        assert refused.startswith("refused ConnectionError"), refused
        assert "~/.ray/auth_token" in refused and "RAY_AUTH_MODE=token" in refused
    finally:
        with contextlib.suppress(psutil.Error):  # the head's processes, as of now
            procs = [psutil.Process(head.pid), *psutil.Process(head.pid).children(True)]
        head.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(20)
        for p in _gone_within(procs, 5.0):
            with contextlib.suppress(psutil.Error):
                p.kill()
    assert _gone_within(procs, 5.0) == []
