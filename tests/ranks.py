"""Start a multi-rank test's processes without each of them importing torch and transformers.

``run_ranks(fn, args, nprocs, request)`` runs ``fn(rank, *args)`` in ``nprocs`` processes and
returns when all have ended, raising as ``torch.multiprocessing.start_processes`` does when one
fails (it is that function, with the ``forkserver`` start method). The ranks are forked from
multiprocessing's fork server, which imports ``PRELOAD`` once when it starts (the first
``run_ranks`` of a pytest process) and then only forks: a fresh interpreter's ``import torch,
transformers`` costs seconds of CPU, which ``spawn`` paid once per rank and per test.

What a rank sees, compared with ``spawn``:

- ``os.environ``: the caller's at the ``run_ranks`` call (passed along and applied in the
  rank before ``fn`` runs), as with ``spawn``. What a library read from the environment at
  import time is the server's: the environment of the process when this module was first
  imported (the server is started with it), not the one of the test that started it.
- Standard output and error: the caller's descriptors 1 and 2 (under pytest the test's
  captured output), passed to the rank as descriptors.
- ``sys.path``, the working directory and the main module: the caller's, set by
  multiprocessing as for ``spawn``. ``fn`` is pickled by name: a test module's function must
  be importable, so the repository root is put on ``sys.path`` here.
- The server only imports (no torch op: torch's intra-op thread pool starts lazily, in the
  rank). The one thread an import starts is numpy's OpenBLAS server, idle, which OpenBLAS
  itself stops and restarts around a fork. Python's ``random`` is reseeded in every fork;
  numpy's global generator is not (each rank starts from the server's state, where ``spawn``
  gave each a fresh one): seed what a rank draws.

The fork server is multiprocessing's own (the one ``get_context("forkserver")`` uses), so its
module list must be set before anything in the process starts it. If something else started
it first, ``run_ranks`` warns and runs the ranks there anyway: correct, only without the
preloaded modules. The server carries the test session's environment mark, and so do the
ranks (a fork keeps ``/proc/<pid>/environ``), so the leak checks of ``tests/conftest.py`` see
a rank that outlives its test; the server itself is stopped when the pytest session ends
(registered through ``request``) or, when ``request`` is None (a script), after the run.

``VERL_TEST_RANKS_START_METHOD=spawn`` starts the ranks with ``spawn`` instead (to compare).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable
from multiprocessing import forkserver, reduction
from pathlib import Path
from typing import Any

PRELOAD = (
    "torch",
    "torch.distributed",
    "transformers.modeling_utils",
    "verl.engine",
    "verl.models.tiny",
    "verl.workers.actor_rollout_ref",
    "verl.workers.critic",
)

# "spawn": each rank a fresh interpreter (to compare, or to rule the fork server out)
START_METHOD = os.environ.get("VERL_TEST_RANKS_START_METHOD", "forkserver")
STOP_GRACE_S = 10.0
_ROOT = str(Path(__file__).resolve().parents[1])
_SERVER_ENV = dict(os.environ)  # the environment the server starts with
_server_pid: int | None = None  # the fork server this module started, while it runs


def run_ranks(
    fn: Callable[..., Any], args: tuple = (), nprocs: int = 2, request: Any = None
) -> None:
    """``fn(rank, *args)`` in ``nprocs`` processes forked from the preloaded server; under
    pytest pass the test's or fixture's ``request`` (the server is stopped at the session's
    end, before the leak check), in a script ``None`` (stopped after this run)."""
    import torch.multiprocessing as mp

    if _ROOT not in sys.path:  # the ranks import ``fn``'s module by name
        sys.path.insert(0, _ROOT)
    if START_METHOD != "forkserver":
        mp.start_processes(fn, args=args, nprocs=nprocs, start_method=START_METHOD, join=True)
        return
    _ensure_server()
    if request is not None:
        _stop_at_session_end(request.config)
    try:
        mp.start_processes(
            _with_env,
            args=(fn, dict(os.environ), _Stdio(), args),
            nprocs=nprocs,
            start_method="forkserver",
            join=True,
        )
    finally:
        if request is None:
            stop_server()


def _with_env(
    rank: int, fn: Callable[..., Any], env: dict[str, str], stdio: Any, args: tuple
) -> None:
    if isinstance(stdio, _Stdio):
        stdio.take()
    os.environ.clear()
    os.environ.update(env)
    fn(rank, *args)


class _Stdio:
    """The caller's descriptors 1 and 2, handed to a forked rank, which writes to them (a test's
    captured output) instead of to those the server was started with."""

    def __init__(self, fds: tuple[Any, Any] | None = None) -> None:
        self.fds = fds

    def __reduce__(self):  # pickled while multiprocessing starts a rank: it passes the fds
        return (_Stdio, ((reduction.DupFd(1), reduction.DupFd(2)),))

    def take(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for target, dup in zip((1, 2), self.fds):
            fd = dup.detach()
            os.dup2(fd, target)
            os.close(fd)


def _ensure_server() -> None:
    global _server_pid
    server = forkserver._forkserver
    running = server._forkserver_pid
    if running is not None and running != _server_pid:
        warnings.warn(
            "multiprocessing's fork server was started before tests/ranks.py set its preload "
            "list: the ranks import torch and transformers themselves",
            stacklevel=3,
        )
        return
    server.set_forkserver_preload(list(PRELOAD))
    if running is None:
        caller_env = dict(os.environ)
        if caller_env != _SERVER_ENV:
            os.environ.clear()
            os.environ.update(_SERVER_ENV)
        try:
            server.ensure_running()
        finally:
            if caller_env != _SERVER_ENV:
                os.environ.clear()
                os.environ.update(caller_env)
    else:
        server.ensure_running()  # restarts it if it died
    _server_pid = server._forkserver_pid


def stop_server() -> None:
    """Stop the fork server this module started (its ranks have ended); no-op otherwise."""
    global _server_pid
    server = forkserver._forkserver
    if _server_pid is not None and server._forkserver_pid == _server_pid:
        # The server exits once every process it forked has closed its end of the "alive"
        # pipe: a rank's leftover child would keep it (and this wait) alive, so it is killed
        # after a grace period and the leftover is left to the leak checks to report.
        watchdog = threading.Timer(STOP_GRACE_S, _kill, (_server_pid,))
        watchdog.start()
        try:
            server._stop()
        finally:
            watchdog.cancel()
    _server_pid = None


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


_PLUGIN_NAME = "tests-ranks-fork-server"


def _stop_at_session_end(config: Any) -> None:
    import pytest

    if config.pluginmanager.has_plugin(_PLUGIN_NAME):
        return

    class _Stopper:
        @pytest.hookimpl(tryfirst=True)  # before tests/conftest.py looks for what is left
        def pytest_sessionfinish(self) -> None:
            stop_server()

    config.pluginmanager.register(_Stopper(), _PLUGIN_NAME)
