"""A ``python`` for tests that run shell scripts calling ``$PYTHON -m verl.trainer...`` many
times: each run is forked from one parent that imported the trainer once, instead of a fresh
interpreter importing torch and transformers and tearing their modules down at its exit
(together most of a two-step tiny-model run: measured 2-3 s a run instead of 12-28 s at load
average 8 on the 2-core machine).

``with prewarmed_python(modules, env, tmp_dir) as python:`` gives the path of an executable to
pass as ``PYTHON``; the scripts run unchanged. The executable sends its arguments, working
directory, environment and standard streams (the descriptors themselves) through a Unix
socket to the parent, which forks a child that runs ``-m module args...`` or
``script args...`` as ``python`` would: as ``__main__``, with ``sys.argv`` and
``sys.path[0]`` set the same way and the caller's environment in ``os.environ``; at its end
non-daemon threads are joined, atexit handlers run and the standard streams are flushed, as
at an interpreter's exit, but the modules are not torn down (a file a run leaves unclosed
is not flushed: a failure here, never a pass). The executable exits with the child's status.
Any other command line (``-c``, interpreter options, no arguments) runs the real interpreter.

The parent starts with ``env`` (what a library reads from the environment at import time is
the parent's: give the environment the scripts are run with), imports ``modules`` and runs
nothing else (no torch op, no thread of its own; see ``tests/trainer/prewarmed.py``). One run
at a time: a second caller waits for the first to end. A child is a new process with its own
pid; ``/proc/<pid>/environ`` of a forked child is its parent's, which carries the test
session's mark (``tests/conftest.py``), so the leak checks still find what outlives a test.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

# A forked child's end of a prewarmed parent (this module's and tests/trainer/prewarmed.py's):
# run ``argv`` as ``python argv...`` would, as ``__main__`` (with ``set_path``, the script's
# directory or, for ``-m``, the working directory first on ``sys.path``, as the interpreter
# puts it), then end as the interpreter's exit does up to its finalisation, never returning.
RUN_AS_PYTHON = r"""
def run_as_python(argv, set_path):
    import atexit, os, runpy, sys, threading, traceback

    code = 0
    try:
        if argv[0] == "-m":  # python -m module args...
            sys.argv = argv[1:]
            if set_path:
                sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            if set_path:
                sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:  # as the interpreter reads it
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    # the interpreter's exit up to its finalisation, which tearing down torch's and
    # transformers' modules makes seconds long: non-daemon threads joined, atexit run
    threading._shutdown()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
"""

# argv: socket path, modules to import. Serves one run at a time until killed.
_PARENT = (
    RUN_AS_PYTHON
    + r"""
import json, os, socket, sys

path = sys.argv[1]
for name in sys.argv[2:]:
    __import__(name)
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(8)
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while chunk := conn.recv(1 << 16):
        data += chunk
    req = json.loads(data)
    pid = os.fork()
    if pid == 0:
        server.close()
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        run_as_python(req["argv"], set_path=True)
    for fd in fds:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    conn.sendall(str(code).encode())
    conn.close()
"""
)

# The executable: {real} is the real interpreter, {sock} the parent's socket.
_CLIENT = """#!{real} -IS
import json, os, socket, sys

args = sys.argv[1:]
if not args or args[0].startswith("-") and args[0] != "-m":
    os.execv({real!r}, [{real!r}, *args])
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect({sock!r})
request = json.dumps({{"argv": args, "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
socket.send_fds(conn, [request[:1]], [0, 1, 2])
conn.sendall(request[1:])
conn.shutdown(socket.SHUT_WR)
answer = b""
while chunk := conn.recv(64):
    answer += chunk
code = int(answer or b"1")
sys.exit(code if code >= 0 else 128 - code)
"""


@contextlib.contextmanager
def prewarmed_python(modules: Sequence[str], env: dict[str, str], tmp_dir: Path) -> Iterator[str]:
    """The path of a prewarmed ``python`` executable (see the module's docstring), valid in
    the ``with`` block; the parent is killed at its end."""
    sock = tmp_dir / "python.sock"
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(sock), *modules],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        if parent.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the prewarmed parent ended (exit {parent.wait()})")
        python = tmp_dir / "python"
        python.write_text(_CLIENT.format(real=sys.executable, sock=str(sock)))
        python.chmod(0o755)
        yield str(python)
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(sock)
