"""PF-PPO: resample a step's responses by reward, so the update sees fewer noisy ones.

Policy Filtration for PPO (Zhang et al., 2024) starts from the observation that a reward
model is most reliable at the ends of its range: it trains on responses drawn from the step's
batch with weights that favour extreme (or the best) scores. Here, after advantages are
computed, the batch is redrawn with replacement to its own size, each response with
probability proportional to its weight (``algorithm.use_pf_ppo=true``). The weight functions
are entries of :data:`PF_PPO_WEIGHTS` (``algorithm.pf_ppo.reweight_method``):

- ``pow``: ``|score| ** weight_pow`` (``algorithm.pf_ppo.weight_pow``, default 2);
- ``max_min``: 1 for the responses with the batch's highest or lowest score, else 0;
- ``max_random``: 0.4 for the highest-scored responses, 0.1 for every other one.

A response's score is the sum of its ``token_level_scores`` (the reward, before any
in-reward KL penalty). When every weight is 0 (``pow`` on an all-zero batch) the draw is
uniform. The draw uses a generator seeded by the run's seed and the step, so a resumed run
draws the same rows.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.registry import PF_PPO_WEIGHTS

__all__ = [
    "PF_PPO_WEIGHTS",
    "max_min_weights",
    "max_random_weights",
    "pf_ppo_indices",
    "pow_weights",
]


def pow_weights(scores: torch.Tensor, weight_pow: float = 2.0) -> torch.Tensor:
    """``|score| ** weight_pow``: responses far from a score of 0 are drawn more often."""
    return scores.abs().pow(weight_pow)


def max_min_weights(scores: torch.Tensor) -> torch.Tensor:
    """1 for the batch's best and worst scored responses, 0 for the rest."""
    extreme = (scores == scores.max()) | (scores == scores.min())
    return extreme.to(scores.dtype)


def max_random_weights(scores: torch.Tensor) -> torch.Tensor:
    """0.4 for the batch's best scored responses, 0.1 for every other one."""
    return torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)


def pf_ppo_indices(
    scores: torch.Tensor,
    reweight_method: str = "pow",
    weight_pow: float = 2.0,
    *,
    seed: int = 0,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The rows to train on: ``len(scores)`` draws with replacement, by weight.

    Args:
        scores: ``(batch,)`` sequence scores.
        reweight_method: a :data:`PF_PPO_WEIGHTS` name.
        weight_pow: the exponent of ``pow`` (passed to entries that take it).
        seed: seeds the draw (the trainer passes one derived from the run seed and step).

    Returns:
        ``(indices, metrics)``: the sorted row indices, and ``pf_ppo/unique_fraction`` (the
        share of rows drawn at least once) and ``pf_ppo/score_mean`` (the drawn rows' mean
        score, beside ``critic/score/mean`` of the whole batch).
    """
    if scores.dim() != 1 or scores.numel() == 0:
        raise ValueError(
            f"pf_ppo: scores must be a non-empty 1-D tensor, got {tuple(scores.shape)}"
        )
    scores = scores.detach().double()
    entry = PF_PPO_WEIGHTS.entry(reweight_method)
    fn = entry.target
    weights = fn(**entry.call_kwargs({"scores": scores, "weight_pow": weight_pow}))
    if not torch.isfinite(weights).all() or (weights < 0).any():
        raise ValueError(
            f"pf_ppo: reweight_method={reweight_method!r} gave weights that are negative or "
            f"not finite (scores {scores.min().item():.4g}..{scores.max().item():.4g}, "
            f"weight_pow={weight_pow})"
        )
    if weights.sum() <= 0:
        weights = torch.ones_like(weights)
    generator = torch.Generator().manual_seed(seed)
    n = scores.numel()
    indices = torch.multinomial(weights, n, replacement=True, generator=generator).sort().values
    metrics = {
        "pf_ppo/unique_fraction": indices.unique().numel() / n,
        "pf_ppo/score_mean": scores[indices].mean().item(),
    }
    return indices, metrics
