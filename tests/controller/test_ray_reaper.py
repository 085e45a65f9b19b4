"""The watchdog that ties a local Ray cluster's processes to its driver, without Ray: a
stand-in driver starts it, then processes marked as the cluster's (and an unmarked child of
one, as the raylet's agents are); when the driver dies, or ends normally, they go.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from verl.controller import ray_reaper
from verl.controller.ray_reaper import _SCAN_S, CLUSTER_ENV, processes_of

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")

# A stand-in driver: the watchdog, then a marked "raylet" whose child (an "agent") has an
# environment without the mark. Prints the pids, then waits for stdin or its death.
DRIVER = textwrap.dedent(
    """
    import importlib.util, os, subprocess, sys
    # the module alone, by path: importing the verl package would cost seconds (torch)
    spec = importlib.util.spec_from_file_location("ray_reaper", sys.argv[2])
    reaper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reaper)
    CLUSTER_ENV, release_watchdogs = reaper.CLUSTER_ENV, reaper.release_watchdogs
    name = reaper.tie_cluster_to_driver()
    agent = "import subprocess, time; subprocess.Popen(['sleep', '300'], env={}); time.sleep(300)"
    raylet = subprocess.Popen(
        [sys.executable, "-c", agent], env=dict(os.environ, **{CLUSTER_ENV: name})
    )
    print(name, raylet.pid, flush=True)
    sys.stdin.read()
    if sys.argv[1] == "clean":
        raylet.kill(); raylet.wait()
        release_watchdogs()
    """
)


def _start(mode: str) -> tuple[subprocess.Popen, str, list[psutil.Process]]:
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, mode, ray_reaper.__file__],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    name, raylet_pid = driver.stdout.readline().split()
    raylet = psutil.Process(int(raylet_pid))
    deadline = time.monotonic() + 30
    while len(raylet.children()) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    procs = [psutil.Process(driver.pid), *psutil.Process(driver.pid).children(recursive=True)]
    # an unmarked process (the agent) is known to the watchdog from its next scan on
    time.sleep(_SCAN_S + 0.2)
    return driver, name, procs


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
    return alive


def _wait_gone(procs: list[psutil.Process], limit_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + limit_s
    while (alive := _alive(procs)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _cleanup(driver: subprocess.Popen, procs: list[psutil.Process]) -> None:
    for p in _alive(procs):
        with contextlib.suppress(psutil.Error):
            p.kill()
    with contextlib.suppress(Exception):
        driver.kill()
        driver.wait()


def test_cluster_processes_are_found_by_mark_and_descent():
    driver, name, procs = _start("clean")
    try:
        found = set(processes_of(name))
        raylet = next(p for p in procs if p.pid in found and p.children())
        agent = raylet.children()[0]
        assert f"{CLUSTER_ENV}" not in agent.environ()  # unmarked, found as a child
        assert found == {raylet.pid, agent.pid}  # not the driver, not the watchdog
        assert processes_of("no-such-cluster") == []
    finally:
        _cleanup(driver, procs)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_the_cluster_dies_with_its_driver(sig):
    driver, _, procs = _start("clean")
    try:
        assert len(procs) == 4  # driver, watchdog, raylet, agent
        start = time.monotonic()
        os.kill(driver.pid, sig)
        driver.wait(5)
        left = _wait_gone(procs, 2.0)
        assert left == [], f"alive {time.monotonic() - start:.1f}s after {sig.name}: {left}"
    finally:
        _cleanup(driver, procs)


def test_watchdog_is_reaped_at_a_clean_shutdown():
    driver, _, procs = _start("clean")
    try:
        driver.stdin.close()  # the driver stops its "cluster", then releases the watchdog
        assert driver.wait(10) == 0
        assert _wait_gone(procs, 0.5) == []
    finally:
        _cleanup(driver, procs)
