"""Fixtures shared by the whole test suite.

``ray_session``: one local Ray cluster for the test session, started by the first test that
asks for it (``ensure_ray(num_cpus=4)``: 4 logical CPUs, i.e. 4 single-CPU bundles, on any
machine) and shut down when the session ends. Starting Ray costs seconds, so tests share it;
tests that do not ask for it never start Ray. Tests must shut down the worker groups they
create (``wg.shutdown()`` or ``with RayWorkerGroup(...) as wg``) so later tests find free
bundles.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

RAY_TEST_CPUS = 4


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """The ``ray`` module, initialised with ``RAY_TEST_CPUS`` logical CPUs."""
    ray = pytest.importorskip("ray")
    from verl.controller import ensure_ray, shutdown_ray

    started_here = not ray.is_initialized()
    ensure_ray(num_cpus=RAY_TEST_CPUS)
    yield ray
    if started_here:
        shutdown_ray()  # Ray, and the watchdog that ties its processes to this one
