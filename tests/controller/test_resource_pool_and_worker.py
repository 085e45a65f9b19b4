"""Tests for ResourcePool and the Worker rank layout (role placement: tests/config/test_device_map.py)."""

from __future__ import annotations

import pytest

from verl.controller import (
    DistInfo,
    ResourcePool,
    Worker,
    instantiate_worker,
)

# ---------------------------------------------------------------- ResourcePool


def test_resource_pool_world_size_and_placement():
    pool = ResourcePool(process_on_nodes=[2, 3], use_gpu=False, name="actor_pool")
    assert pool.world_size == 5 and pool.num_nodes == 2
    assert [pool.placement(r) for r in range(5)] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    with pytest.raises(ValueError, match=r"rank=5 is outside \[0, world_size=5\)"):
        pool.placement(5)


@pytest.mark.parametrize("bad", [[], [0], [2, -1], [1.5]])
def test_resource_pool_rejects_bad_layouts(bad):
    with pytest.raises(ValueError, match="process_on_nodes"):
        ResourcePool(bad, name="p")


# ---------------------------------------------------------------- Worker


class RankWorker(Worker):
    def __init__(self, note: str = "") -> None:
        self.rank_in_init = self.rank  # injected info is readable before super().__init__()
        super().__init__()
        self.note = note


def test_worker_reads_env(monkeypatch):
    for name, value in {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    }.items():
        monkeypatch.setenv(name, value)
    w = Worker()
    assert (w.rank, w.world_size, w.local_rank) == (3, 4, 1)
    assert (w.master_addr, w.master_port) == ("10.0.0.1", 29500)


def test_worker_defaults_to_single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    w = Worker()
    assert (w.rank, w.world_size, w.local_rank, w.master_addr, w.master_port) == (
        0,
        1,
        0,
        None,
        None,
    )


def test_worker_explicit_args_and_validation(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    w = Worker(rank=2, world_size=4)
    assert (w.rank, w.world_size, w.local_rank) == (2, 4, 2)
    with pytest.raises(ValueError, match=r"rank=4 is outside \[0, world_size=4\)"):
        Worker(rank=4, world_size=4)
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="RANK='zero' is not an integer"):
        Worker()


def test_instantiate_worker_injects_info_over_env(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    info = DistInfo(rank=1, world_size=2, local_rank=1)
    w = instantiate_worker(RankWorker, info, ("hello",))
    assert (w.rank, w.world_size, w.rank_in_init, w.note) == (1, 2, 1, "hello")
    with pytest.raises(TypeError, match="not a subclass"):
        instantiate_worker(dict, info)


def test_dist_info_env_round_trip():
    info = DistInfo(rank=1, world_size=2, local_rank=0, master_addr="127.0.0.1", master_port=1234)
    assert info.to_env() == {
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1234",
    }
    assert DistInfo.from_env(info.to_env()) == info
