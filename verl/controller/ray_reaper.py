"""A watchdog that takes a local Ray cluster down with the driver that started it.

Ray's own fate sharing does not cover every process: when the driver is SIGKILLed, the
GCS, raylet and monitors die at once (parent-death signal) and the workers within ~1.5 s,
but the raylet's dashboard and runtime-env agents outlive it by about 60 s (measured with
Ray 2.60; docs/reliability.md). ``tie_cluster_to_driver()``, called by ``ensure_ray`` just
before it starts a local cluster, closes that gap:

- Every process of the cluster inherits an environment variable naming it
  (``VERL_RAY_CLUSTER=<driver pid>-<random>``): set while ``ray.init`` starts the GCS,
  raylet and agents, it passes on to every worker the raylet starts, and to whatever those
  start in turn (a worker's reward processes, sandboxes, compilers).
- A small watchdog process (this file run as a script, standard library only, in a session
  of its own so a Ctrl-C to the terminal's process group cannot stop it first) holds the
  read end of a pipe whose write end only the driver holds. End of file on it, or a new
  parent, means the driver is gone, however it died; the watchdog then SIGKILLs every
  process whose environment carries the cluster's name and every descendant of one (the
  raylet's agents rewrite their environment; they are known as the raylet's children),
  until none is left.
- ``shutdown_ray()`` (``verl.controller.ray_cluster``) shuts Ray down and then closes the
  pipe, so the watchdog finishes at once; after a bare ``ray.shutdown()`` it exits by
  itself once it finds no process of the cluster (within about a second), so a driver that
  starts several clusters in turn keeps no watchdogs.

Linux only (``/proc``); elsewhere Ray's own fate sharing is all there is.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import signal
import subprocess
import sys
import time

CLUSTER_ENV = "VERL_RAY_CLUSTER"

# how often the watchdog checks for its driver (the death-to-kill latency) and scans /proc
# for the cluster's processes (to notice a normal shutdown)
_POLL_S = 0.2
_SCAN_S = 1.0

# the watchdogs started by this process, with the write ends of their pipes (never written:
# held until the cluster is shut down, or for the driver's lifetime)
_watchdogs: list[tuple[subprocess.Popen, int]] = []


def tie_cluster_to_driver() -> str | None:
    """Start the watchdog of a cluster about to be started; the cluster's name, or None.

    The caller sets ``os.environ[CLUSTER_ENV]`` to the returned name while it starts the
    cluster (``ensure_ray`` does). Returns None (and starts nothing) where ``/proc`` is
    missing.
    """
    if not os.path.isdir("/proc/self"):
        return None
    name = f"{os.getpid()}-{secrets.token_hex(6)}"
    read_end, write_end = os.pipe()  # both not inheritable: only the watchdog gets read_end
    env = {k: v for k, v in os.environ.items() if k != CLUSTER_ENV}
    try:
        watchdog = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), name, str(os.getpid())],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            close_fds=True,
            start_new_session=True,
            env=env,
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    _watchdogs.append((watchdog, write_end))
    return name


def release_watchdogs(timeout_s: float = 10.0) -> None:
    """After a normal ``ray.shutdown()``: let the watchdogs finish now and reap them.

    Closing a watchdog's pipe reads as the driver's end: it kills whatever of its cluster is
    still alive (nothing, after a clean shutdown, or a straggler) and exits.
    """
    while _watchdogs:
        watchdog, write_end = _watchdogs.pop()
        os.close(write_end)
        try:
            watchdog.wait(timeout_s)
        except subprocess.TimeoutExpired:
            watchdog.kill()
            watchdog.wait()


def _proc_table() -> dict[int, tuple[int, int]]:
    """``{pid: (ppid, start time)}`` of every live process, from ``/proc/<pid>/stat``."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (comm) "
        if fields[0] != b"Z":  # a zombie is dead already; its parent has yet to reap it
            table[int(entry)] = (int(fields[1]), int(fields[19]))
    return table


def _carries(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return needle in b"\0" + f.read()
    except OSError:  # gone, or not ours to read
        return False


class _Cluster:
    """The processes of one cluster: those carrying its name, and their descendants.

    Descendants count because some Ray processes (the raylet's agents) rewrite the memory
    that ``/proc/<pid>/environ`` shows; they are children of the raylet, and remembered as
    such, since they are reparented away from it the moment it dies.
    """

    def __init__(self, name: str) -> None:
        self._needle = f"\0{CLUSTER_ENV}={name}\0".encode()
        self._me = os.getpid()
        self._checked: dict[tuple[int, int], bool] = {}
        self.members: dict[int, int] = {}  # pid -> start time

    def scan(self) -> dict[int, int]:
        table = _proc_table()
        members = {pid: t for pid, t in self.members.items() if table.get(pid, (0, -1))[1] == t}
        for pid, (_, start) in table.items():
            key = (pid, start)
            if key not in self._checked:
                self._checked[key] = pid != self._me and _carries(pid, self._needle)
            if self._checked[key]:
                members[pid] = start
        grew = True
        while grew:
            grew = False
            for pid, (ppid, start) in table.items():
                if ppid in members and pid not in members and pid != self._me:
                    members[pid] = start
                    grew = True
        self._checked = {k: v for k, v in self._checked.items() if k[0] in table}
        self.members = members
        return members


def processes_of(name: str) -> list[int]:
    """Pids of the live processes of the cluster ``name`` (carrying it, and descendants)."""
    return sorted(_Cluster(name).scan())


def _driver_gone(driver_pid: int) -> bool:
    if os.getppid() != driver_pid:
        return True
    ready, _, _ = select.select([0], [], [], _POLL_S)
    return bool(ready) and os.read(0, 1) == b""


def _watch(name: str, driver_pid: int) -> None:
    cluster = _Cluster(name)
    seen = False
    next_scan = 0.0
    while not _driver_gone(driver_pid):
        if time.monotonic() >= next_scan:
            if cluster.scan():
                seen = True
            elif seen:
                return  # the cluster was shut down normally
            next_scan = time.monotonic() + _SCAN_S
    # The driver is gone: nothing of its cluster may stay. Processes may still be starting
    # (a raylet restarting a worker), so repeat until scans find none.
    quiet_scans = 0
    deadline = time.monotonic() + 30.0
    while quiet_scans < 3 and time.monotonic() < deadline:
        members = cluster.scan()  # verified by start time: never a reused pid
        for pid in members:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        quiet_scans = 0 if members else quiet_scans + 1
        time.sleep(0.05)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch(sys.argv[1], int(sys.argv[2]))
