"""Run untrusted Python (model-written code) in a limited subprocess for code rewards.

`run_python(code, stdin=...)` writes `code` to a fresh temporary directory and runs it with
`python -I -S`. Every run, whatever the kernel allows:

- has a wall-clock limit (`timeout_s`): on expiry the whole process group is killed;
- has resource limits: address space (`RLIMIT_AS`, `memory_mb`), CPU seconds
  (`RLIMIT_CPU`, a backstop for the wall clock), size of any file it writes
  (`RLIMIT_FSIZE`, `max_output_bytes`) and no core dumps;
- dies when the thread of the trainer that started it dies (`PR_SET_PDEATHSIG`, SIGKILL;
  the signal follows the starting *thread*, which is blocked in `run_python` meanwhile);
- has the temporary directory as working directory, `HOME` and `TMPDIR`, a minimal
  environment (`PATH`, `HOME`, `TMPDIR`, `LANG`), stdin from a file and stdout/stderr to
  files (a program printing forever cannot fill the trainer's memory); the directory is
  removed afterwards;
- has a disk quota on that directory (`max_disk_bytes`, `DEFAULT_MAX_DISK_FILES` entries;
  `verl.rewards.sandbox_dirs`):
  `RLIMIT_FSIZE` bounds each file, and the trainer measures the directory's allocated
  size every `DISK_POLL_S` while the run lasts and kills the run (status "output_limit")
  once it is over. This needs no privilege (a size-limited tmpfs would need a mount); a
  run can pass the quota by what it writes in one interval before it is killed. In the
  fallback the program can still write wherever the trainer's user can, outside it;
- leaves no directory behind: the directory's name holds the trainer's pid (and PID
  namespace), and the first run of a process removes those of trainers that no longer
  exist (killed with SIGKILL mid-run; `verl.rewards.sandbox_dirs.clean_stale_dirs`).

**Isolated mode** (`SandboxResult.isolated`; needs root or the equivalent capabilities in
the trainer's user namespace; probed once by `isolation()`): the run is started through
`sandbox_init.py`, which puts it in new PID, mount, IPC, network and UTS namespaces and
adds:

- a filesystem of only a tmpfs root with, read-only, the interpreter's prefix
  (`sys.base_prefix`: executable, standard library, `libpython`), the shared-library
  directories (`/usr/lib`, `/usr/lib64` or their equivalents) and `/etc/ld.so.cache`;
  read-write only the temporary directory (at its usual path); `/dev/{null,zero,random,
  urandom}`; and a `/proc` of its own PID namespace. The trainer's files, `/tmp`, `/home`,
  `/root` and `/work` are not there;
- no view of other processes: `/proc` lists only the run's own, so `/proc/<ppid>/environ`
  and the trainer's pid do not exist for it, and `kill` reaches nothing outside;
- an unprivileged uid/gid of its own (`uid_for_run`, ~1.5e9 + pid-derived, unused by any
  account), so it has no capabilities (no way out of the chroot, no raw sockets, no
  changing limits) and `RLIMIT_NPROC` (`max_processes`, threads included) counts only
  this run's processes: as root the limit would not apply at all;
- no network interface but a down loopback;
- a seccomp filter, when `libseccomp.so.2` is present (`SandboxResult.seccomp`), that
  refuses with EPERM `ptrace`, `process_vm_readv/writev`, `mount` and the new mount API,
  `chroot`, `pivot_root`, `unshare`, `setns`, `clone` with any new-namespace flag
  (`clone3` gets ENOSYS, so the C library falls back to `clone`), `bpf`, `perf_event_open`,
  `userfaultfd`, keyrings, module loading, `kexec`, `reboot` and clock setting;
- an init process (PID 1) that reaps the run's children and whose exit tears the PID
  namespace down: nothing the code starts (a `setsid()` daemon included) outlives the run;
- with `splice_only=(pipe, target)` (the code scorer's token pipe), seccomp also refuses
  every way to take data out of `pipe` except splicing it into `target`.

The program runs in the launcher's interpreter (started with the same `-I -S` flags, with a
fresh `__main__`), which saves a third interpreter start; limits, uid and filter are in
place before any of its code runs.

What it does not guarantee: a kernel bug is an escape (this is not a VM; run large-scale
untrusted code in a container or VM as well); the code can use its CPU and memory limits
fully and read the world-readable files of the bound directories; `kill` is confined by
the PID namespace and the uid, not by seccomp (a filter cannot tell pids apart).

**Fallback** (the kernel or the missing privileges refuse namespaces): logged once at
WARNING; the code runs as the trainer's user with the host filesystem and `/proc`, in a
new network namespace if that alone is allowed (`network_isolated`), else with the host
network. It then contains mistakes and runaway programs, not a hostile program.

Never raises for anything the code does: the outcome is a `SandboxResult` with `status`
one of "ok", "error" (non-zero exit), "timeout", "memory" (MemoryError or killed at the
address-space limit) or "output_limit".
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import logging
import marshal
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from verl.rewards.sandbox_dirs import (
    DEFAULT_MAX_DISK_BYTES,
    clean_stale_dirs_once,
    dir_prefix,
    wait_within_quota,
)

logger = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
STATUSES = ("ok", "error", "timeout", "memory", "output_limit")
DEFAULT_MAX_PROCESSES = 32  # processes + threads of one run (isolated mode)
SETUP_FAILED = 125  # sandbox_init.py's exit code when it cannot build the sandbox
_MAX_CAPTURE = 64 * 1024  # bytes of stdout/stderr read back into the result
_UID_BASE = 1_500_000_000
_RUNS = itertools.count()
_LAUNCHER = Path(__file__).with_name("sandbox_init.py")


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one sandboxed run."""

    status: str  # one of STATUSES
    returncode: int | None
    stdout: str
    stderr: str
    duration_s: float
    network_isolated: bool
    isolated: bool = False  # namespaces, private filesystem, own uid (module docstring)
    seccomp: bool = False  # the seccomp filter was installed

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class Isolation:
    """What `run_python` can enforce on this machine (see `isolation()`)."""

    namespaces: bool
    seccomp: bool
    reason: str = ""  # why namespaces are unavailable


@functools.lru_cache(maxsize=1)
def _libc():
    """libc, resolved in the parent: the child between fork and exec must not run a
    library search (which may itself start a process)."""
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _libc_unshare():
    libc = _libc()
    return getattr(libc, "unshare", None) if libc is not None else None


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


def _interpreter() -> str:
    return os.path.realpath(sys.executable)


def _filesystem_view() -> tuple[list[str], list[str]]:
    """(read-only bind mounts, symlinks to recreate) of the isolated filesystem."""
    prefix = os.path.realpath(sys.base_prefix)
    read_only, links = [prefix], []
    for path in ("/lib", "/lib64", "/lib32", "/usr/lib", "/usr/lib64", "/usr/lib32"):
        if os.path.islink(path):
            links.append(path)
        elif os.path.isdir(path) and not any(path.startswith(p + "/") for p in read_only):
            read_only.append(path)
    exe = _interpreter()
    if not exe.startswith(prefix + "/"):
        read_only.append(exe)
    if os.path.exists("/etc/ld.so.cache"):
        read_only.append("/etc/ld.so.cache")
    return read_only, links


def uid_for_run() -> int:
    """An unprivileged uid no account uses, distinct across concurrent runs on this host
    (trainer pid x per-process counter), so `RLIMIT_NPROC` counts one run's processes."""
    return _UID_BASE + (os.getpid() % (1 << 20)) * 256 + next(_RUNS) % 256


def _limits(memory_mb: int, cpu_s: int, max_output_bytes: int, max_processes: int | None):
    wanted = {
        resource.RLIMIT_AS: (memory_mb * 1024 * 1024,) * 2,
        resource.RLIMIT_CPU: (cpu_s, cpu_s + 1),
        resource.RLIMIT_FSIZE: (max_output_bytes,) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    if max_processes is not None:
        wanted[resource.RLIMIT_NPROC] = (max_processes,) * 2
    limits = {}  # computed in the parent; never above the current hard limits
    for kind, (soft, hard) in wanted.items():
        current = resource.getrlimit(kind)[1]
        if current != resource.RLIM_INFINITY:
            soft, hard = min(soft, current), min(hard, current)
        limits[kind] = (soft, hard)
    return limits


def _fallback_child(limits: dict, isolate_network: bool):
    unshare = _libc_unshare() if isolate_network else None
    prctl = getattr(_libc(), "prctl", None)
    parent = os.getpid()

    def preexec() -> None:
        # Runs in the child between fork and exec: no imports, no lookups, no processes.
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if os.getppid() != parent:
                os._exit(SETUP_FAILED)
        if isolate_network and not _unshare_network(unshare):
            os._exit(SETUP_FAILED)
        for kind, pair in limits.items():
            resource.setrlimit(kind, pair)

    return preexec


def _isolated_argv(
    workdir: str,
    argv: list[str],
    limits: dict,
    seccomp: bool,
    splice_only: tuple[int, int] | None = None,
) -> list[str]:
    read_only, links = _filesystem_view()
    uid = uid_for_run()
    os.chown(workdir, uid, uid)
    config = {
        "parent_pid": os.getpid(),
        "root": os.path.join(workdir, ".root"),
        "workdir": workdir,
        "read_only": read_only,
        "links": links,
        "uid": uid,
        "gid": uid,
        "limits": [[kind, *pair] for kind, pair in limits.items()],
        "seccomp": seccomp,
        "splice_only": list(splice_only) if splice_only else None,
        "in_process": True,
        "argv": argv,
    }
    os.mkdir(config["root"])
    return [_interpreter(), "-I", "-S", "-c", _launcher_source(), marshal.dumps(config).hex()]


@functools.lru_cache(maxsize=1)
def _launcher_source() -> str:
    return _LAUNCHER.read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def _probe_isolation() -> Isolation:
    code = "print(open('/proc/self/status').read())"
    try:
        result = _run([_interpreter(), "-I", "-S", "-c", code], "", 30.0, 256, 1 << 20,
                      namespaces=True, seccomp=True, isolate_network=False)  # fmt: skip
    except OSError as exc:
        return Isolation(False, False, f"cannot start the sandbox launcher: {exc}")
    if not result.ok:
        reason = result.stderr.strip().splitlines()[-1:] or [f"exit code {result.returncode}"]
        return Isolation(False, False, reason[0])
    status = dict(line.split(":", 1) for line in result.stdout.splitlines() if ":" in line)
    return Isolation(True, status.get("Seccomp", "").strip() == "2")


def isolation() -> Isolation:
    """What the sandbox enforces here, probed once with a trivial run (and logged)."""
    found = _probe_isolation() if _libc_unshare() else Isolation(False, False, "no unshare()")
    if not found.namespaces:
        _warn_once(
            "code sandbox: namespaces are refused here (%s); sandboxed code runs as the "
            "trainer's user and can see its files and processes (docs/reliability.md)",
            found.reason,
        )
    elif not found.seccomp:
        _warn_once("code sandbox: libseccomp.so.2 not found; isolated runs have no seccomp filter")
    return found


@functools.cache
def _warn_once(message: str, *args: object) -> None:
    logger.warning(message, *args)


def _read(f) -> str:
    f.seek(0)
    return f.read(_MAX_CAPTURE).decode("utf-8", errors="replace")


def run_python(
    code: str,
    stdin: str = "",
    *,
    timeout_s: float = 5.0,
    memory_mb: int = 1024,
    max_output_bytes: int = 1 << 20,
    max_processes: int = DEFAULT_MAX_PROCESSES,
    max_disk_bytes: int = DEFAULT_MAX_DISK_BYTES,
    isolate_network: bool = True,
    runner: str | None = None,
    runner_args: Sequence[str] = (),
    pass_fds: Sequence[int] = (),
    splice_only: tuple[int, int] | None = None,
) -> SandboxResult:
    """Run `code` with `stdin` under the limits described in the module docstring.

    Args:
        code: Python source to run as a script.
        stdin: text fed to the program's standard input.
        timeout_s: wall-clock seconds before the process group is killed.
        memory_mb: address-space limit (`RLIMIT_AS`) in MiB; the interpreter itself needs
            some tens of MiB.
        max_output_bytes: largest file (including captured stdout/stderr) it may write.
        max_processes: `RLIMIT_NPROC` (processes and threads) in isolated mode; not applied
            in the fallback, where it would count all of the trainer's user's processes.
        max_disk_bytes: quota of the run's directory (allocated bytes, all files together);
            the run is killed with status "output_limit" when it is passed.
        isolate_network: put the child in an empty network namespace when possible (only
            the fallback honours False; isolated runs never have a network).
        runner: Python source run with `-c` instead of running `code` as the script; it gets
            the script's path as `sys.argv[1]`, then `runner_args` (the code scorer's test
            harness uses this).
        runner_args: further arguments for `runner`.
        pass_fds: descriptors of this process the child inherits (see `subprocess.Popen`).
        splice_only: `(pipe, target)`, two of `pass_fds`: with the seccomp filter, the
            program can take data out of `pipe` only by splicing it into `target` (no read,
            copy or duplicate of `pipe`); the code scorer's token pipe. Not enforced
            without seccomp (`SandboxResult.seccomp` False).
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s} must be > 0 seconds")
    if memory_mb < 64:
        raise ValueError(f"memory_mb={memory_mb} is too small for a Python interpreter (>= 64)")
    if max_processes < 1:
        raise ValueError(f"max_processes={max_processes} must be >= 1")
    if max_disk_bytes < 1:
        raise ValueError(f"max_disk_bytes={max_disk_bytes} must be >= 1")
    clean_stale_dirs_once()
    found = isolation()
    with tempfile.TemporaryDirectory(prefix=dir_prefix(), ignore_cleanup_errors=True) as tmp:
        script = os.path.join(tmp, "solution.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(code)
        argv = [_interpreter(), "-I", "-S"]
        argv += [script] if runner is None else ["-c", runner, script, *runner_args]
        return _run(argv, stdin, timeout_s, memory_mb, max_output_bytes, tmp=tmp,
                    namespaces=found.namespaces, seccomp=found.seccomp,
                    isolate_network=isolate_network, max_processes=max_processes,
                    pass_fds=pass_fds, splice_only=splice_only,
                    max_disk_bytes=max_disk_bytes)  # fmt: skip


def _run(
    argv: list[str],
    stdin: str,
    timeout_s: float,
    memory_mb: int,
    max_output_bytes: int,
    *,
    namespaces: bool,
    seccomp: bool,
    isolate_network: bool,
    tmp: str | None = None,
    max_processes: int = DEFAULT_MAX_PROCESSES,
    pass_fds: Sequence[int] = (),
    splice_only: tuple[int, int] | None = None,
    max_disk_bytes: int = DEFAULT_MAX_DISK_BYTES,
) -> SandboxResult:
    if tmp is None:  # the probe
        with tempfile.TemporaryDirectory(prefix=dir_prefix(), ignore_cleanup_errors=True) as t:
            return _run(argv, stdin, timeout_s, memory_mb, max_output_bytes, tmp=t,
                        namespaces=namespaces, seccomp=seccomp, isolate_network=False)  # fmt: skip
    start = time.monotonic()
    cpu_s = max(1, int(timeout_s) + 1)
    netns = namespaces or (isolate_network and network_isolation_available())
    env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8"}
    status = "ok"
    # stdout/stderr: unlinked files held by descriptor, out of the program's reach by name
    with (
        tempfile.TemporaryFile() as fin,
        tempfile.TemporaryFile() as fout,
        tempfile.TemporaryFile() as ferr,
    ):
        fin.write(stdin.encode("utf-8"))
        fin.seek(0)
        if namespaces:
            limits = _limits(memory_mb, cpu_s, max_output_bytes, max_processes)
            argv, preexec = _isolated_argv(tmp, argv, limits, seccomp, splice_only), None
        else:
            limits = _limits(memory_mb, cpu_s, max_output_bytes, None)
            preexec = _fallback_child(limits, netns)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=fin,
                stdout=fout,
                stderr=ferr,
                pass_fds=tuple(pass_fds),
                cwd=tmp,
                env=env,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            return SandboxResult("error", None, "", f"cannot start sandbox: {exc}", 0.0, netns)
        quota = None
        try:
            ended, quota = wait_within_quota(proc, timeout_s, tmp, max_disk_bytes)
            if quota is not None:
                status = "output_limit"
            elif not ended:
                status = "timeout"
        finally:
            # Kill the whole session: the launcher, init and whatever the program forked
            # (in isolated mode init's death also ends the PID namespace).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            returncode = proc.wait()
        stdout, stderr = _read(fout), _read(ferr)
    if quota is not None:
        stderr += f"\n[verl sandbox] killed: {quota} (the run's directory quota)\n"
    if returncode == SETUP_FAILED and "verl sandbox setup failed" in stderr:
        logger.warning("code sandbox: %s", stderr.strip().splitlines()[-1])
    duration = time.monotonic() - start
    if status == "ok" and returncode != 0:
        status = _classify(returncode, stderr)
    return SandboxResult(status, returncode, stdout, stderr, duration, netns, namespaces, seccomp)


def _classify(returncode: int, stderr: str) -> str:
    if returncode == -signal.SIGXCPU or returncode == -signal.SIGKILL:
        return "timeout"
    if returncode == -signal.SIGXFSZ or "File too large" in stderr:
        return "output_limit"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return "memory"
    return "error"
