"""Turn one score per sequence into token-level scores on the last valid response token."""

from __future__ import annotations

import torch


def last_valid_index(response_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last nonzero entry of each row of `response_mask` (batch, response_len).

    Rows with no valid token get index 0. Works for any mask, not only right-padded ones.
    Returns a long tensor of shape (batch,).
    """
    valid = response_mask != 0
    positions = torch.arange(valid.shape[1], device=valid.device).expand_as(valid)
    return torch.where(valid, positions, torch.zeros_like(positions)).amax(dim=1)


def place_on_last_token(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Scatter `scores` (batch,) onto the last valid token of each response.

    Returns float32 (batch, response_len), zero everywhere else, so that
    `out.sum(-1) == scores` row by row. A response with no valid token (zero length) gets
    its score at position 0: that token is masked out of every loss, but outcome-based
    estimators (GRPO, RLOO) that sum each row still see the sequence's score.
    """
    if scores.ndim != 1 or response_mask.ndim != 2 or scores.shape[0] != response_mask.shape[0]:
        raise ValueError(
            f"scores {tuple(scores.shape)} must be (batch,) and response_mask "
            f"{tuple(response_mask.shape)} (batch, response_len) with the same batch"
        )
    if response_mask.shape[1] == 0:
        raise ValueError("response_mask has response_len=0: there is no token to reward")
    out = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
    index = last_valid_index(response_mask)
    out[torch.arange(out.shape[0], device=out.device), index] = scores.to(out)
    return out
