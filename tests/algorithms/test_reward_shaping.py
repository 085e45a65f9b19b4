"""DAPO's overlong penalty."""

import numpy as np
import pytest
import torch

from verl.algorithms.reward_shaping import overlong_penalty


def test_linear_ramp_inside_buffer():
    # max 20, buffer 4: free up to 16 tokens, then -1/4 per token down to -1 at 20
    out = overlong_penalty(
        [10, 16, 17, 18, 20], max_response_length=20, buffer_len=4, penalty_factor=1.0
    )
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0]))
    out = overlong_penalty(torch.tensor([18, 20]), 20, 4, penalty_factor=2.0)
    torch.testing.assert_close(out, torch.tensor([-1.0, -2.0]))


def test_bad_arguments():
    with pytest.raises(ValueError, match="buffer_len=0"):
        overlong_penalty([1], 20, 0, 1.0)
    with pytest.raises(ValueError, match="buffer_len=30"):
        overlong_penalty([1], 20, 30, 1.0)
    with pytest.raises(ValueError, match="penalty_factor=-1"):
        overlong_penalty([1], 20, 4, -1.0)


def test_boundaries():
    # the last free length and the limit itself
    out = overlong_penalty([15, 16, 20], max_response_length=20, buffer_len=4)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -1.0]))
    # beyond the limit (limit set below the batch width): the paper's full -factor, no further
    out = overlong_penalty([21, 40], max_response_length=20, buffer_len=4, penalty_factor=0.5)
    torch.testing.assert_close(out, torch.tensor([-0.5, -0.5]))
    # buffer_len == max_response_length: the ramp covers the whole range, empty is free
    out = overlong_penalty([0, 1, 10, 20], max_response_length=20, buffer_len=20)
    torch.testing.assert_close(out, torch.tensor([0.0, -0.05, -0.5, -1.0]))
    # no negative zero leaks into `penalty < 0` counts or logs
    assert not torch.signbit(overlong_penalty([0], 20, 4)).any()


def test_reward_manager_uses_the_same_penalty():
    # the manager's config object calls this function: same values, float64, same boundary
    from verl.rewards.manager import OverlongBuffer

    lengths = np.array([0, 1, 10, 20])
    got = OverlongBuffer(buffer_len=20).penalty(lengths, response_len=20)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, [0.0, -0.05, -0.5, -1.0])
    got = OverlongBuffer(4, 2.0, max_response_length=8).penalty(np.array([4, 6, 8, 12]), 16)
    np.testing.assert_allclose(got, [0.0, -1.0, -2.0, -2.0])
    with pytest.raises(ValueError, match=r"buffer_len=5 must be in \[1, max_response_length=4\]"):
        OverlongBuffer(5).penalty(lengths, response_len=4)
