"""DAPO's overlong penalty."""

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
