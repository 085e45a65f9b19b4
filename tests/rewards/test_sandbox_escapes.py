"""Escapes from the code sandbox (issue 20, item 5), each tried from a disposable "trainer"
process (never pytest itself): read the trainer's secrets, kill it, leave a process behind,
write outside the temporary directory, and the kernel features the filter refuses.

Each asserts the escape fails when isolation is available and is skipped, with the kernel's
reason, where namespaces are refused (the documented fallback)."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from verl.rewards import sandbox

ROOT = Path(__file__).resolve().parents[2]
FOUND = sandbox.isolation()
needs_isolation = pytest.mark.skipif(
    not FOUND.namespaces, reason=f"kernel refuses sandbox namespaces: {FOUND.reason}"
)
needs_seccomp = pytest.mark.skipif(
    not FOUND.seccomp, reason="no seccomp filter here (namespaces refused or no libseccomp)"
)
SECRET = "verl-test-secret-7d1c"
ESCAPEE = "verl-escapee"  # process name of the children the escape attempts leave behind

TRAINER = """
import json, os, sys
from verl.rewards.sandbox import run_python
code = sys.stdin.read()
print("trainer pid", os.getpid(), flush=True)
r = run_python(code.replace("TRAINER_PID", str(os.getpid())), timeout_s=float(sys.argv[1]))
print(json.dumps({"status": r.status, "stdout": r.stdout, "stderr": r.stderr,
                  "isolated": r.isolated, "seccomp": r.seccomp}), flush=True)
"""


def run_in_trainer(code: str, timeout_s: float = 10.0) -> tuple[subprocess.CompletedProcess, dict]:
    """Run `code` in the sandbox from a fresh trainer process holding SECRET in its env."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VERL_API_KEY": SECRET}
    proc = subprocess.run(
        [sys.executable, "-c", TRAINER, str(timeout_s)],
        input=textwrap.dedent(code),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "{}"
    return proc, json.loads(last) if last.startswith("{") else {}


def escapees() -> list[int]:
    """Pids of live processes named ESCAPEE (killed by the test if any: leave nothing)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            name = Path(f"/proc/{entry}/comm").read_text().strip()
        except OSError:
            continue
        if entry.isdigit() and name == ESCAPEE:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] != "Z":
                pids.append(int(entry))
    return pids


@pytest.fixture
def no_escapees():
    yield
    for pid in escapees():
        os.kill(pid, signal.SIGKILL)


NAME_ME = f"""
import ctypes
ctypes.CDLL(None).prctl(15, b"{ESCAPEE}", 0, 0, 0)  # PR_SET_NAME
"""


@needs_isolation
def test_cannot_read_the_trainers_environment():
    code = f"""
    import os
    found = []
    for pid in ["TRAINER_PID", str(os.getppid())] + os.listdir("/proc"):
        for name in ("environ", "cmdline"):
            try:
                if b"{SECRET}" in open(f"/proc/{{pid}}/{{name}}", "rb").read():
                    found.append(f"{{pid}}/{{name}}")
            except OSError:
                pass
    print("found", found)
    print("visible pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
    print("env", dict(os.environ))
    """
    proc, result = run_in_trainer(code)
    assert result["status"] == "ok", (proc.stderr, result)
    assert result["isolated"]
    assert "found []" in result["stdout"]
    assert SECRET not in result["stdout"]
    # only the sandbox's own processes: its init (1) and itself (2)
    assert "visible pids [1, 2]" in result["stdout"]


@needs_isolation
def test_cannot_kill_the_trainer():
    code = """
    import os, signal
    for pid in (TRAINER_PID, os.getppid()):
        try:
            os.kill(pid, signal.SIGKILL)
            print("killed", pid)
        except OSError as exc:
            print("refused", pid, type(exc).__name__)
    """
    proc, result = run_in_trainer(code)
    assert proc.returncode == 0, proc.stderr  # the trainer lived to report
    assert result["status"] == "ok" and "refused" in result["stdout"]


@needs_isolation
def test_setsid_child_does_not_outlive_the_sandbox(no_escapees):
    code = NAME_ME.replace("ctypes.CDLL", "def name_me(): ctypes.CDLL") + (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        name_me()\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(0.5)\n"
        "print('parent done')\n"
    )
    proc, result = run_in_trainer(code)
    assert result["status"] == "ok" and "parent done" in result["stdout"], proc.stderr
    deadline = time.monotonic() + 5
    while escapees() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert escapees() == []


@needs_isolation
def test_sandbox_dies_with_its_trainer(no_escapees):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = NAME_ME + "import time\ntime.sleep(600)\n"
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, "600"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        trainer.stdin.write(code)
        trainer.stdin.close()
        deadline = time.monotonic() + 120  # the sandbox starts slowly on a loaded machine
        while not escapees() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert escapees(), "the sandboxed program never started"
    finally:
        trainer.kill()
        trainer.wait()
        trainer.stdout.close()
    deadline = time.monotonic() + 10
    while escapees() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert escapees() == []


@needs_isolation
def test_cannot_write_outside_its_directory(tmp_path):
    outside = tmp_path / "escape.txt"
    os.chmod(tmp_path, 0o777)  # even a world-writable host directory stays out of reach
    targets = [
        outside,
        Path(f"/tmp/verl-escape-{os.getpid()}.txt"),
        Path(sys.base_prefix, f"verl-escape-{os.getpid()}.txt"),
    ]
    try:
        _try_writes(targets)
    finally:  # had the escape worked, leave nothing behind
        for path in targets:
            path.unlink(missing_ok=True)


def _try_writes(targets: list[Path]) -> None:
    code = f"""
    import os
    for path in {[str(t) for t in targets]!r}:
        try:
            open(path, "w").write("x")
            print("wrote", path)
        except OSError as exc:
            print("refused", path, type(exc).__name__)
    open("inside.txt", "w").write("ok")
    print("cwd ok")
    """
    proc, result = run_in_trainer(code)
    assert result["status"] == "ok" and "cwd ok" in result["stdout"], proc.stderr
    assert "wrote" not in result["stdout"]
    assert not any(path.exists() for path in targets)


@needs_isolation
def test_filesystem_holds_only_the_interpreter_and_libraries():
    code = """
    import os
    print(sorted(os.listdir("/")))
    for path in ("/work", "/root/.ssh", "/etc/passwd", "/home"):
        print(path, os.path.exists(path))
    """
    result = sandbox.run_python(textwrap.dedent(code))
    assert result.ok, result.stderr
    lines = result.stdout.splitlines()
    assert set(eval(lines[0])) <= {
        "dev",
        "etc",
        "lib",
        "lib64",
        "lib32",
        "proc",
        "root",
        "tmp",
        "usr",
    }
    assert all(line.endswith("False") for line in lines[1:]), lines


@needs_isolation
def test_process_count_is_limited():
    code = """
    import os, time
    children = 0
    try:
        for _ in range(200):
            pid = os.fork()
            if pid == 0:
                time.sleep(5)
                os._exit(0)
            children += 1
    except OSError as exc:
        print("stopped", type(exc).__name__)
    print("children", children)
    """
    result = sandbox.run_python(textwrap.dedent(code), max_processes=16, timeout_s=20)
    assert result.ok, result.stderr
    assert "stopped BlockingIOError" in result.stdout  # EAGAIN from RLIMIT_NPROC
    children = int(result.stdout.split("children")[1])
    assert 5 <= children < 16


@needs_seccomp
def test_seccomp_refuses_ptrace_mount_and_new_namespaces():
    code = """
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    def attempt(name, result):
        print(name, "refused" if result != 0 else "ALLOWED", os.strerror(ctypes.get_errno()))
    attempt("ptrace", libc.ptrace(0, 0, None, None))                 # PTRACE_TRACEME
    attempt("mount", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
    attempt("unshare-user", libc.unshare(0x10000000))                # CLONE_NEWUSER
    attempt("unshare-net", libc.unshare(0x40000000))
    """
    result = sandbox.run_python(textwrap.dedent(code))
    assert result.ok and result.seccomp, result.stderr
    for name in ("ptrace", "mount", "unshare-user", "unshare-net"):
        assert f"{name} refused Operation not permitted" in result.stdout, result.stdout
    if platform.machine() != "x86_64":
        return  # the raw clone below uses x86_64's syscall number
    # new namespaces through clone(2) itself (what fork-like calls use)
    clone = """
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    r = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWUSER | SIGCHLD)
    if r == 0:
        os._exit(0)
    print("clone", r, os.strerror(ctypes.get_errno()))
    """
    result = sandbox.run_python(textwrap.dedent(clone))
    assert "clone -1 Operation not permitted" in result.stdout, (result.stdout, result.stderr)


def test_fallback_is_logged_and_still_runs(monkeypatch, caplog):
    monkeypatch.setattr(sandbox, "_libc_unshare", lambda: None)
    sandbox.network_isolation_available.cache_clear()
    sandbox._warn_once.cache_clear()
    try:
        result = sandbox.run_python("print('hi')")
    finally:
        sandbox.network_isolation_available.cache_clear()
    assert result.ok and result.stdout == "hi\n"
    assert (result.isolated, result.seccomp, result.network_isolated) == (False, False, False)
    assert "namespaces are refused here (no unshare())" in caplog.text
