"""Child processes forked from one pre-imported parent, for tests that start many short-lived
runs of a script (the chaos tests start a dozen, each killed and resumed).

A fresh Python that imports torch and transformers spends ~5 s before the run starts. A
``Prewarmed`` parent imports the given modules once (and runs nothing else: no torch op, no
thread of its own; the one thread numpy's OpenBLAS starts at import is not copied by fork,
and OpenBLAS starts it again in the child when first used), then forks one child per ``run``: the child is a new process (its own pid, memory
and file descriptors) that runs the script as ``python script args...`` (or a module as
``python -m module args...``) would, as ``__main__``, and ends through the normal interpreter exit (atexit handlers run); a SIGKILL
kills it alone. What the child starts (reward workers, tool threads) is its own.

The parent's environment, and so every child's, is the ``env`` given; ``/proc/<pid>/environ``
of a forked child is its parent's, so a test that finds a run's processes by an environment
mark must leave the parent out (``Prewarmed.pid``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

# The parent: import the modules named in argv, then fork one child per request line
# {"argv", "cwd", "stderr"}; answer {"pid"} when forked and {"returncode"} when it ended
# (negative: killed by that signal, as subprocess reports it).
_PARENT = r"""
import json, os, runpy, sys, traceback

for name in sys.argv[1:]:
    __import__(name)
requests, answers = sys.stdin, sys.stdout
for line in requests:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.chdir(req["cwd"])
        null = os.open(os.devnull, os.O_RDWR)
        err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(err, 2)
        os.close(null)
        os.close(err)
        sys.stdin, sys.stdout = open(0, closefd=False), open(1, "w", closefd=False)
        argv = list(req["argv"])
        try:
            if argv[0] == "-m":  # python -m module args...
                sys.argv = argv[1:]
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = argv
                runpy.run_path(argv[0], run_name="__main__")
        except SystemExit:
            raise
        except BaseException:
            traceback.print_exc()
            sys.exit(1)
        sys.exit(0)  # the interpreter's normal exit, as `python script` ends
    answers.write(json.dumps({"pid": pid}) + "\n")
    answers.flush()
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    answers.write(json.dumps({"returncode": code}) + "\n")
    answers.flush()
"""


class Prewarmed:
    """``with Prewarmed(modules, env, cwd) as parent: parent.run([script, *args], ...)``."""

    def __init__(self, modules: Sequence[str], env: dict[str, str], cwd: Path) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _PARENT, *modules],
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self._proc.pid

    def __enter__(self) -> Prewarmed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _answer(self, deadline_s: float, child: int | None) -> dict:
        ready, _, _ = select.select([self._proc.stdout], [], [], deadline_s)
        if not ready:
            if child is not None:
                with contextlib.suppress(OSError):
                    os.kill(child, signal.SIGKILL)
            raise subprocess.TimeoutExpired(str(child), deadline_s)
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the prewarmed parent ended (exit {self._proc.wait()})")
        return json.loads(line)

    def run(
        self, argv: Sequence[str], cwd: Path, stderr: Path, timeout: float
    ) -> subprocess.CompletedProcess:
        """Run ``python argv...`` (a script, or ``-m module``) as a forked child in ``cwd``; its stdout is discarded, its
        stderr written to ``stderr`` and returned as bytes. Raises ``TimeoutExpired`` (the
        child killed) after ``timeout`` seconds, like ``subprocess.run``."""
        request = {"argv": [str(a) for a in argv], "cwd": str(cwd), "stderr": str(stderr)}
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        pid = self._answer(timeout, None)["pid"]  # the first one waits for the imports
        code = self._answer(timeout, pid)["returncode"]
        return subprocess.CompletedProcess(list(argv), code, None, Path(stderr).read_bytes())

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()  # the parent's loop ends at end of input
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
