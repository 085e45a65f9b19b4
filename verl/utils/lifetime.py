"""Tie a child process's life to its parent's, so nothing the driver started outlives it.

A forked helper (a reward worker, say) keeps running after its parent dies unless it is
told otherwise: SIGKILL of the parent runs no cleanup, and a helper blocked in a long call
never notices its closed pipe. :func:`die_with_parent`, called first thing in the child:

- on Linux, asks the kernel for SIGKILL when the parent goes (``PR_SET_PDEATHSIG``). The
  kernel sends it when the *thread* that forked the child ends, so the parent passes
  ``kernel_signal=False`` when it forks from a thread that may end before the process;
- everywhere, starts a daemon thread that exits the child within ``poll_s`` seconds of
  its parent's pid changing (the child was re-parented), which covers other systems and
  children forked from short-lived threads;
- exits at once if the parent died before either was in place.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def forked_from_main_thread() -> bool:
    """Whether a child forked now may use the kernel's parent-death signal (see module doc)."""
    return threading.current_thread() is threading.main_thread()


def die_with_parent(parent_pid: int, *, kernel_signal: bool = True, poll_s: float = 1.0) -> None:
    """Make this (child) process end when ``parent_pid`` ends; call it first in the child."""
    if kernel_signal and sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before we got here
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="verl-parent-watch", daemon=True).start()


def processes_with_env(name: str, value: str) -> dict[int, str]:
    """pid -> command line of every live process (other than this one) whose environment
    has ``name=value``: a way to find what a run started, re-parented or not (Linux /proc;
    only processes this user may read; zombies are left out)."""
    needle = f"{name}={value}".encode()
    found: dict[int, str] = {}
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        return found
    for proc in proc_root.iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone, or not ours to read
            continue
        if cmdline:  # zombies have none
            found[int(proc.name)] = cmdline.strip()
    return found


def wait_until_gone(name: str, value: str, seconds: float, poll_s: float = 0.2) -> dict[int, str]:
    """Wait up to ``seconds`` for every process carrying ``name=value`` to end; returns
    those still alive then (empty when all ended)."""
    deadline = time.monotonic() + seconds
    while (alive := processes_with_env(name, value)) and time.monotonic() < deadline:
        time.sleep(poll_s)
    return alive


def kill_processes_with_env(name: str, value: str) -> dict[int, str]:
    """SIGKILL every process carrying ``name=value``; returns the ones it found."""
    found = processes_with_env(name, value)
    for pid in found:
        with contextlib.suppress(OSError):  # already gone, or not ours
            os.kill(pid, signal.SIGKILL)
    return found
