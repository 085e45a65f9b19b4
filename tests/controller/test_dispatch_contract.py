"""The data contract: a method's declared ``reads`` decide what crosses to its workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.controller import Dispatch, LocalWorkerGroup, ResourcePool, Worker, register
from verl.controller.dispatch import get_method_dispatch, select_inputs
from verl.protocol import DataProto


class ContractWorker(Worker):
    """Records what each call received."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[DataProto] = []

    @register(
        dispatch_mode=Dispatch.DP_COMPUTE,
        reads=("x", "uid"),
        optional=("bonus",),
        meta=("temperature",),
    )
    def scale(self, data: DataProto) -> DataProto:
        self.received.append(data)
        y = data.batch["x"] * data.meta_info.get("temperature", 1.0)
        if "bonus" in data.batch:
            y = y + data.batch["bonus"]
        return DataProto.from_dict(tensors={"y": y})

    @register(dispatch_mode=Dispatch.DP_COMPUTE, reads=("x",))
    def metrics(self, data: DataProto) -> dict[str, float]:
        return {"x/sum": float(data.batch["x"].sum())}

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def everything(self, data: DataProto) -> DataProto:
        self.received.append(data)
        return DataProto.from_dict(tensors={"x": data.batch["x"]})


def _batch(rows: int = 4, **extra_tensors: torch.Tensor) -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.arange(rows, dtype=torch.float32), **extra_tensors},
        non_tensors={
            "uid": np.array([f"u{i}" for i in range(rows)], dtype=object),
            "ground_truth": np.array(["big text"] * rows, dtype=object),
        },
        meta_info={"temperature": 2.0, "metrics": {"reward": 1.0}},
    )


def _group(ranks: int = 2) -> LocalWorkerGroup:
    return LocalWorkerGroup(ContractWorker, ResourcePool(process_on_nodes=[ranks]))


def test_only_declared_keys_and_meta_cross():
    wg = _group()
    data = _batch(unread=torch.ones(4, 100))
    out = wg.scale(data)
    assert torch.equal(out.batch["y"], data.batch["x"] * 2.0)
    for worker in wg.workers:
        (got,) = worker.received
        assert set(got.batch) == {"x"}
        assert set(got.non_tensor_batch) == {"uid"}
        assert got.meta_info == {"temperature": 2.0}  # the metrics stay on the driver
    # the caller's batch is untouched
    assert set(data.batch) == {"x", "unread"} and "metrics" in data.meta_info


def test_optional_key_is_sent_only_when_present():
    wg = _group(ranks=1)
    wg.scale(_batch())
    wg.scale(_batch(bonus=torch.full((4,), 10.0)))
    first, second = wg.workers[0].received
    assert "bonus" not in first.batch
    assert torch.equal(second.batch["bonus"], torch.full((4,), 10.0))


def test_missing_declared_key_names_method_and_key():
    wg = _group()
    data = _batch()
    data.non_tensor_batch.pop("uid")
    with pytest.raises(KeyError, match=r"ContractWorker\.scale reads batch key\(s\) \['uid'\]"):
        wg.scale(data)


def test_undeclared_method_still_gets_the_whole_batch():
    wg = _group(ranks=1)
    wg.everything(_batch())
    (got,) = wg.workers[0].received
    assert set(got.non_tensor_batch) == {"uid", "ground_truth"}
    assert set(got.meta_info) == {"temperature", "metrics"}


def test_dict_results_are_rank_zero_metrics():
    assert _group().metrics(_batch()) == {"x/sum": 0.0 + 1.0}  # rank 0 holds rows 0 and 1


def test_select_inputs_leaves_other_arguments_alone():
    spec = get_method_dispatch(ContractWorker.scale)
    args, kwargs = select_inputs(spec, (_batch(), 3), {"k": "v", "other": _batch()}, "m")
    assert args[1] == 3 and kwargs["k"] == "v"
    assert set(args[0].batch) == set(kwargs["other"].batch) == {"x"}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"reads": "x"}, TypeError, "tuple of key names"),
        ({"reads": ("x", "")}, TypeError, "empty key"),
        ({"optional": ("x",)}, ValueError, "declare reads too"),
        ({"reads": ("x",), "optional": ("x",)}, ValueError, "both reads and optional"),
        ({"reads": ()}, ValueError, "at least one batch key"),
    ],
)
def test_register_rejects_bad_declarations(kwargs, error, match):
    with pytest.raises(error, match=match):
        register(Dispatch.DP_COMPUTE, **kwargs)
