"""Children made with `die_with_parent` end when their parent is SIGKILLed, through the
kernel's parent-death signal and through the parent-pid watch alone; `processes_with_env`
finds them by the environment they inherited."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from verl.utils.lifetime import kill_processes_with_env, processes_with_env, wait_until_gone

PARENT = """
import multiprocessing as mp, sys, threading, time
from verl.utils.lifetime import die_with_parent, forked_from_main_thread

def child(parent_pid, kernel_signal):
    die_with_parent(parent_pid, kernel_signal=kernel_signal, poll_s=0.2)
    time.sleep(120)

def start(kernel_signal, out):
    import os
    p = mp.get_context("fork").Process(target=child, args=(os.getpid(), kernel_signal))
    p.start()
    out.append(p.pid)

kernel_signal = sys.argv[1] == "kernel"
out = []
if kernel_signal:
    assert forked_from_main_thread()
    start(True, out)
else:  # forked from a thread that ends at once: only the pid watch can work
    t = threading.Thread(target=start, args=(False, out))
    t.start(); t.join()
print(out[0], flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("how", ["kernel", "watch"])
def test_child_ends_with_its_killed_parent(how):
    mark = uuid.uuid4().hex
    env = {**os.environ, "VERL_LIFETIME_TEST": mark}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, how], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        child_pid = int(parent.stdout.readline())
        assert child_pid in processes_with_env("VERL_LIFETIME_TEST", mark)
        if how == "watch":  # the forking thread ended, and the child is still alive
            time.sleep(0.5)
            assert child_pid in processes_with_env("VERL_LIFETIME_TEST", mark)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert not wait_until_gone("VERL_LIFETIME_TEST", mark, 5, poll_s=0.05)
    finally:
        parent.kill()
        parent.wait()
        kill_processes_with_env("VERL_LIFETIME_TEST", mark)
