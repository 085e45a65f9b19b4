"""Ray's authentication token file is private: ``~/.ray/auth_token`` is created 0600 (Ray's
own writer leaves it 0644 under a 022 umask), and an existing readable one is tightened."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from verl.controller.ray_cluster import private_token_file


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(key, raising=False)
    old = os.umask(0o022)  # the usual umask, under which Ray's file was 0644
    yield tmp_path
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_missing_token_is_created_owner_only(home):
    path = private_token_file()
    assert path == home / ".ray" / "auth_token"
    assert _mode(path) == 0o600
    assert _mode(home / ".ray") == 0o700
    token = path.read_text()
    assert len(token) == 64 and int(token, 16) >= 0  # 256 random bits in hex, as Ray's
    assert private_token_file() == path and path.read_text() == token  # kept, not replaced


def test_a_readable_token_is_made_private(home, caplog):
    (home / ".ray").mkdir()
    path = home / ".ray" / "auth_token"
    path.write_text("abc123")
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        assert private_token_file() == path
    assert _mode(path) == 0o600 and path.read_text() == "abc123"
    assert "was readable by others (mode 644): made it 0600" in caplog.text


def test_no_file_when_ray_reads_none(home, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert private_token_file() is None
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(home / "elsewhere"))
    assert private_token_file() is None
    assert not (home / ".ray").exists()


@pytest.mark.slow
def test_a_local_cluster_leaves_its_token_owner_only(tmp_path):
    """A real local cluster started by ensure_ray in a fresh HOME: the token it
    authenticates with is the 0600 file."""
    script = textwrap.dedent(
        """
        import os
        os.umask(0o022)
        from verl.controller.ray_cluster import ensure_ray, shutdown_ray
        ensure_ray(num_cpus=1)
        shutdown_ray()
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path)
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    path = tmp_path / ".ray" / "auth_token"
    assert _mode(path) == 0o600, oct(_mode(path))
    assert len(path.read_text().strip()) == 64
