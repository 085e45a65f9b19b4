"""Reward shaping: penalties added to the sequence score before advantages are computed."""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["overlong_penalty"]


def overlong_penalty(
    response_lengths: torch.Tensor | Sequence[int],
    max_response_length: int,
    buffer_len: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025), a penalty <= 0 per response.

    Responses up to ``max_response_length - buffer_len`` tokens get 0; inside the last
    ``buffer_len`` tokens the penalty falls linearly, reaching ``-penalty_factor`` at
    ``max_response_length``::

        penalty = min(0, -(length - (max_response_length - buffer_len)) / buffer_len
                          * penalty_factor)

    Args:
        response_lengths: ``(batch,)`` valid response tokens per row
            (``response_mask.sum(-1)``).
        max_response_length: the rollout's generation limit.
        buffer_len: length of the linear ramp, ``0 < buffer_len <= max_response_length``.
        penalty_factor: penalty at the limit (>= 0).

    Returns:
        ``(batch,)`` float32 penalties, to add to the score.
    """
    if not 0 < buffer_len <= max_response_length:
        raise ValueError(
            f"buffer_len={buffer_len} must be in (0, max_response_length={max_response_length}]"
        )
    if penalty_factor < 0:
        raise ValueError(f"penalty_factor={penalty_factor} must be >= 0 (it is subtracted)")
    lengths = torch.as_tensor(response_lengths).to(torch.float32)
    exceed = lengths - (max_response_length - buffer_len)
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)
