"""Run untrusted Python (model-written code) in a limited subprocess for code rewards.

`run_python(code, stdin=...)` writes `code` to a fresh temporary directory and runs it with
`python -I` in a child process that:

- has a wall-clock limit (`timeout_s`): on expiry the whole process group is killed;
- has resource limits set before `exec` (`resource.setrlimit`): address space
  (`RLIMIT_AS`, `memory_mb`), CPU seconds (`RLIMIT_CPU`, a backstop for the wall clock),
  size of any file it writes (`RLIMIT_FSIZE`, `max_output_bytes`) and no core dumps;
- runs in its own session (`setsid`), so a fork bomb's children die with it on timeout;
- has no network when the kernel allows it: the child enters a new, empty network
  namespace (`unshare(CLONE_NEWNET)`, needs root or unprivileged user namespaces). Where
  that is refused the code runs with the host network, `SandboxResult.network_isolated`
  is False and a warning is logged once. This is the documented limitation of the sandbox;
  it is not a security boundary against a determined attacker (no seccomp, same user);
- has the temporary directory as working directory, `HOME` and `TMPDIR`, a minimal
  environment, stdin from a file and stdout/stderr to files in that directory (so a
  program printing forever cannot fill the trainer's memory). The directory is removed
  afterwards, whatever happened.

Never raises for anything the code does: the outcome is a `SandboxResult` with `status`
one of "ok", "error" (non-zero exit), "timeout", "memory" (MemoryError or killed at the
address-space limit) or "output_limit".
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
STATUSES = ("ok", "error", "timeout", "memory", "output_limit")
_MAX_CAPTURE = 64 * 1024  # bytes of stdout/stderr read back into the result


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed run."""

    status: str  # one of STATUSES
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    network_isolated: bool

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@functools.lru_cache(maxsize=1)
def _libc_unshare():
    """libc's `unshare`, resolved in the parent: the child between fork and exec must not
    run a library search (which may itself start a process)."""
    try:
        return ctypes.CDLL(None, use_errno=True).unshare
    except (OSError, AttributeError):
        return None


def _unshare_network(unshare) -> bool:
    """Move the calling process into a new network namespace; False if refused."""
    return unshare is not None and unshare(CLONE_NEWNET) == 0


def _probe_child(unshare):
    def preexec() -> None:  # fail the probe's exec if unshare is refused
        if not _unshare_network(unshare):
            raise OSError("unshare(CLONE_NEWNET) refused")

    return preexec


@functools.lru_cache(maxsize=1)
def network_isolation_available() -> bool:
    """Whether a child can be put in an empty network namespace here (probed once)."""
    try:
        subprocess.run(
            [sys.executable, "-I", "-c", "pass"],
            preexec_fn=_probe_child(_libc_unshare()),
            check=True,
            timeout=30,
            capture_output=True,
        )
    except (OSError, subprocess.SubprocessError):
        logger.warning(
            "code sandbox: cannot create a network namespace (unshare(CLONE_NEWNET) is not "
            "permitted here); sandboxed code runs WITH network access"
        )
        return False
    return True


def _limit_child(memory_mb: int, cpu_s: int, max_output_bytes: int, isolate_network: bool):
    unshare = _libc_unshare() if isolate_network else None
    wanted = {
        resource.RLIMIT_AS: (memory_mb * 1024 * 1024,) * 2,
        resource.RLIMIT_CPU: (cpu_s, cpu_s + 1),
        resource.RLIMIT_FSIZE: (max_output_bytes,) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    limits = {}  # computed in the parent; never above the current hard limits
    for kind, (soft, hard) in wanted.items():
        current = resource.getrlimit(kind)[1]
        if current != resource.RLIM_INFINITY:
            soft, hard = min(soft, current), min(hard, current)
        limits[kind] = (soft, hard)

    def preexec() -> None:
        # Runs in the child between fork and exec: no imports, no lookups, no processes.
        if isolate_network and not _unshare_network(unshare):
            os._exit(125)
        for kind, pair in limits.items():
            resource.setrlimit(kind, pair)

    return preexec


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_CAPTURE).decode("utf-8", errors="replace")
    except OSError:
        return ""


def run_python(
    code: str,
    stdin: str = "",
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 1024,
    max_output_bytes: int = 1 << 20,
    isolate_network: bool = True,
    runner: str | None = None,
    runner_args: Sequence[str] = (),
    pass_fds: Sequence[int] = (),
) -> SandboxResult:
    """Run `code` with `stdin` under the limits described in the module docstring.

    Args:
        code: Python source to run as a script.
        stdin: text fed to the program's standard input.
        timeout_s: wall-clock seconds before the process group is killed.
        memory_mb: address-space limit (`RLIMIT_AS`) in MiB; the interpreter itself needs
            some tens of MiB.
        max_output_bytes: largest file (including captured stdout/stderr) it may write.
        isolate_network: put the child in an empty network namespace when possible.
        runner: Python source run with `-c` instead of running `code` as the script; it gets
            the script's path as `sys.argv[1]`, then `runner_args` (the code scorer's test
            harness uses this).
        runner_args: further arguments for `runner`.
        pass_fds: descriptors of this process the child inherits (see `subprocess.Popen`).
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s} must be > 0 seconds")
    if memory_mb < 64:
        raise ValueError(f"memory_mb={memory_mb} is too small for a Python interpreter (>= 64)")
    netns = isolate_network and network_isolation_available()
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="verl-sandbox-", ignore_cleanup_errors=True) as tmp:
        script = os.path.join(tmp, "solution.py")
        paths = {name: os.path.join(tmp, f".{name}") for name in ("stdin", "stdout", "stderr")}
        with open(script, "w", encoding="utf-8") as f:
            f.write(code)
        with open(paths["stdin"], "w", encoding="utf-8") as f:
            f.write(stdin)
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8"}
        cpu_s = max(1, int(timeout_s) + 1)
        status = "ok"
        with (
            open(paths["stdin"], "rb") as fin,
            open(paths["stdout"], "wb") as fout,
            open(paths["stderr"], "wb") as ferr,
        ):
            try:
                argv = [sys.executable, "-I", "-S"]
                argv += [script] if runner is None else ["-c", runner, script, *runner_args]
                proc = subprocess.Popen(
                    argv,
                    pass_fds=tuple(pass_fds),
                    stdin=fin,
                    stdout=fout,
                    stderr=ferr,
                    cwd=tmp,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_limit_child(memory_mb, cpu_s, max_output_bytes, netns),
                )
            except (OSError, subprocess.SubprocessError) as exc:
                return SandboxResult("error", None, "", f"cannot start sandbox: {exc}", 0.0, netns)
            try:
                returncode = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                status = "timeout"
            finally:
                # Kill the whole session: also children the program forked.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                returncode = proc.wait()
        stdout, stderr = _read(paths["stdout"]), _read(paths["stderr"])
    duration = time.monotonic() - start
    if status == "ok" and returncode != 0:
        status = _classify(returncode, stderr)
    return SandboxResult(status, returncode, stdout, stderr, duration, netns)


def _classify(returncode: int, stderr: str) -> str:
    if returncode == -signal.SIGXCPU or returncode == -signal.SIGKILL:
        return "timeout"
    if returncode == -signal.SIGXFSZ or "File too large" in stderr:
        return "output_limit"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return "memory"
    return "error"
