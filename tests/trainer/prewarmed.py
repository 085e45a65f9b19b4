"""Child processes forked from one pre-imported parent, for tests that start many short-lived
runs of a script (the chaos tests start a dozen, each killed and resumed; the driver-signal
tests one driver per test).

A fresh Python that imports torch and transformers spends ~5 s before the run starts. A
``Prewarmed`` parent imports the given modules once (and runs nothing else: no torch op, no
thread of its own; the one thread numpy's OpenBLAS starts at import is not copied by fork,
and OpenBLAS starts it again in the child when first used), then forks one child per
``run`` (to its end) or ``start`` (a ``Child`` read like a ``subprocess.Popen``, to signal
or kill while it runs): the child is a new process (its own pid, memory and file
descriptors) that runs the script as ``python script args...`` (or a module as
``python -m module args...``) would, as ``__main__``, and ends as the interpreter's exit
does up to its finalisation (non-daemon threads joined, atexit handlers run, the standard
streams flushed, the exit status ``SystemExit`` gives) but without tearing down the modules,
seconds for torch's and transformers' (a file a run leaves unclosed is not flushed: a
failure here, never a pass); a signal sent to its pid reaches it alone, a SIGKILL kills it
alone. What the child starts (reward workers, tool threads) is its own. At the end of its
input the parent exits at once (it ran nothing to finish).

The parent's environment, and so every child's, is the ``env`` given (``start`` can give a
child another ``os.environ``); ``/proc/<pid>/environ`` of a forked child is its parent's, so
a test that finds a run's processes by an environment mark must leave the parent out
(``Prewarmed.pid``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tests.prewarmed_python import RUN_AS_PYTHON

# The parent: import the modules named in argv, then fork one child per request line
# {"argv", "cwd", "stderr"} (and "env": the child's os.environ, "setsid": a new session, when
# given); answer {"pid"} when forked and {"returncode"} when it ended (negative: killed by
# that signal, as subprocess reports it).
_PARENT = (
    RUN_AS_PYTHON
    + r"""
import json, os, sys

for name in sys.argv[1:]:
    __import__(name)
requests, answers = sys.stdin, sys.stdout
for line in requests:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        if req.get("setsid"):
            os.setsid()
        os.chdir(req["cwd"])
        if "env" in req:
            os.environ.clear()
            os.environ.update(req["env"])
        null = os.open(os.devnull, os.O_RDWR)
        err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(err, 2)
        os.close(null)
        os.close(err)
        sys.stdin, sys.stdout = open(0, closefd=False), open(1, "w", closefd=False)
        run_as_python(list(req["argv"]), set_path=False)
    answers.write(json.dumps({"pid": pid}) + "\n")
    answers.flush()
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    answers.write(json.dumps({"returncode": code}) + "\n")
    answers.flush()
# End of input: no child left to wait for. Exit without the interpreter's teardown of torch's
# and transformers' modules (seconds, for a process that ran nothing).
os._exit(0)
"""
)


class Prewarmed:
    """``with Prewarmed(modules, env, cwd) as parent: parent.run([script, *args], ...)``."""

    def __init__(self, modules: Sequence[str], env: dict[str, str], cwd: Path) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _PARENT, *modules],
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self.pid = self._proc.pid
        self._read = b""  # answers read from the pipe, not yet taken

    def __enter__(self) -> Prewarmed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _answer(self, deadline_s: float, child: int | None) -> dict:
        """The parent's next answer line, waiting up to ``deadline_s`` (0: only one already
        here); on timeout ``child`` is killed and ``TimeoutExpired`` raised."""
        fd = self._proc.stdout.fileno()
        end = time.monotonic() + deadline_s
        while b"\n" not in self._read:
            ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            if not ready:
                if child is not None:
                    with contextlib.suppress(OSError):
                        os.kill(child, signal.SIGKILL)
                raise subprocess.TimeoutExpired(str(child), deadline_s)
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise RuntimeError(f"the prewarmed parent ended (exit {self._proc.wait()})")
            self._read += chunk
        line, self._read = self._read.split(b"\n", 1)
        return json.loads(line)

    def start(
        self,
        argv: Sequence[str],
        cwd: Path,
        stderr: Path,
        timeout: float = 300,
        env: dict[str, str] | None = None,
        start_new_session: bool = False,
    ) -> Child:
        """Fork a child that runs ``python argv...`` (a script, or ``-m module``) in ``cwd``,
        with ``env`` as its ``os.environ`` when given (``/proc/<pid>/environ`` stays the
        parent's) and in a session of its own with ``start_new_session``; its stdout is discarded, its stderr written to ``stderr``. Returns once the
        child is forked (``timeout``: for the parent's imports, on the first call). Start the
        next child only after this one ended: the parent waits on one at a time."""
        request = {"argv": [str(a) for a in argv], "cwd": str(cwd), "stderr": str(stderr)}
        if env is not None:
            request["env"] = dict(env)
        if start_new_session:
            request["setsid"] = True
        self._proc.stdin.write(json.dumps(request).encode() + b"\n")
        self._proc.stdin.flush()
        pid = self._answer(timeout, None)["pid"]
        return Child(self, pid, list(argv), Path(stderr))

    def run(
        self, argv: Sequence[str], cwd: Path, stderr: Path, timeout: float
    ) -> subprocess.CompletedProcess:
        """Run ``python argv...`` (a script, or ``-m module``) as a forked child in ``cwd``; its stdout is discarded, its
        stderr written to ``stderr`` and returned as bytes. Raises ``TimeoutExpired`` (the
        child killed) after ``timeout`` seconds, like ``subprocess.run``."""
        child = self.start(argv, cwd, stderr, timeout)
        code = child.wait(timeout)
        return subprocess.CompletedProcess(list(argv), code, None, child.stderr_bytes())

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()  # the parent's loop ends at end of input
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


class Child:
    """A child forked by ``Prewarmed.start``, read like a ``subprocess.Popen``: ``pid``,
    ``returncode`` (negative: killed by that signal), ``poll``, ``wait``, ``send_signal``,
    ``kill``, and ``communicate`` (no stdout; the stderr written so far, as bytes)."""

    def __init__(self, parent: Prewarmed, pid: int, argv: list[str], stderr: Path) -> None:
        self._parent, self.pid, self.args, self._stderr = parent, pid, argv, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.returncode = self._parent._answer(0, None)["returncode"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; ``TimeoutExpired`` after ``timeout`` seconds (the child killed)."""
        if self.returncode is None:
            deadline = 1e9 if timeout is None else timeout
            self.returncode = self._parent._answer(deadline, self.pid)["returncode"]
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[None, bytes]:
        self.wait(timeout)
        return None, self.stderr_bytes()

    def stderr_bytes(self) -> bytes:
        return self._stderr.read_bytes() if self._stderr.exists() else b""

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
