"""The bucketed, time-limited weight push (verl/rollout/weight_sync.py), with fake receivers."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from verl.rollout.weight_sync import (
    WeightSyncError,
    WeightSyncTimeout,
    iter_buckets,
    push_weights,
)


def _weights() -> list[tuple[str, torch.Tensor]]:
    # 400, 400, 4000 and 40 bytes of float32
    return [
        ("a", torch.arange(100, dtype=torch.float32)),
        ("b", torch.ones(10, 10)),
        ("big", torch.full((1000,), 2.0)),
        ("c", torch.zeros(10)),
    ]


def test_buckets_keep_order_and_size_limit():
    buckets = list(iter_buckets(_weights(), bucket_bytes=800))
    assert [[name for name, _ in b] for b in buckets] == [["a", "b"], ["big"], ["c"]]
    assert [len(b) for b in iter_buckets(_weights(), bucket_bytes=10**6)] == [4]
    with pytest.raises(ValueError, match="bucket_bytes=0"):
        list(iter_buckets(_weights(), bucket_bytes=0))


def test_push_delivers_every_tensor_once_in_order():
    got: list[tuple[str, torch.Tensor]] = []
    threads: list[str] = []

    def receive(weights):
        threads.append(threading.current_thread().name)
        assert not torch.is_grad_enabled()
        got.extend(weights)

    stats = push_weights(
        receive, _weights(), bucket_bytes=800, timeout_s=5, role="actor_rollout_ref", engine="x"
    )
    assert [name for name, _ in got] == ["a", "b", "big", "c"]
    for (_, sent), (_, received) in zip(_weights(), got):
        assert torch.equal(sent, received)
    assert stats["buckets"] == 3
    assert stats["megabytes"] == pytest.approx(4840 / 2**20)
    assert threads == ["verl-weight-sync-x"]


def test_stalled_receiver_times_out_naming_role_bucket_and_seconds():
    release = threading.Event()

    def receive(weights):
        for name, _ in weights:
            if name == "big":  # stalls while loading the second bucket
                release.wait(30)

    start = time.monotonic()
    with pytest.raises(WeightSyncTimeout) as info:
        push_weights(
            receive,
            _weights(),
            bucket_bytes=800,
            timeout_s=0.3,
            role="actor_rollout_ref",
            engine="vllm",
            timeout_key="actor_rollout_ref.rollout.vllm.weight_sync_timeout_s",
        )
    elapsed = time.monotonic() - start
    release.set()  # let the stalled helper thread end
    message = str(info.value)
    assert message.startswith("actor_rollout_ref: weight sync to the vllm rollout engine timed out")
    assert "after 0.3 s waiting for bucket 2/3 (1 tensors from 'big', 0.0 MiB)" in message
    assert "actor_rollout_ref.rollout.vllm.weight_sync_timeout_s=0.3" in message
    assert 0.3 <= elapsed < 5
    assert isinstance(info.value, TimeoutError)


def test_receiver_that_never_returns_times_out_after_the_last_bucket():
    release = threading.Event()

    def receive(weights):
        list(weights)
        release.wait(30)

    with pytest.raises(WeightSyncTimeout, match="waiting for the load to finish"):
        push_weights(receive, _weights(), bucket_bytes=800, timeout_s=0.3, role="r", engine="e")
    release.set()


def test_failing_receiver_is_reported_not_waited_for():
    def receive(weights):
        next(iter(weights))
        raise KeyError("model.layers.0.q_proj.weight")

    start = time.monotonic()
    with pytest.raises(
        WeightSyncError, match="r: the e rollout engine failed while loading"
    ) as info:
        push_weights(receive, _weights(), bucket_bytes=800, timeout_s=20, role="r", engine="e")
    assert time.monotonic() - start < 5  # not the 20 s timeout
    assert isinstance(info.value.__cause__, KeyError)


def test_receiver_that_skips_tensors_is_an_error():
    with pytest.raises(WeightSyncError, match="loader returned before bucket 1/3"):
        push_weights(
            lambda w: None, _weights(), bucket_bytes=800, timeout_s=20, role="r", engine="e"
        )


def test_bad_timeout():
    with pytest.raises(ValueError, match="timeout_s=0"):
        push_weights(list, _weights(), bucket_bytes=800, timeout_s=0, role="r", engine="e")
