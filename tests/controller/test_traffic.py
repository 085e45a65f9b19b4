"""TrafficMeter counts the pickled bytes and keys of every watched worker-group call."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.controller import Dispatch, LocalWorkerGroup, ResourcePool, Worker, register
from verl.controller.traffic import TrafficMeter, pickled_size
from verl.protocol import DataProto


class SumWorker(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def row_sums(self, data: DataProto) -> DataProto:
        return DataProto.from_dict(tensors={"s": data.batch["x"].sum(-1)})


def _batch(rows: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3)},
        non_tensors={"uid": np.array([f"u{i}" for i in range(rows)], dtype=object)},
        meta_info={"temperature": 0.7},
    )


def test_counts_each_ranks_chunk_and_result():
    wg = LocalWorkerGroup(SumWorker, ResourcePool(process_on_nodes=[2]))
    data = _batch(4)
    meter = TrafficMeter()
    with meter.watch(wg):
        out = wg.row_sums(data)
    assert torch.equal(out.batch["s"], data.batch["x"].sum(-1))
    assert [r.rank for r in meter.records] == [0, 1]
    # each rank's bytes are its own two-row chunk pickled, not the whole batch
    for record, chunk in zip(meter.records, data.chunk(2), strict=True):
        assert record.sent_bytes == pickled_size(((chunk,), {}))
        assert record.tensor_keys == {"x"}
        assert record.non_tensor_keys == {"uid"}
        assert record.meta_keys == {"temperature"}
        assert record.returned_bytes == pickled_size(
            DataProto.from_dict(tensors={"s": chunk.batch["x"].sum(-1)})
        )
    row = meter.by_method()["row_sums"]
    assert row["calls"] == 1
    assert row["sent_bytes"] == meter.sent_bytes() == sum(r.sent_bytes for r in meter.records)
    assert row["keys"] == {"x", "uid"}
    assert "row_sums" in meter.table()


def test_bytes_grow_with_the_batch_and_watch_restores_the_group():
    wg = LocalWorkerGroup(SumWorker, ResourcePool(process_on_nodes=[1]))
    small, large = TrafficMeter(), TrafficMeter()
    with small.watch(wg):
        wg.row_sums(_batch(2))
    with large.watch(wg):
        wg.row_sums(_batch(64))
    # 62 more rows of 3 float32 and a short string each
    assert large.sent_bytes() - small.sent_bytes() >= 62 * 3 * 4
    wg.row_sums(_batch(2))  # not watched any more: nothing recorded
    assert len(small.records) == len(large.records) == 1
    assert "_start" not in vars(wg)


def test_watch_rejects_a_non_group():
    meter = TrafficMeter()
    with pytest.raises(TypeError, match="not a WorkerGroup"), meter.watch(object()):  # type: ignore[arg-type]
        pass
