"""RunningMeanStd: batch-merged Welford equals the statistics of everything seen."""

from __future__ import annotations

import math

import numpy as np
import pytest

from verl.rewards.normalization import RunningMeanStd


def test_hand_computed_two_batches():
    rms = RunningMeanStd()
    rms.update(np.array([1.0, 3.0]))
    assert (rms.count, rms.mean, rms.var) == (2, 2.0, 1.0)
    rms.update(np.array([5.0, 7.0, 9.0]))
    # all five values: mean 5, population variance (16+4+0+4+16)/5 = 8
    assert rms.count == 5 and rms.mean == pytest.approx(5.0) and rms.var == pytest.approx(8.0)
    out = rms.normalize(np.array([5.0, 5.0 + math.sqrt(8.0)]))
    assert out == pytest.approx([0.0, 1.0], abs=1e-7)


def test_matches_numpy_over_many_uneven_batches():
    rng = np.random.default_rng(0)
    rms, seen = RunningMeanStd(), []
    for size in [1, 7, 0, 64, 3, 250]:
        batch = rng.normal(loc=100.0, scale=3.0, size=size)  # large offset: stability check
        rms.update(batch)
        seen.extend(batch)
    assert rms.count == len(seen)
    assert rms.mean == pytest.approx(np.mean(seen), rel=1e-12)
    assert rms.std == pytest.approx(np.std(seen), rel=1e-9)


def test_empty_and_constant_inputs():
    rms = RunningMeanStd(eps=1e-8)
    rms.update(np.array([]))
    assert rms.count == 0 and rms.std == 0.0
    rms.update(np.array([2.0, 2.0, 2.0]))
    assert rms.normalize(np.array([2.0])).tolist() == [0.0]  # no division blow-up


def test_state_dict_round_trip():
    rms = RunningMeanStd()
    rms.update(np.array([0.0, 1.0, 5.0]))
    other = RunningMeanStd()
    other.load_state_dict(rms.state_dict())
    assert (other.count, other.mean, other.m2) == (rms.count, rms.mean, rms.m2)
    with pytest.raises(KeyError, match="m2"):
        other.load_state_dict({"count": 1, "mean": 0.0})
