"""The critic's clipped value loss (PPO, Schulman et al. 2017; as in OpenAI baselines)."""

from __future__ import annotations

import torch

from verl.algorithms.core import masked_mean
from verl.algorithms.loss_agg import agg_loss

__all__ = ["compute_value_loss"]


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float | None,
    loss_agg_mode: str = "token-mean",
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped value loss ``0.5 * agg(max((v - R)**2, (clip(v, v_old - c, v_old + c) - R)**2))``.

    Clipping keeps the new value prediction within ``c`` of the value it had at rollout
    time, so one large update cannot move the critic far off.

    Args:
        vpreds: current value predictions ``v``, ``(batch, response_len)`` (differentiable).
        returns: targets ``R`` from the advantage estimator, ``(batch, response_len)``.
        values: values ``v_old`` recorded at rollout time, ``(batch, response_len)``.
        response_mask: ``(batch, response_len)``.
        cliprange_value: ``c``; ``None`` disables clipping (plain squared error).
        loss_agg_mode, loss_scale_factor: see :func:`verl.algorithms.loss_agg.agg_loss`.

    Returns:
        ``(loss, clipfrac)``: the 0-dim loss and the fraction of valid tokens where the clipped
        term was the larger one (a detached 0-dim tensor).
    """
    unclipped = (vpreds - returns) ** 2
    if cliprange_value is None:
        loss = agg_loss(unclipped, response_mask, loss_agg_mode, loss_scale_factor)
        return 0.5 * loss, vpreds.new_zeros(())
    if cliprange_value < 0:
        raise ValueError(f"cliprange_value={cliprange_value} must be >= 0 (or None for no clip)")
    vpred_clipped = values + torch.clamp(vpreds - values, -cliprange_value, cliprange_value)
    clipped = (vpred_clipped - returns) ** 2
    worst = torch.maximum(unclipped, clipped)
    loss = 0.5 * agg_loss(worst, response_mask, loss_agg_mode, loss_scale_factor)
    clipfrac = masked_mean((clipped > unclipped).to(vpreds.dtype), response_mask).detach()
    return loss, clipfrac
