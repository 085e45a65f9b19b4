"""``release_memory`` returns freed heap memory to the system."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_freed_heap_tensors_leave_rss_after_release():
    # a fresh process: the test runner's own heap would blur the numbers
    script = textwrap.dedent(
        """
        import torch
        from verl.utils.memory import release_memory

        def rss_mib():
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * 4096 / 2**20

        xs = [torch.ones(16000) for _ in range(4000)]  # 64 KB each: glibc heap, not mmap
        del xs
        held = rss_mib()
        release_memory()
        print(held - rss_mib())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    released_mib = float(out.stdout.strip().splitlines()[-1])
    assert released_mib > 150, released_mib  # of the ~250 MiB the tensors held


def test_the_c_library_is_found_without_a_subprocess(monkeypatch):
    """``ctypes.util.find_library`` spawns ldconfig, which can hang on a thread while another
    thread forks; the lookup must not spawn anything."""
    import subprocess

    from verl.utils import memory

    def refuse(*args, **kwargs):
        raise AssertionError(f"release_memory spawned a process: {args}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    memory._malloc_trim.cache_clear()
    memory.release_memory()
    memory._malloc_trim.cache_clear()
