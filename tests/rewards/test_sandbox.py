"""The code-execution sandbox: time, memory and file limits, no network, temp working dir."""

from __future__ import annotations

import os

import pytest

from verl.rewards.sandbox import network_isolation_available, run_python


def test_runs_code_with_stdin():
    result = run_python("print(input()[::-1])", "abc\n")
    assert result.ok and result.stdout == "cba\n" and result.returncode == 0


def test_infinite_loop_times_out():
    result = run_python("while True:\n    pass\n", timeout_s=1.0)
    assert result.status == "timeout"
    assert result.duration_s < 5.0


def test_forked_children_die_with_the_timeout():
    code = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nelse:\n    time.sleep(60)\n"
    result = run_python(code, timeout_s=0.5)
    assert result.status == "timeout" and result.duration_s < 5.0


def test_allocating_4_gb_is_a_memory_error():
    result = run_python("x = bytearray(4 * 1024**3)\nprint(len(x))", memory_mb=512)
    assert result.status == "memory"
    assert "MemoryError" in result.stderr and result.stdout == ""


def test_written_files_land_in_a_removed_temp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = "import os\nopen('escape.txt', 'w').write('x')\nprint(os.getcwd())\n"
    result = run_python(code)
    assert result.ok
    workdir = result.stdout.strip()
    assert os.path.basename(workdir).startswith("verl-sandbox-")
    assert workdir != str(tmp_path)
    assert not os.path.exists(workdir)  # removed afterwards, with the file in it
    assert list(tmp_path.iterdir()) == []  # nothing landed in the caller's cwd


def test_output_is_capped():
    result = run_python("print('x' * 10_000_000)", max_output_bytes=10_000)
    assert result.status == "output_limit"
    assert len(result.stdout) <= 10_000


def test_error_exit_and_environment_is_minimal(monkeypatch):
    monkeypatch.setenv("VERL_SECRET_TOKEN", "hunter2")
    code = "import os\nprint(os.environ.get('VERL_SECRET_TOKEN'))\nraise SystemExit(3)\n"
    result = run_python(code)
    assert result.status == "error" and result.returncode == 3
    assert result.stdout.strip() == "None"


@pytest.mark.skipif(not network_isolation_available(), reason="no network namespaces here")
def test_no_network():
    code = (
        "import socket\n"
        "names = [n for _, n in socket.if_nameindex()]\n"
        "print(names)\n"
        "socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
    )
    result = run_python(code)
    assert result.network_isolated
    assert result.stdout.strip() == "['lo']"  # an empty namespace: only a (down) loopback
    assert result.status == "error" and "OSError" in result.stderr


def test_argument_errors():
    with pytest.raises(ValueError, match="timeout_s=0 must be > 0"):
        run_python("pass", timeout_s=0)
    with pytest.raises(ValueError, match="memory_mb=10 is too small"):
        run_python("pass", memory_mb=10)


def test_without_network_namespaces_it_runs_and_says_so(monkeypatch, caplog):
    import verl.rewards.sandbox as sandbox

    monkeypatch.setattr(sandbox, "_libc_unshare", lambda: None)
    sandbox.network_isolation_available.cache_clear()
    try:
        result = run_python("print('hi')")
    finally:
        sandbox.network_isolation_available.cache_clear()
    assert result.ok and result.stdout == "hi\n"
    assert result.network_isolated is False
    assert "sandboxed code runs WITH network access" in caplog.text
