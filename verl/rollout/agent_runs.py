"""The agents of agent-program rollouts (:mod:`verl.rollout.agent_program`): loading one,
and running one per rollout row against the OpenAI-compatible endpoint.

Contract: :func:`load_agent` returns an :class:`AgentSpec` (a callable, or a command's
argv) or raises ``ValueError`` / ``TypeError`` naming the problem and the fix. An
:class:`AgentRun` is one row's run: its task, its endpoint session (key) and its outcome,
``status`` one of :data:`STATUSES` (``pending`` / ``running`` before). An
:class:`AgentRunner` starts a run in a daemon thread (``verl-agent-<row>-...``): a callable
is called as ``agent(base_url, api_key, task)`` (a coroutine is run with ``asyncio.run``),
a command gets the task as JSON on stdin, ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` in its
environment and runs in its own process group; its reward is the last line of its stdout
as JSON. Whatever the agent does, its outcome is recorded once (``ok`` with its reward, or
``error`` with the message cut to :data:`MAX_ERROR_CHARS`), never raised; only a
``BaseException`` that is not an ``Exception`` is re-raised in the agent's thread after
being recorded. :meth:`AgentRunner.stop` closes the run's key, kills its command's process
group and waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from verl.rollout.openai_records import Session
from verl.rollout.openai_server import OpenAIEndpoint

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_ERROR_CHARS",
    "STATUSES",
    "AgentRun",
    "AgentRunner",
    "AgentSpec",
    "load_agent",
    "plain",
    "short_error",
]

STATUSES = ("ok", "error", "timeout", "no_requests")
# Characters of a failed agent's error (or a command's stderr) kept.
MAX_ERROR_CHARS = 2000


@dataclass
class AgentSpec:
    """A loaded agent: a callable or a command's argv (exactly one)."""

    fn: Callable[..., Any] | None = None
    argv: list[str] | None = None
    name: str = ""


def load_agent(program: Any = None, command: str | list[str] | None = None) -> AgentSpec:
    """The agent of ``rollout.agent``: ``program`` (a callable, ``module:function`` or
    ``path/to/file.py:function``) or ``command`` (a command line, split like a shell's,
    run without one). Raises ``ValueError`` naming the problem and the fix."""
    if (program is None) == (command is None or command == [] or command == ""):
        raise ValueError(
            "rollout.agent needs exactly one of program (module:function or "
            f"file.py:function) and command; got program={program!r}, command={command!r}"
        )
    if command:
        argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
        return AgentSpec(argv=argv, name=" ".join(argv))
    if callable(program):
        return AgentSpec(fn=program, name=getattr(program, "__qualname__", repr(program)))
    from verl.utils.import_path import is_import_path, resolve_import_path

    if not isinstance(program, str) or ":" not in program:
        raise ValueError(
            f"rollout.agent.program={program!r} must be module:function or file.py:function"
        )
    if is_import_path(program):
        fn = resolve_import_path(program)
    else:
        from verl.utils.file_import import load_callable

        path, name = program.rsplit(":", 1)
        _, fn = load_callable(
            path, name, "agent program file", "set rollout.agent.program to file.py:function"
        )
    if not callable(fn):
        raise TypeError(f"rollout.agent.program={program!r} is a {type(fn).__name__}, not callable")
    return AgentSpec(fn=fn, name=program)


@dataclass
class AgentRun:
    """One agent run: its task, session, thread (and process) and outcome."""

    row: int
    task: dict[str, Any]
    session: Session
    status: str = "pending"
    reward: Any = None
    error: str | None = None
    started: float = 0.0
    seconds: float = 0.0
    thread: threading.Thread | None = None
    process: subprocess.Popen | None = None
    done: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


def short_error(text: str) -> str:
    """``text`` cut to ``MAX_ERROR_CHARS`` characters."""
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


def plain(value: Any) -> Any:
    """numpy scalars / arrays in a task as plain Python (JSON-able where possible)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


class AgentRunner:
    """Starts, finishes and stops the agent runs of one rollout engine's endpoint.

    Args:
        agent: the agent every run calls.
        endpoint: the endpoint its requests go to; a run's key is closed there when the
            run is stopped, and a finished run wakes the rollout thread waiting on it.
    """

    def __init__(self, agent: AgentSpec, endpoint: OpenAIEndpoint) -> None:
        self.agent = agent
        self.endpoint = endpoint

    def start(self, run: AgentRun, base_url: str) -> None:
        """Run the agent of ``run`` in a daemon thread (a command: its process, from there)."""
        run.started = time.monotonic()
        run.status = "running"
        key = run.session.key
        target = self._call_fn if self.agent.fn is not None else self._call_command
        run.thread = threading.Thread(
            target=target,
            args=(run, base_url, key),
            daemon=True,
            name=f"verl-agent-{run.row}-{uuid.uuid4().hex[:6]}",
        )
        run.thread.start()

    def finish(self, run: AgentRun, status: str, reward: Any = None, error: str | None = None):
        """Record the outcome of ``run`` (the first one only) and wake the rollout thread."""
        with run.lock:
            if run.done.is_set():
                return
            run.status, run.reward, run.error = status, reward, error
            run.seconds = time.monotonic() - run.started
            run.done.set()
        self.endpoint.wake()

    def _call_fn(self, run: AgentRun, base_url: str, key: str) -> None:
        try:
            value = self.agent.fn(base_url, key, run.task)
            if inspect.iscoroutine(value):
                value = asyncio.run(value)
        except BaseException as exc:  # the agent's failure is counted, never raised
            self.finish(run, "error", error=short_error(f"{type(exc).__name__}: {exc}"))
            if not isinstance(exc, Exception):
                raise
            return
        self.finish(run, "ok", reward=plain(value))

    def _call_command(self, run: AgentRun, base_url: str, key: str) -> None:
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key}
        try:
            with run.lock:
                if run.cancelled:
                    return
                run.process = subprocess.Popen(
                    self.agent.argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                    text=True,
                    start_new_session=True,  # its own process group: killed as one
                )
            out, err = run.process.communicate(json.dumps(run.task, default=str))
        except OSError as exc:
            self.finish(run, "error", error=f"cannot run {self.agent.argv!r}: {exc}")
            return
        if run.process.returncode != 0:
            self.finish(
                run,
                "error",
                error=short_error(
                    f"exited with status {run.process.returncode}; stderr: {err[-1000:]!r}"
                ),
            )
            return
        lines = [line for line in out.splitlines() if line.strip()]
        try:
            value = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            value = lines
        if not lines or isinstance(value, list):
            self.finish(
                run,
                "error",
                error="the last line of its stdout is not JSON (print the reward, e.g. 1.0, "
                f'{{"score": 1.0}} or null); stdout ends {out[-200:]!r}',
            )
            return
        self.finish(run, "ok", reward=value)

    def stop(self, run: AgentRun) -> None:
        """Close the run's key; kill its command; mark it timed out if it still runs."""
        self.endpoint.close_session(run.session)
        if run.status == "pending":
            self.finish(run, "error", error="never started: the rollout stopped first")
        with run.lock:
            run.cancelled = True
            process = run.process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        if run.thread is not None and self.agent.argv is not None:
            run.thread.join(10.0)  # communicate() returns once the process is gone
        if process is not None:
            try:
                process.wait(10.0)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "agent command %s (pid %d) did not exit", self.agent.name, process.pid
                )
