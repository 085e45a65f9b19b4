"""``tests/ranks.py``: ranks forked from the preloaded fork server see what spawned ranks saw."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests import ranks
from tests.ranks import run_ranks


def _nothing(rank: int) -> None:
    pass


@pytest.fixture(scope="module")
def running_server(request) -> None:
    """The server started outside the test (its descriptors are not the test's)."""
    run_ranks(_nothing, (), 1, request)


def _report(rank: int, out_dir: str, gone: str) -> None:
    mark = "VERL_TEST_SESSION"
    initial = Path("/proc/self/environ").read_bytes().split(b"\0")
    res = {
        "env": os.environ.get("VERL_TEST_RANKS_PROBE"),
        "gone": gone in os.environ,
        "cwd": os.getcwd(),
        "sys_path_head": sys.path[0],
        "preloaded": [m for m in ranks.PRELOAD if m in sys.modules],
        "marked": f"{mark}={os.environ.get(mark)}".encode() in initial,
        "ppid": os.getppid(),
    }
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(res))
    print(f"rank {rank} writes to the test's output", flush=True)


def test_ranks_get_the_callers_environment_and_the_preloaded_modules(
    running_server, tmp_path, monkeypatch, request, capfd
):
    monkeypatch.setenv("VERL_TEST_RANKS_PROBE", "set by the test")
    gone = "HOME" if "HOME" in ranks._SERVER_ENV else "PATH"  # set when the server started
    monkeypatch.delenv(gone)
    run_ranks(_report, (str(tmp_path), gone), 2, request)
    got = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    out = capfd.readouterr().out
    assert "rank 0 writes to the test's output" in out
    assert "rank 1 writes to the test's output" in out
    for res in got:
        assert res["env"] == "set by the test"
        assert not res["gone"]
        assert res["cwd"] == os.getcwd()
        assert res["sys_path_head"] == sys.path[0]
        # the leak checks of tests/conftest.py find a rank by this mark
        assert res["marked"] == ("VERL_TEST_SESSION" in os.environ)
        if ranks.START_METHOD == "forkserver":
            assert res["preloaded"] == list(ranks.PRELOAD)
            assert res["ppid"] != os.getpid()  # forked by the server, not by pytest
