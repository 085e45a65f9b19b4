"""Tests for verl.protocol.DataProto."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from verl.protocol import DataProto


def make(n: int = 6) -> DataProto:
    """Row i has obs=[i, 10 i], ids=i, uid 'u{i}', a list [i]*2 and a dict {'i': i}."""
    return DataProto.from_dict(
        tensors={
            "obs": torch.stack([torch.arange(n), 10 * torch.arange(n)], dim=1).float(),
            "ids": torch.arange(n),
        },
        non_tensors={
            "uid": [f"u{i}" for i in range(n)],
            "msgs": [[i, i] for i in range(n)],
            "extra": [{"i": i} for i in range(n)],
        },
        meta_info={"temperature": 1.0},
    )


def row_ids(dp: DataProto) -> list[int]:
    return dp.batch["ids"].tolist()


# ---------------------------------------------------------------- construction


def test_from_dict_builds_1d_object_arrays_for_lists_of_lists_and_dicts():
    dp = make(4)
    assert len(dp) == 4
    msgs = dp.non_tensor_batch["msgs"]
    assert msgs.dtype == object and msgs.shape == (4,)
    assert msgs[2] == [2, 2]
    assert dp.non_tensor_batch["extra"][3] == {"i": 3}
    assert dp.non_tensor_batch["uid"].dtype == object


def test_from_dict_keeps_tuples_and_empty_lists_as_elements():
    dp = DataProto.from_dict(non_tensors={"pair": [(1, 2), (3, 4)], "empty": [[], []]})
    assert dp.non_tensor_batch["pair"].shape == (2,)
    assert dp.non_tensor_batch["pair"][1] == (3, 4)
    assert dp.non_tensor_batch["empty"].tolist() == [[], []]


def test_from_dict_converts_2d_numeric_array_to_rows():
    dp = DataProto.from_dict(non_tensors={"pairs": np.arange(6).reshape(3, 2)})
    arr = dp.non_tensor_batch["pairs"]
    assert arr.shape == (3,) and arr.dtype == object
    assert arr[1].tolist() == [2, 3]


def test_from_dict_rejects_mismatched_tensor_sizes_naming_keys_and_sizes():
    with pytest.raises(ValueError) as err:
        DataProto.from_dict(tensors={"a": torch.zeros(4, 2), "b": torch.zeros(3)})
    msg = str(err.value)
    assert "batch['a']: 4" in msg and "batch['b']: 3" in msg


def test_from_dict_rejects_non_tensor_length_mismatch():
    with pytest.raises(ValueError) as err:
        DataProto.from_dict(tensors={"a": torch.zeros(4)}, non_tensors={"uid": ["x"] * 5})
    assert "non_tensor_batch['uid']: 5" in str(err.value)
    assert "batch['a']: 4" in str(err.value)


def test_from_dict_rejects_scalar_tensor_and_scalar_non_tensor():
    with pytest.raises(ValueError, match="0-d tensor"):
        DataProto.from_dict(tensors={"a": torch.tensor(1.0)})
    with pytest.raises(TypeError, match="meta_info"):
        DataProto.from_dict(non_tensors={"a": 3})


def test_key_in_both_batch_and_non_tensor_is_rejected():
    with pytest.raises(ValueError, match="'x' is in both"):
        DataProto.from_dict(tensors={"x": torch.zeros(2)}, non_tensors={"x": [1, 2]})


def test_from_single_dict_splits_tensors_and_others():
    dp = DataProto.from_single_dict(
        {"ids": torch.arange(3), "uid": ["a", "b", "c"], "gt": np.array([1, 2, 3])},
        meta_info={"step": 7},
    )
    assert list(dp.batch) == ["ids"]
    assert sorted(dp.non_tensor_batch) == ["gt", "uid"]
    assert dp.non_tensor_batch["gt"].tolist() == [1, 2, 3]
    assert dp.meta_info == {"step": 7}
    with pytest.raises(TypeError, match="'lr'"):
        DataProto.from_single_dict({"ids": torch.arange(3), "lr": 0.1})


def test_len_of_empty_and_non_tensor_only():
    assert len(DataProto()) == 0
    assert len(DataProto.from_dict(non_tensors={"uid": ["a", "b"]})) == 2


def test_repr_lists_keys_shapes_dtypes():
    r = repr(make(4))
    assert "len=4" in r
    assert "obs: (4, 2) float32" in r
    assert "ids: (4,) int64" in r
    assert "uid: (4,) object" in r
    assert "temperature" in r


# ---------------------------------------------------------------- key operations


def test_select_shares_tensors_and_copies_dicts():
    dp = make(4)
    sub = dp.select(batch_keys=["ids"], non_tensor_keys=["uid"], meta_keys=[])
    assert list(sub.batch) == ["ids"] and list(sub.non_tensor_batch) == ["uid"]
    assert sub.meta_info == {}
    assert sub.batch["ids"] is dp.batch["ids"]
    everything = dp.select()
    assert sorted(everything.batch) == ["ids", "obs"]
    assert everything.meta_info == {"temperature": 1.0}
    everything.meta_info["x"] = 1
    assert "x" not in dp.meta_info


def test_select_missing_key_names_available_keys():
    with pytest.raises(KeyError) as err:
        make().select(batch_keys=["nope"])
    assert "nope" in str(err.value) and "['ids', 'obs']" in str(err.value)


def test_pop_removes_and_returns():
    dp = make(4)
    popped = dp.pop(batch_keys=["obs"], non_tensor_keys=["msgs"], meta_keys=["temperature"])
    assert list(popped.batch) == ["obs"] and list(popped.non_tensor_batch) == ["msgs"]
    assert popped.meta_info == {"temperature": 1.0}
    assert list(dp.batch) == ["ids"]
    assert sorted(dp.non_tensor_batch) == ["extra", "uid"]
    assert dp.meta_info == {}
    assert len(popped) == 4


def test_union_adds_keys_in_place_and_accepts_equal_duplicates():
    dp = make(4)
    other = DataProto.from_dict(
        tensors={"values": torch.ones(4, 3), "ids": torch.arange(4)},  # equal copy of ids
        non_tensors={"uid": [f"u{i}" for i in range(4)]},
        meta_info={"temperature": 1.0, "step": 2},
    )
    out = dp.union(other)
    assert out is dp
    assert sorted(dp.batch) == ["ids", "obs", "values"]
    assert dp.meta_info == {"temperature": 1.0, "step": 2}


def test_union_conflicts_raise_naming_key():
    dp = make(4)
    with pytest.raises(ValueError, match="'ids' exists in both"):
        dp.union(DataProto.from_dict(tensors={"ids": torch.arange(4) + 1}))
    with pytest.raises(ValueError, match="'uid' exists in both"):
        dp.union(DataProto.from_dict(non_tensors={"uid": list("abcd")}))
    with pytest.raises(ValueError, match="'temperature' exists in both"):
        dp.union(DataProto(meta_info={"temperature": 0.5}))
    with pytest.raises(ValueError, match=r"batch sizes differ \(4 vs 3\)"):
        dp.union(DataProto.from_dict(tensors={"x": torch.zeros(3)}))


def test_rename():
    dp = make(3)
    dp.rename("ids", "index").rename(["uid"], ["prompt_uid"])
    assert "index" in dp.batch and "ids" not in dp.batch
    assert "prompt_uid" in dp.non_tensor_batch
    with pytest.raises(KeyError, match="no key 'missing'"):
        dp.rename("missing", "y")
    with pytest.raises(ValueError, match="'obs' already exists"):
        dp.rename("index", "obs")


# ---------------------------------------------------------------- row operations


def test_slicing_returns_views():
    dp = make(6)
    part = dp[2:5]
    assert row_ids(part) == [2, 3, 4]
    assert part.non_tensor_batch["uid"].tolist() == ["u2", "u3", "u4"]
    assert part.meta_info == {"temperature": 1.0}
    assert part.batch["ids"].data_ptr() == dp.batch["ids"][2:].data_ptr()


@pytest.mark.parametrize(
    "index",
    [[4, 0, 2], np.array([4, 0, 2]), torch.tensor([4, 0, 2]), torch.tensor([-2, 0, 2])],
)
def test_integer_array_indexing(index):
    part = make(6)[index]
    assert row_ids(part) == [4, 0, 2]
    assert part.non_tensor_batch["msgs"].tolist() == [[4, 4], [0, 0], [2, 2]]
    assert part.batch["obs"][:, 1].tolist() == [40.0, 0.0, 20.0]


def test_boolean_mask_indexing():
    mask = torch.tensor([True, False, True, False, False, True])
    part = make(6)[mask]
    assert row_ids(part) == [0, 2, 5]
    assert part.non_tensor_batch["uid"].tolist() == ["u0", "u2", "u5"]


def test_bad_indexes():
    dp = make(3)
    with pytest.raises(TypeError, match=r"dp\[1:2\]"):
        dp[1]
    with pytest.raises(IndexError, match="out of range"):
        dp[[0, 3]]
    with pytest.raises(IndexError, match="length 2"):
        dp[np.array([True, False])]


@pytest.mark.parametrize("chunks", [1, 2, 3, 6])
def test_chunk_concat_round_trip_exact(chunks):
    dp = make(6)
    pieces = dp.chunk(chunks)
    assert [len(p) for p in pieces] == [6 // chunks] * chunks
    assert row_ids(pieces[-1])[-1] == 5
    assert DataProto.concat(pieces).equals(dp)


def test_chunk_not_dividing_tells_to_pad():
    with pytest.raises(ValueError) as err:
        make(5).chunk(2)
    assert "batch size 5" in str(err.value) and "pad_to_divisor(2)" in str(err.value)


def test_concat_errors_and_meta_from_first():
    a, b = make(2), make(3)
    b.meta_info["temperature"] = 9.0
    merged = DataProto.concat([a, b])
    assert row_ids(merged) == [0, 1, 0, 1, 2]
    assert merged.meta_info == {"temperature": 1.0}
    b.pop(batch_keys=["obs"])
    with pytest.raises(ValueError, match=r"item 1 has batch keys \['ids'\]"):
        DataProto.concat([a, b])
    with pytest.raises(ValueError, match="empty list"):
        DataProto.concat([])


def test_split_last_piece_shorter():
    pieces = make(7).split(3)
    assert [row_ids(p) for p in pieces] == [[0, 1, 2], [3, 4, 5], [6]]
    assert DataProto.concat(pieces).equals(make(7))


def test_repeat_interleave_orders():
    dp = make(2)
    inter = dp.repeat(3, interleave=True)
    assert row_ids(inter) == [0, 0, 0, 1, 1, 1]
    assert inter.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u0", "u1", "u1", "u1"]
    assert inter.batch["obs"][:, 1].tolist() == [0.0, 0.0, 0.0, 10.0, 10.0, 10.0]
    tiled = dp.repeat(3, interleave=False)
    assert row_ids(tiled) == [0, 1, 0, 1, 0, 1]
    assert tiled.non_tensor_batch["msgs"].tolist() == [[0, 0], [1, 1]] * 3
    assert tiled.batch["obs"].shape == (6, 2)


def test_reorder_in_place():
    dp = make(4)
    out = dp.reorder(torch.tensor([3, 1, 0, 2]))
    assert out is dp
    assert row_ids(dp) == [3, 1, 0, 2]
    assert dp.non_tensor_batch["extra"].tolist() == [{"i": 3}, {"i": 1}, {"i": 0}, {"i": 2}]
    with pytest.raises(ValueError, match="permutation of range"):
        dp.reorder([0, 0, 1, 2])


@pytest.mark.parametrize(
    ("n", "divisor", "expected_pad", "expected_ids"),
    [
        (6, 3, 0, [0, 1, 2, 3, 4, 5]),
        (5, 4, 3, [0, 1, 2, 3, 4, 0, 1, 2]),
        (2, 8, 6, [0, 1, 0, 1, 0, 1, 0, 1]),
    ],
)
def test_pad_unpad_round_trip(n, divisor, expected_pad, expected_ids):
    dp = make(n)
    original = dp.clone()
    pad = dp.pad_to_divisor(divisor)
    assert pad == expected_pad
    assert row_ids(dp) == expected_ids
    assert len(dp.non_tensor_batch["uid"]) == n + pad
    dp.unpad(pad)
    assert dp.equals(original)


def test_unpad_bounds():
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        make(3).unpad(4)


def test_to_and_clone():
    dp = make(3)
    copy = dp.clone()
    copy.batch["ids"][0] = 100
    copy.non_tensor_batch["extra"][0]["i"] = 100
    assert dp.batch["ids"][0] == 0 and dp.non_tensor_batch["extra"][0] == {"i": 0}
    assert dp.to("cpu") is dp
    assert dp.batch["obs"].device.type == "cpu"


def test_pickle_round_trip_equal():
    dp = make(5)
    back = pickle.loads(pickle.dumps(dp))
    assert back.equals(dp)
    assert back.non_tensor_batch["msgs"].shape == (5,)


def test_pickling_a_chunk_does_not_carry_the_whole_storage():
    big = DataProto.from_dict(tensors={"x": torch.zeros(10_000, 100)})  # 4,000,000 bytes
    piece = big.chunk(100)[3]  # 100 rows: 40,000 bytes
    assert len(pickle.dumps(big)) > 4_000_000
    assert 40_000 < len(pickle.dumps(piece)) < 41_000
    assert pickle.loads(pickle.dumps(piece)).equals(piece)
