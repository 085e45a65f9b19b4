"""Tests for the Ray worker-group backend: same dispatch results as the local backend, real
processes with a torch.distributed group, colocation, overlapping calls, and a killed worker
turning into ``WorkerDiedError`` instead of a hang.

Actor start costs ~1-2 s here, so the tests share one 2-rank group (``pair``) and create few
others; the session's Ray cluster has 4 single-CPU bundles (``tests/conftest.py``), so every
extra group is shut down before the next one starts. The tests on Ray are slow tests (like
every test on the session's cluster); the two that do not start Ray are fast.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from verl.controller import (  # noqa: E402
    ClassWithInitArgs,
    Dispatch,
    LocalWorkerGroup,
    RayOptions,
    RayWorkerGroup,
    ResourcePool,
    Worker,
    WorkerDiedError,
    create_colocated_worker_cls,
    make_worker_group,
    register,
)
from verl.protocol import DataProto  # noqa: E402

# The toy workers below live in this test module, which the actor processes cannot import
# by name under pytest's importlib mode: ship their code by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class ToyWorker(Worker):
    """Scales `x`, tags rows with the computing rank, and exposes its process for the tests."""

    def __init__(self, scale: float = 2.0) -> None:
        super().__init__()
        self.scale = scale
        self.seen: list[list[int]] = []

    @register(Dispatch.DP_COMPUTE)
    def double(self, data: DataProto) -> DataProto:
        self.seen.append(data.batch["x"].long().tolist())
        n = len(data)
        return DataProto.from_dict(
            tensors={"doubled": data.batch["x"] * self.scale, "rank": torch.full((n,), self.rank)},
            non_tensors={"uid": data.non_tensor_batch["uid"]},
            meta_info={"rank": self.rank},
        )

    @register(Dispatch.DP_COMPUTE)
    def double_with_kwargs(self, data: DataProto, *, offset: float, extra: DataProto) -> DataProto:
        return DataProto.from_dict(
            tensors={"y": data.batch["x"] * self.scale + offset + extra.batch["e"]}
        )

    @register(Dispatch.ONE_TO_ALL)
    def pop_seen(self) -> list[list[int]]:
        seen, self.seen = self.seen, []
        return seen

    @register(Dispatch.ONE_TO_ALL)
    def describe(self, tag: str) -> tuple[str, int, int, int]:
        return tag, self.rank, self.world_size, self.local_rank

    @register(Dispatch.ONE_TO_ALL)
    def total_rows(self, data: DataProto) -> int:
        return len(data)

    @register(Dispatch.ONE_TO_ALL, rank_zero_result=True)
    def checkpoint_path(self) -> str:
        return f"ckpt-from-rank-{self.rank}"

    @register(Dispatch.ONE_TO_ALL)
    def process(self) -> dict:
        import torch.distributed as dist

        names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        return {
            "pid": os.getpid(),
            "info": self.dist_info,
            "env": {k: os.environ.get(k) for k in (*names, "OMP_NUM_THREADS")},
            "threads": torch.get_num_threads(),
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "placement_group": ray.get_runtime_context().get_placement_group_id(),
        }

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce_sum(self, value: float) -> float:
        import torch.distributed as dist

        t = torch.tensor([value + self.rank])
        dist.all_reduce(t)
        return t.item()

    @register(Dispatch.ONE_TO_ALL)
    def sleep_span(self, seconds: float) -> tuple[float, float]:
        start = time.time()
        time.sleep(seconds)
        return start, time.time()

    @register(Dispatch.ONE_TO_ALL)
    def wait_for_stop(self, timeout_s: float) -> int | None:
        """Polls ``stop_signum`` like a training loop; the request, or None at the timeout."""
        deadline = time.monotonic() + timeout_s
        while self.stop_signum is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.stop_signum

    @register(Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"bad rank {rank}")
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def stall_then_all_reduce(self, stalling_rank: int, seconds: float) -> float:
        """Every rank but `stalling_rank` blocks in all_reduce until that one arrives."""
        import torch.distributed as dist

        if self.rank == stalling_rank:
            time.sleep(seconds)
        t = torch.ones(1)
        dist.all_reduce(t)
        return t.item()

    @register(Dispatch.ONE_TO_ALL)
    def raise_or_exit(self, raise_after: float, exit_after: float) -> None:
        """Rank 0 raises an ordinary error; rank 1's process exits a little later."""
        if self.rank == 0:
            time.sleep(raise_after)
            raise ConnectionError("peer went away")
        time.sleep(exit_after)
        os._exit(1)


class CriticLike(Worker):
    def __init__(self, bias: float) -> None:
        super().__init__()
        self.bias = bias

    @register(Dispatch.DP_COMPUTE)
    def values(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"values": data.batch["x"] + self.bias})

    @register(Dispatch.ONE_TO_ALL)
    def process(self) -> dict:
        return {
            "pid": os.getpid(),
            "rank": self.rank,
            "placement_group": ray.get_runtime_context().get_placement_group_id(),
        }


class ClosingWorker(Worker):
    """Leaves a file per rank when closed."""

    def __init__(self, marker_dir: str) -> None:
        super().__init__()
        self.marker_dir = marker_dir

    @register(Dispatch.ONE_TO_ALL)
    def nap(self, seconds: float) -> None:
        time.sleep(seconds)

    def close(self) -> None:
        Path(self.marker_dir, f"closed{self.rank}").touch()


class FailsToStart(Worker):
    def __init__(self) -> None:
        super().__init__()
        raise ValueError(f"cannot load the model on rank {self.rank}")


def batch(n: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.arange(n, dtype=torch.float32)},
        non_tensors={"uid": [f"u{i}" for i in range(n)]},
    )


@pytest.fixture(scope="module")
def pair(ray_session):
    """A 2-rank Ray group shared by the tests of this module."""
    with make_worker_group("ray", ToyWorker, ResourcePool([2], name="pair"), scale=3.0) as wg:
        yield wg


def test_import_does_not_load_ray():
    code = (
        "import sys, verl.controller as c; "
        "from verl.controller import make_worker_group, WorkerDiedError, GroupFuture; "
        "print('ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
@pytest.mark.parametrize("n", [4, 5, 1])
def test_dp_compute_matches_local_backend(pair, n):
    local = LocalWorkerGroup(ToyWorker, ResourcePool([2]), scale=3.0)
    data = batch(n)
    got, want = pair.double(data), local.double(data)
    for key in ("doubled", "rank"):
        assert torch.equal(got.batch[key], want.batch[key])
    assert got.non_tensor_batch["uid"].tolist() == want.non_tensor_batch["uid"].tolist()
    assert got.meta_info == want.meta_info == {"rank": 0}
    # padded rows reached the ranks exactly as in the local backend
    assert pair.pop_seen() == [w.seen for w in local.workers]
    assert len(data) == n  # the caller's batch was not padded in place

    extra = DataProto.from_dict(tensors={"e": 100.0 * torch.arange(n, dtype=torch.float32)})
    got = pair.double_with_kwargs(data, offset=0.5, extra=extra)
    want = local.double_with_kwargs(data, offset=0.5, extra=extra)
    assert torch.equal(got.batch["y"], want.batch["y"])


@pytest.mark.slow
def test_one_to_all_matches_local_backend(pair):
    local = LocalWorkerGroup(ToyWorker, ResourcePool([2]), scale=3.0)
    assert pair.describe("hi") == local.describe("hi") == [("hi", 0, 2, 0), ("hi", 1, 2, 1)]
    assert pair.checkpoint_path() == "ckpt-from-rank-0"
    # a DataProto broadcast to every rank (shipped once through the object store)
    assert pair.total_rows(batch(7)) == [7, 7]
    assert pair.total_rows(data=batch(3)) == [3, 3]


@pytest.mark.slow
def test_each_actor_knows_its_rank_rendezvous_and_threads(pair):
    procs = pair.process()
    assert [p["info"].rank for p in procs] == [0, 1]
    assert {p["info"].world_size for p in procs} == {2}
    assert [p["info"].local_rank for p in procs] == [0, 1]
    # rank 0 hosts the rendezvous on its node (this node: the cluster is local)
    addr, port = procs[0]["info"].master_addr, procs[0]["info"].master_port
    assert addr == ray.util.get_node_ip_address()
    assert isinstance(port, int) and port > 0
    for rank, p in enumerate(procs):
        assert (p["info"].master_addr, p["info"].master_port) == (addr, port)
        assert p["env"] == {
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": addr,
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        assert p["threads"] == 1
        assert p["backend"] == "gloo"
    pids = [p["pid"] for p in procs]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert pids == pair.pids
    # one placement group for the single node of the pool
    assert len({p["placement_group"] for p in procs}) == 1


@pytest.mark.slow
def test_ranks_all_reduce_over_gloo(pair):
    # rank r contributes value + r
    assert pair.all_reduce_sum(1.0) == [3.0, 3.0]
    assert pair.all_reduce_sum(10.0) == [21.0, 21.0]


@pytest.mark.slow
def test_worker_exception_is_reraised_with_role_and_rank(pair):
    with pytest.raises(ValueError, match="bad rank 1") as err:
        pair.fail_on(1)
    notes = "".join(getattr(err.value, "__notes__", []))
    if sys.version_info >= (3, 11):
        assert "ToyWorker.fail_on on rank 1" in notes
    # an ordinary exception leaves the group usable
    assert pair.fail_on(5) == [0, 1]


@pytest.mark.slow
def test_submit_overlaps_calls_on_different_pools(pair):
    seconds = 1.5
    with RayWorkerGroup(ToyWorker, ResourcePool([1], name="solo")) as solo:
        solo.describe("warm")  # the actor is up before timing
        start = time.monotonic()
        first = pair.submit("sleep_span", seconds)
        second = solo.sleep_span.submit(seconds)
        assert time.monotonic() - start < 0.5  # submit does not wait
        spans = first.result() + second.result()
        elapsed = time.monotonic() - start
        assert first.done() and second.done()
        assert first.result() is first.result()  # gathered once
    # one after another would take 2 x 1.5 s
    assert elapsed < 2 * seconds - 0.3, elapsed
    assert max(s for s, _ in spans) < min(e for _, e in spans)


@pytest.mark.slow
def test_result_timeout_leaves_the_call_running(pair):
    future = pair.submit("sleep_span", 1.0)
    with pytest.raises(TimeoutError, match=r"ranks \[0, 1\] still running"):
        future.result(timeout=0.1)
    assert len(future.result(timeout=30)) == 2


@pytest.mark.slow
def test_a_stop_request_reaches_the_ranks_while_a_call_runs(pair):
    future = pair.submit("wait_for_stop", 60.0)
    with pytest.raises(TimeoutError):
        future.result(timeout=0.3)  # both ranks are busy in the call
    pair.request_stop(signal.SIGTERM)
    pair.request_stop(signal.SIGINT)  # the first request wins
    assert future.result(timeout=30) == [signal.SIGTERM, signal.SIGTERM]


def test_submit_with_local_backend_returns_completed_future():
    local = make_worker_group("local", ToyWorker, ResourcePool([2]))
    future = local.submit("describe", "x")
    assert future.done()
    assert future.result() == [("x", 0, 2, 0), ("x", 1, 2, 1)]


@pytest.mark.slow
def test_colocated_roles_share_processes_and_pools_share_placement(pair):
    pool = ResourcePool([2], name="colocated")
    cls = create_colocated_worker_cls(
        {
            "actor": ClassWithInitArgs(ToyWorker, scale=10.0),
            "critic": ClassWithInitArgs(CriticLike, 0.5),
        }
    )
    wg = RayWorkerGroup(cls, pool)
    other = None
    try:
        roles = wg.spawn()
        actor, critic = roles["actor"], roles["critic"]
        assert actor.double(batch(3)).batch["doubled"].tolist() == [0.0, 10.0, 20.0]
        assert critic.values(batch(4)).batch["values"].tolist() == [0.5, 1.5, 2.5, 3.5]
        actor_procs, critic_procs = actor.process(), critic.process()
        # both roles run in one process per rank, which joined the process group once
        assert [p["pid"] for p in actor_procs] == [p["pid"] for p in critic_procs] == wg.pids
        assert [p["rank"] for p in critic_procs] == [0, 1]
        assert actor.all_reduce_sum(0.0) == [1.0, 1.0]
        assert "double" not in critic.method_names

        # a second group over the same pool object reuses its placement groups
        other = RayWorkerGroup(CriticLike, pool, 1.0)
        other_procs = other.process()
        assert {p["placement_group"] for p in other_procs} == {
            p["placement_group"] for p in critic_procs
        }
        assert not {p["pid"] for p in other_procs} & set(wg.pids)  # own processes
        assert pool.backend_state["ray"].users == 2
        other.shutdown()
        assert pool.backend_state["ray"].users == 1
        assert critic.values(batch(2)).batch["values"].tolist() == [0.5, 1.5]
    finally:
        if other is not None:
            other.shutdown()
        # shutting down one role's group shuts down the shared actors
        roles["critic"].shutdown()
    assert pool.backend_state == {}
    with pytest.raises(RuntimeError, match="shut down"):
        roles["actor"].describe("late")
    wg.shutdown()  # idempotent


@pytest.mark.slow
def test_shutdown_closes_idle_workers_and_kills_busy_ones_at_once(ray_session, tmp_path):
    idle_dir, busy_dir = tmp_path / "idle", tmp_path / "busy"
    idle_dir.mkdir()
    busy_dir.mkdir()
    idle = RayWorkerGroup(ClosingWorker, ResourcePool([2], name="idle"), str(idle_dir))
    idle.nap(0.0)
    idle.shutdown()
    assert sorted(os.listdir(idle_dir)) == ["closed0", "closed1"]
    # a call still runs: no close (it would wait behind the call), the actors die now
    busy = RayWorkerGroup(ClosingWorker, ResourcePool([2], name="busy"), str(busy_dir))
    busy.submit("nap", 60.0)
    start = time.monotonic()
    busy.shutdown()
    assert time.monotonic() - start < 10
    assert os.listdir(busy_dir) == []


@pytest.mark.slow
def test_worker_that_fails_to_start_names_rank_and_frees_the_pool(ray_session):
    pool = ResourcePool([1], name="broken")
    with pytest.raises(ValueError, match="cannot load the model on rank 0"):
        RayWorkerGroup(FailsToStart, pool)
    assert pool.backend_state == {}


@pytest.mark.slow
def test_pool_asking_for_missing_gpus_fails_before_starting_actors(ray_session):
    with pytest.raises(ValueError, match=r"needs 1 GPU but the Ray cluster has 0.*use_gpu=False"):
        RayWorkerGroup(ToyWorker, ResourcePool([1], use_gpu=True, name="gpus"))
    with pytest.raises(ValueError, match="device_type='cuda' needs GPUs"):
        RayWorkerGroup(ToyWorker, ResourcePool([1]), ray_options=RayOptions(device_type="cuda"))
    with pytest.raises(ValueError, match="num_cpus_per_worker=0"):
        RayOptions(num_cpus_per_worker=0)


@pytest.mark.slow
def test_killed_worker_raises_worker_died_error_while_peer_is_in_a_collective(pair):
    wg = RayWorkerGroup(
        ToyWorker,
        ResourcePool([2], name="doomed"),
        ray_options=RayOptions(collective_timeout_s=120.0),
    )
    try:
        pids = [p["pid"] for p in wg.process()]
        # rank 0 blocks in all_reduce, waiting for rank 1, which sleeps
        future = wg.submit("stall_then_all_reduce", 1, 300.0)
        time.sleep(1.0)
        assert not future.done()
        start = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(WorkerDiedError) as err:
            future.result(timeout=60)
        elapsed = time.monotonic() - start
        assert elapsed < 30, elapsed
        died = err.value
        assert isinstance(died, RuntimeError)
        assert (died.role, died.rank, died.method) == ("ToyWorker", 1, "stall_then_all_reduce")
        message = str(died)
        assert "ToyWorker rank 1 died during 'stall_then_all_reduce'" in message
        assert f"pid {pids[1]}" in message
        assert "worker process has died" in died.cause
        # the group is unusable afterwards and says so at once
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match="create a new one"):
            wg.describe("again")
        assert time.monotonic() - start < 5
    finally:
        wg.shutdown()


@pytest.mark.slow
def test_peer_error_caused_by_a_death_is_reported_as_the_death(ray_session):
    # rank 0's ordinary error reaches the driver first; rank 1 dies 0.5 s later, as a rank
    # in a collective with a dead one would fail: the death is the cause worth naming
    with RayWorkerGroup(ToyWorker, ResourcePool([2], name="exits")) as wg:
        with pytest.raises(WorkerDiedError) as err:
            wg.raise_or_exit(0.2, 0.7)
        assert err.value.rank == 1
        assert isinstance(err.value.__cause__, ConnectionError)
