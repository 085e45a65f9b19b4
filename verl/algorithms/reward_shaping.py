"""Reward shaping: penalties added to the sequence score before advantages are computed.

This is the one implementation of DAPO's overlong penalty; the reward manager's
`verl.rewards.manager.OverlongBuffer` holds the configuration and calls it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["overlong_penalty"]


def overlong_penalty(
    response_lengths: torch.Tensor | np.ndarray | Sequence[int],
    max_response_length: int,
    buffer_len: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), a penalty in
    ``[-penalty_factor, 0]`` per response.

    With ``L`` the response length and ``expected = max_response_length - buffer_len``::

        penalty = 0                                              L <= expected
                = -(L - expected) / buffer_len * penalty_factor  expected < L <= max_response_length
                = -penalty_factor                                L > max_response_length

    Boundaries, stated once: a response of exactly ``expected`` tokens is free, one of
    exactly ``max_response_length`` tokens gets ``-penalty_factor``. ``buffer_len ==
    max_response_length`` is allowed and makes the ramp cover the whole range
    (``expected = 0``: every non-empty response is penalised in proportion to its length,
    an empty one gets 0). ``buffer_len > max_response_length`` is an error (the ramp would
    start below zero length). Lengths above ``max_response_length`` (possible only when the
    limit is set below the batch's response width) get the paper's full ``-penalty_factor``.

    Args:
        response_lengths: ``(batch,)`` valid response tokens per row
            (``response_mask.sum(-1)``).
        max_response_length: the rollout's generation limit, >= 1.
        buffer_len: length of the linear ramp, ``1 <= buffer_len <= max_response_length``.
        penalty_factor: penalty at the limit (>= 0).

    Returns:
        ``(batch,)`` penalties to add to the score: float64 when the lengths are float64
        (the reward manager's numpy scores), float32 otherwise.
    """
    if not 0 < buffer_len <= max_response_length:
        raise ValueError(
            f"overlong buffer_len={buffer_len} must be in [1, max_response_length="
            f"{max_response_length}]"
        )
    if penalty_factor < 0:
        raise ValueError(
            f"overlong penalty_factor={penalty_factor} must be >= 0 (it is subtracted)"
        )
    lengths = torch.as_tensor(response_lengths)
    dtype = torch.float64 if lengths.dtype == torch.float64 else torch.float32
    exceed = lengths.to(dtype) - (max_response_length - buffer_len)
    ramp = exceed.clamp(min=0.0, max=float(buffer_len)) / buffer_len
    return ramp * -penalty_factor + 0.0  # + 0.0 turns -0.0 into 0.0
