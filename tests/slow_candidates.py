"""An opt-in pytest plugin that lists the fast tests which train: candidates for
``@pytest.mark.slow`` (every full training run and every Ray test carries it).

Run it over the fast tier, in one process so that it sees every test::

    nice -n 10 .venv/bin/python -m pytest -q -n 0 -p tests.slow_candidates -m "not slow" tests

At the end it prints the tests without the ``slow`` mark that ran a training loop in this
process (``verl.trainer.lifecycle.driver.run``: ``RLTrainer.fit`` and the offline trainers'
``fit``), started a trainer entry point in a child process (``python -m verl.trainer...`` /
``verl.cli...``, a shell script, ``torchrun``; a command with ``--validate-only``,
``--print-config`` or ``--help`` does not train) or left Ray initialised, each with its setup +
call time; those over ``VERL_SLOW_CANDIDATE_S`` seconds (default 5) are marked ``<- slow?``.
A Ray test on the session's cluster without the mark already fails (tests/conftest.py).
Nothing here fails a test: the time a test takes depends on the machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

THRESHOLD_S = float(os.environ.get("VERL_SLOW_CANDIDATE_S", "5"))
_NOT_TRAINING = ("--validate-only", "--print-config", "--help", "-h")
_ENTRY_POINTS = ("verl.trainer.", "verl.cli.", "torchrun", ".sh")


class _Census:
    def __init__(self) -> None:
        self.current: str | None = None
        self.found: dict[str, list[str]] = {}
        self.seconds: dict[str, float] = {}

    def note(self, what: str) -> None:
        if self.current is not None:
            self.found.setdefault(self.current, []).append(what)


_census = _Census()


def _command_trains(args: Any) -> str | None:
    argv = [str(a) for a in args] if isinstance(args, list | tuple) else str(args).split()
    if not any(e in a for a in argv for e in _ENTRY_POINTS):
        return None
    if any(a in _NOT_TRAINING for a in argv):
        return None
    return " ".join(argv)[:160]


def pytest_configure(config: pytest.Config) -> None:
    from verl.trainer.lifecycle import driver

    real_run = driver.run

    def counted_run(trainer: Any) -> Any:
        _census.note(f"fit: {type(trainer).__name__}")
        return real_run(trainer)

    driver.run = counted_run
    real_popen_init = subprocess.Popen.__init__

    def noted_popen_init(self: Any, args: Any, *a: Any, **kw: Any) -> None:
        command = _command_trains(args)
        if command is not None:
            _census.note(f"process: {command}")
        real_popen_init(self, args, *a, **kw)

    subprocess.Popen.__init__ = noted_popen_init  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    _census.current = None if item.get_closest_marker("slow") else item.nodeid
    ray_before = _ray_initialized()
    yield
    if _census.current is not None and not ray_before and _ray_initialized():
        _census.note("ray initialised")
    _census.current = None


def _ray_initialized() -> bool:
    ray = sys.modules.get("ray")  # not imported here: a test that uses Ray has imported it
    return ray is not None and ray.is_initialized()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when in ("setup", "call"):
        _census.seconds[report.nodeid] = _census.seconds.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    tw = terminalreporter
    tw.section("fast tests that train (slow_candidates)")
    if not _census.found:
        tw.write_line("none")
        return
    rows = sorted(_census.found.items(), key=lambda kv: -_census.seconds.get(kv[0], 0.0))
    for nodeid, what in rows:
        seconds = _census.seconds.get(nodeid, 0.0)
        flag = "  <- slow?" if seconds > THRESHOLD_S else ""
        kinds = "; ".join(sorted(set(what)))
        tw.write_line(f"{seconds:7.2f} s  {nodeid}{flag}\n           {kinds}")
