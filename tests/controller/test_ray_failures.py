"""How a dead rank is described: Ray's cause, and its node when the cluster knows it died."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")

from ray.exceptions import ActorUnavailableError  # noqa: E402

from verl.controller import ray_failures  # noqa: E402

NODE_A = "a1" * 28
NODE_B = "b2" * 28


def _table(alive_b: bool) -> list[dict]:
    return [
        {"NodeID": NODE_A, "Alive": True},
        {"NodeID": NODE_B, "Alive": alive_b, "DeathReasonMessage": "health check failed"},
    ]


def test_a_dead_node_is_named_with_the_clusters_reason(monkeypatch):
    monkeypatch.setattr(ray_failures.ray, "nodes", lambda: _table(alive_b=False))
    node = f"10.0.0.2 id {NODE_B[:12]}"
    assert ray_failures.node_death(node) == f"; its node {node} is dead: health check failed"
    assert ray_failures.node_death(f"10.0.0.1 id {NODE_A[:12]}") == ""


def test_nothing_is_said_of_a_live_node_an_unknown_one_or_an_unreachable_cluster(monkeypatch):
    monkeypatch.setattr(ray_failures.ray, "nodes", lambda: _table(alive_b=True))
    assert ray_failures.node_death(f"10.0.0.2 id {NODE_B[:12]}") == ""
    assert ray_failures.node_death(None) == ""
    assert ray_failures.node_death("10.0.0.2") == ""  # no node id

    def gone():
        raise ConnectionError("GCS unreachable")

    monkeypatch.setattr(ray_failures.ray, "nodes", gone)
    assert ray_failures.node_death(f"10.0.0.2 id {NODE_B[:12]}") == ""


def test_an_unreachable_actor_points_at_its_process_or_raylet():
    cause = ray_failures.death_cause(ActorUnavailableError("RpcError: Socket closed", None))
    assert "Socket closed" in cause
    assert "it or its node's raylet is gone" in cause
