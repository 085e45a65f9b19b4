"""The suite's rule that a test on the session's Ray cluster is a slow test
(tests/conftest.py): one without ``@pytest.mark.slow`` fails at its setup, before Ray starts,
and a marked one stays out of ``-m "not slow"``."""

from __future__ import annotations

from pathlib import Path

from tests.test_leak_check import _run_inner

RAY_TESTS = """
import pytest


def test_unmarked_on_ray(ray_session):
    raise AssertionError("the fixture started Ray and the test ran")


@pytest.mark.slow
def test_marked_on_ray(ray_session):
    raise AssertionError("a slow test ran under -m 'not slow'")


def test_not_on_ray():
    pass
"""


def test_an_unmarked_ray_test_fails_before_starting_ray(tmp_path: Path) -> None:
    result = _run_inner(tmp_path, RAY_TESTS, "-m", "not slow", "-p", "no:randomly")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 passed, 1 deselected" in result.stdout and "1 error" in result.stdout
    assert "ERROR at setup of test_unmarked_on_ray" in result.stdout
    assert (
        "test_unmarked_on_ray runs on the session's Ray cluster (fixture ray_session) without "
        "@pytest.mark.slow" in result.stdout
    )
    assert "the fixture started Ray" not in result.stdout
