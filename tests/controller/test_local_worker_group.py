"""Tests for dispatch modes through the local worker-group backend."""

from __future__ import annotations

import pickle

import pytest
import torch

from verl.controller import (
    ClassWithInitArgs,
    Dispatch,
    LocalWorkerGroup,
    ResourcePool,
    Worker,
    WorkerDiedError,
    create_colocated_worker_cls,
    make_worker_group,
    register,
)
from verl.protocol import DataProto


class DoublerWorker(Worker):
    """Doubles `x`, tags each row with the rank that computed it, remembers what it saw."""

    def __init__(self, scale: float = 2.0) -> None:
        super().__init__()
        self.scale = scale
        self.seen: list[list[int]] = []

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def double(self, data: DataProto) -> DataProto:
        self.seen.append(data.batch["x"].long().tolist())
        n = len(data)
        return DataProto.from_dict(
            tensors={"doubled": data.batch["x"] * self.scale, "rank": torch.full((n,), self.rank)},
            non_tensors={"uid": data.non_tensor_batch["uid"]},
            meta_info={"rank": self.rank},
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def double_with_kwargs(self, data: DataProto, *, offset: float, extra: DataProto) -> DataProto:
        return DataProto.from_dict(
            tensors={"y": data.batch["x"] * self.scale + offset + extra.batch["e"]}
        )

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def consume(self, data: DataProto) -> None:
        self.seen.append(data.batch["x"].long().tolist())

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def drops_a_row(self, data: DataProto) -> DataProto:
        return data[: len(data) - 1]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self, tag: str) -> tuple[str, int, int, int]:
        return tag, self.rank, self.world_size, self.local_rank

    @register(Dispatch.ONE_TO_ALL)
    def identity(self, obj: object) -> object:
        return obj

    @register(Dispatch.ONE_TO_ALL, rank_zero_result=True)
    def checkpoint_path(self) -> str:
        return f"ckpt-from-rank-{self.rank}"

    def not_exposed(self) -> int:
        return 1


def batch(n: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.arange(n, dtype=torch.float32)},
        non_tensors={"uid": [f"u{i}" for i in range(n)]},
    )


def group(world_size: int, **kwargs) -> LocalWorkerGroup:
    return LocalWorkerGroup(DoublerWorker, ResourcePool([world_size]), **kwargs)


@pytest.mark.parametrize(
    ("world_size", "n", "expected_ranks", "expected_seen"),
    [
        (1, 5, [0, 0, 0, 0, 0], [[[0, 1, 2, 3, 4]]]),
        (2, 4, [0, 0, 1, 1], [[[0, 1]], [[2, 3]]]),
        # 5 rows padded with row 0 to 6: rank 2 computes [4, 0] and the pad is dropped
        (2, 5, [0, 0, 0, 1, 1], [[[0, 1, 2]], [[3, 4, 0]]]),
        (3, 6, [0, 0, 1, 1, 2, 2], [[[0, 1]], [[2, 3]], [[4, 5]]]),
        (3, 7, [0, 0, 0, 1, 1, 1, 2], [[[0, 1, 2]], [[3, 4, 5]], [[6, 0, 1]]]),
        (3, 2, [0, 1], [[[0]], [[1]], [[0]]]),
    ],
)
def test_dp_compute_splits_pads_and_gathers(world_size, n, expected_ranks, expected_seen):
    wg = group(world_size)
    data = batch(n)
    out = wg.double(data)
    assert out.batch["doubled"].tolist() == [2.0 * i for i in range(n)]
    assert out.batch["rank"].tolist() == expected_ranks
    assert out.non_tensor_batch["uid"].tolist() == [f"u{i}" for i in range(n)]
    assert out.meta_info == {"rank": 0}  # concat keeps the first rank's meta_info
    assert [w.seen for w in wg.workers] == expected_seen
    # the caller's batch is untouched by the padding
    assert len(data) == n and data.batch["x"].tolist() == list(range(n))


def test_dp_compute_splits_dataproto_kwargs_and_broadcasts_other_args():
    wg = group(2, scale=3.0)
    data = batch(3)
    extra = DataProto.from_dict(tensors={"e": torch.tensor([100.0, 200.0, 300.0])})
    out = wg.double_with_kwargs(data, offset=0.5, extra=extra)
    assert out.batch["y"].tolist() == [100.5, 203.5, 306.5]


def test_dp_compute_mismatched_lengths_and_no_dataproto():
    wg = group(2)
    extra = DataProto.from_dict(tensors={"e": torch.zeros(5)})
    with pytest.raises(
        ValueError, match=r"differ in length: \{'arg 0': 4, \"argument 'extra'\": 5\}"
    ):
        wg.double_with_kwargs(batch(4), offset=0.0, extra=extra)
    with pytest.raises(TypeError, match="at least one DataProto"):
        wg.double(data=None)


def test_dp_compute_none_outputs_and_unremovable_padding():
    wg = group(2)
    assert wg.consume(batch(3)) is None
    assert [w.seen for w in wg.workers] == [[[0, 1]], [[2, 0]]]
    # without padding the method may change the row count freely
    assert len(wg.drops_a_row(batch(4))) == 2
    with pytest.raises(ValueError, match="padding rows cannot be removed"):
        wg.drops_a_row(batch(3))


def test_one_to_all_returns_every_rank_result():
    wg = LocalWorkerGroup(DoublerWorker, ResourcePool([2, 1]))
    assert wg.describe("hi") == [("hi", 0, 3, 0), ("hi", 1, 3, 1), ("hi", 2, 3, 0)]
    assert wg.checkpoint_path() == "ckpt-from-rank-0"


def test_one_to_all_passes_the_same_object_without_copying():
    wg = group(3)
    data = batch(4)
    results = wg.identity(data)
    assert all(r is data for r in results)


def test_unregistered_method_is_not_exposed():
    wg = group(2)
    with pytest.raises(AttributeError, match=r"DoublerWorker\.not_exposed is not registered"):
        wg.not_exposed()
    with pytest.raises(AttributeError, match="no attribute 'nothing_like_this'"):
        wg.nothing_like_this  # noqa: B018
    assert wg.method_names == [
        "checkpoint_path",
        "consume",
        "describe",
        "double",
        "double_with_kwargs",
        "drops_a_row",
        "identity",
    ]


def test_group_method_keeps_worker_name_and_doc():
    wg = group(1)
    assert wg.double.__name__ == "double"
    assert wg.double.__doc__ == DoublerWorker.double.__doc__


def test_register_misuse():
    with pytest.raises(TypeError, match="with parentheses"):

        @register
        def f(self):
            return None

    with pytest.raises(ValueError, match="rank_zero_result applies to ONE_TO_ALL"):
        register(Dispatch.DP_COMPUTE, rank_zero_result=True)


def test_method_name_clashing_with_group_attribute():
    class Clash(Worker):
        @register(Dispatch.ONE_TO_ALL)
        def world_size(self):  # type: ignore[override]
            return 0

    with pytest.raises(ValueError, match=r"Clash\.world_size clashes with WorkerGroup"):
        LocalWorkerGroup(Clash, ResourcePool([1]))


def test_worker_errors_name_the_rank():
    class Failing(Worker):
        @register(Dispatch.ONE_TO_ALL)
        def boom(self):
            if self.rank == 1:
                raise RuntimeError("bad rank")
            return self.rank

    wg = LocalWorkerGroup(Failing, ResourcePool([2]))
    with pytest.raises(RuntimeError, match="bad rank") as err:
        wg.boom()
    assert "on rank 1" in "".join(getattr(err.value, "__notes__", ["on rank 1"]))


class CriticLike(Worker):
    def __init__(self, bias: float) -> None:
        super().__init__()
        self.bias = bias

    @register(Dispatch.DP_COMPUTE)
    def values(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"values": data.batch["x"] + self.bias})

    @register(Dispatch.ONE_TO_ALL)
    def rank_seen(self) -> int:
        return self.rank


def test_colocated_workers_share_ranks_and_spawn_role_groups():
    cls = create_colocated_worker_cls(
        {
            "actor": ClassWithInitArgs(DoublerWorker, scale=10.0),
            "critic": ClassWithInitArgs(CriticLike, 0.5),
        }
    )
    wg = LocalWorkerGroup(cls, ResourcePool([2]))
    assert wg.method_names == []
    roles = wg.spawn()
    assert sorted(roles) == ["actor", "critic"]
    actor, critic = roles["actor"], roles["critic"]
    assert actor.double(batch(3)).batch["doubled"].tolist() == [0.0, 10.0, 20.0]
    assert critic.values(batch(4)).batch["values"].tolist() == [0.5, 1.5, 2.5, 3.5]
    assert critic.rank_seen() == [0, 1]
    assert "double" not in critic.method_names
    with pytest.raises(AttributeError, match="no attribute 'double'"):
        critic.double  # noqa: B018
    # both roles live in the same per-rank objects
    assert wg.workers[1].role_workers["actor"] is actor.workers[1]
    assert wg.workers[1].call_role("critic", "rank_seen") == 1
    with pytest.raises(TypeError, match="spawn"):
        actor.spawn()


def test_submit_returns_a_completed_future_that_raises_on_result():
    class Failing(Worker):
        @register(Dispatch.ONE_TO_ALL)
        def boom(self):
            raise RuntimeError(f"bad rank {self.rank}")

    wg = LocalWorkerGroup(Failing, ResourcePool([2]))
    future = wg.submit("boom")  # runs now; the error waits for result()
    assert future.done()
    for _ in range(2):  # the error is kept
        with pytest.raises(RuntimeError, match="bad rank 0"):
            future.result()
    with pytest.raises(AttributeError, match=r"Failing\.nothing is not a registered method"):
        wg.submit("nothing")


def test_submit_forms_gather_like_the_blocking_call():
    wg = group(2)
    data = batch(5)
    by_name = wg.submit("double", data).result()
    by_attr = wg.double.submit(data).result()
    assert by_name.batch["doubled"].tolist() == by_attr.batch["doubled"].tolist()
    assert by_name.batch["doubled"].tolist() == wg.double(data).batch["doubled"].tolist()
    with wg as same:  # shutdown() is a no-op for in-process workers
        assert same.describe("x")[0] == ("x", 0, 2, 0)


def test_make_worker_group_picks_the_backend():
    wg = make_worker_group("local", DoublerWorker, ResourcePool([2]), scale=4.0)
    assert isinstance(wg, LocalWorkerGroup)
    assert [w.scale for w in wg.workers] == [4.0, 4.0]
    with pytest.raises(ValueError, match=r"unknown worker-group backend 'mpi'.*\('local', 'ray'\)"):
        make_worker_group("mpi", DoublerWorker, ResourcePool([1]))


def test_worker_died_error_message_and_pickling():
    err = WorkerDiedError("CriticWorker", 3, "killed by SIGKILL", method="compute_values")
    assert isinstance(err, RuntimeError)
    assert str(err) == "worker CriticWorker rank 3 died during 'compute_values': killed by SIGKILL"
    again = pickle.loads(pickle.dumps(err))
    assert (again.role, again.rank, again.cause, again.method) == (
        "CriticWorker",
        3,
        "killed by SIGKILL",
        "compute_values",
    )


def test_a_stop_request_reaches_every_worker_and_the_first_wins():
    group = make_worker_group("local", DoublerWorker, ResourcePool([2]))
    assert [w.stop_signum for w in group.workers] == [None, None]
    group.request_stop(15)
    group.request_stop(2)
    assert [w.stop_signum for w in group.workers] == [15, 15]


class CountsCloses(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_shutdown_closes_every_worker_once_and_leaves_them_readable():
    group = make_worker_group("local", CountsCloses, ResourcePool([2]))
    group.shutdown()
    group.shutdown()
    assert [w.closed for w in group.workers] == [1, 1]
    # colocated: every role's worker, through any role's view
    cls = create_colocated_worker_cls({"actor": CountsCloses, "critic": CountsCloses})
    roles = LocalWorkerGroup(cls, ResourcePool([2])).spawn()
    roles["critic"].shutdown()
    roles["actor"].shutdown()
    assert [w.closed for r in ("actor", "critic") for w in roles[r].workers] == [1, 1, 1, 1]
