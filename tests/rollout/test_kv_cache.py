"""PreallocatedKVCache: fan-out prefill write, in-place decode writes, row selection."""

import pytest
import torch

from verl.rollout.kv_cache import PreallocatedKVCache


def test_fan_out_decode_and_select_rows():
    cache = PreallocatedKVCache(num_layers=2, rows=6, max_len=5, repeats=3)
    k = torch.arange(2 * 2 * 3 * 4, dtype=torch.float32).view(2, 2, 3, 4)  # 2 prompts, 3 tokens
    v = -k
    keys, values = cache.update(k, v, 0)
    assert keys is k and values is v  # prefill attends over the un-repeated prompts
    cache.update(k, v, 1)
    assert cache.length == 3 and cache.get_seq_length() == 3
    layer = cache.layers[0]
    assert torch.equal(layer.keys[:, :, :3], k.repeat_interleave(3, dim=0))
    assert torch.equal(layer.values[:, :, :3], v.repeat_interleave(3, dim=0))

    step = torch.full((6, 2, 1, 4), 7.0)
    keys, _ = cache.update(step, step, 0)
    assert keys.shape == (6, 2, 4, 4)
    assert keys.data_ptr() == layer.keys.data_ptr()  # a view of the buffer, no copy
    assert bool((keys[:, :, 3] == 7).all())

    keep = torch.tensor([1, 4, 5])
    before = layer.keys[:, :, :4].clone()
    cache.select_rows(keep)
    assert cache.layers[0].keys.shape == (3, 2, 5, 4)
    assert torch.equal(cache.layers[0].keys[:, :, :4], before[keep])
    assert cache.length == 4


def test_static_mode_writes_at_the_column_tensor_and_returns_the_whole_buffer():
    cache = PreallocatedKVCache(num_layers=1, rows=4, max_len=6, repeats=2, static=True)
    k = torch.randn(2, 2, 3, 4)  # 2 prompts, 3 tokens, fanned out to 4 rows
    keys, _ = cache.update(k, -k, 0)
    assert keys is k and cache.length == 3
    layer = cache.layers[0]
    assert int(layer.column) == 3
    step = torch.full((4, 2, 1, 4), 5.0)
    keys, values = cache.update(step, -step, 0)
    assert keys.shape == (4, 2, 6, 4)  # every column: a compiled step sees one shape
    assert keys.data_ptr() == layer.keys.data_ptr()
    assert bool((keys[:, :, 3] == 5).all()) and bool((values[:, :, 3] == -5).all())
    assert torch.equal(keys[:, :, :3], k.repeat_interleave(2, dim=0))
    assert int(layer.column) == 4 and cache.length == 3  # the int is the caller's to advance
    cache.advance(1)
    assert cache.length == 4 and cache.get_seq_length() == 4
    cache.update(step * 2, step, 0)
    assert bool((layer.keys[:, :, 4] == 10).all())
    cache.advance(1)
    cache.update(step, step, 0)
    with pytest.raises(RuntimeError, match="max_len=6"):
        cache.advance(2)


def test_round_to_stores_rounded_values_in_the_cache_dtype():
    cache = PreallocatedKVCache(1, rows=2, max_len=4, dtype=torch.float32, round_to=torch.bfloat16)
    k = torch.randn(2, 1, 3, 4)
    v = torch.randn(2, 1, 3, 4, dtype=torch.bfloat16)
    keys, values = cache.layers[0].update(k, v)
    assert keys.dtype == values.dtype == torch.float32
    assert torch.equal(keys, k.to(torch.bfloat16).float())
    assert not torch.equal(keys, k)  # rounding happened
    assert torch.equal(values, v.float())
