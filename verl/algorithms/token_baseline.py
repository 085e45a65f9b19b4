"""The optimal token baseline (OTB): a per-timestep, variance-weighted group baseline.

A group baseline (GRPO, RLOO) subtracts one number from every token of a response. The
variance of the policy-gradient estimate is smallest when the baseline of timestep ``t`` is
the return ``G_t`` averaged with weights ``W_t``, the squared norm of the gradient that
the trajectory has accumulated up to ``t`` (for a softmax policy, the gradient of
``log pi(y_j)`` with respect to the logits has squared norm
``||e_{y_j} - pi_j||^2 = 1 - 2 pi_j(y_j) + sum_v pi_j(v)^2``)::

    w_{i,t} = 1 - 2 pi(y_{i,t}) + sum_v pi_{i,t}(v)^2         (pi of the old policy)
    W_{i,t} = sum_{j <= t} m_{i,j} w_{i,j}                    (cumulative path variance)
    G_{i,t} = sum_{j >= t} m_{i,j} r_{i,j}                    (reward-to-go)
    B_{g,t} = sum_{i in g} m_{i,t} W_{i,t} G_{i,t} / (sum_{i in g} m_{i,t} W_{i,t} + eps)
    A_{i,t} = m_{i,t} (G_{i,t} - B_{g,t})

Trajectories that have been through high-variance (uncertain) tokens weigh more in the
baseline of later timesteps. ``sum_v pi(v)^2`` comes from the actor's log-prob pass, which
returns it as ``sum_pi_squared`` because the registry entry declares
``needs_sum_pi_squared``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from verl.algorithms.advantages import group_ids_from_index

__all__ = ["compute_optimal_token_baseline_advantages"]


@torch.no_grad()
def compute_optimal_token_baseline_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    old_log_probs: torch.Tensor | None = None,
    sum_pi_squared: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages against the optimal token baseline (formula in the module docstring).

    Three cases where the weighted average is no baseline at all:

    - Where every response of the group that reaches timestep ``t`` has the same return
      ``G_t`` (all-equal outcome scores, a group of one), ``A = 0`` exactly there, whatever
      the float rounding of the weighted mean (float64 statistics).
    - ``handle_zero_tail``: where only one response of a group whose returns differ reaches
      ``t`` (the tail of the single longest response), its baseline would be its own
      return; the baseline there is 0 instead, so ``A = G_t`` (upstream verl's rule).
      ``False`` gives those tokens ``A = 0``.

    Args:
        token_level_rewards, response_mask: ``(batch, response_len)``.
        index: ``batch`` hashable prompt ids; responses sharing one form a group.
        old_log_probs: ``(batch, response_len)`` log-probs of the sampled tokens under the
            policy that sampled them (the trainer's recomputation).
        sum_pi_squared: ``(batch, response_len)`` ``sum_v pi(v)^2`` of the same policy.
        handle_zero_tail: see above.
        epsilon: added to the baseline's denominator.

    Returns:
        ``(advantages, returns)``, ``(batch, response_len)``: returns are the reward-to-go
        ``G`` on valid tokens, 0 elsewhere.
    """
    if old_log_probs is None or sum_pi_squared is None:
        raise ValueError(
            "optimal_token_baseline needs old_log_probs and sum_pi_squared from the actor's "
            "log-prob pass (its registry entry declares needs_sum_pi_squared)"
        )
    dtype = token_level_rewards.dtype
    mask = (response_mask != 0).to(torch.float64)
    rewards = torch.where(mask > 0, token_level_rewards.to(torch.float64), 0.0)
    returns = rewards.flip(-1).cumsum(-1).flip(-1) * mask
    pi = torch.exp(old_log_probs.to(torch.float64))
    w = (1.0 - 2.0 * pi + sum_pi_squared.to(torch.float64)) * mask
    cum_w = w.cumsum(-1) * mask

    ids, num_groups = group_ids_from_index(index, returns.shape[0], returns.device)
    shape = (num_groups, returns.shape[1])

    def group_sum(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(shape, dtype=x.dtype, device=x.device).index_add_(0, ids, x)

    baseline = (group_sum(cum_w * returns) / (group_sum(cum_w) + epsilon))[ids]
    covering = group_sum(mask)[ids]  # responses of the group that reach timestep t
    valid = mask > 0
    inf = torch.full(shape, torch.inf, dtype=returns.dtype, device=returns.device)
    hi = (-inf).scatter_reduce(
        0, _expand(ids, shape), torch.where(valid, returns, -torch.inf), "amax"
    )
    lo = inf.scatter_reduce(0, _expand(ids, shape), torch.where(valid, returns, torch.inf), "amin")
    all_equal_at_t = (hi == lo)[ids]
    row_differs = (~all_equal_at_t & valid).any(-1).long()
    group_differs = (
        torch.zeros(num_groups, dtype=torch.long, device=ids.device).index_add_(0, ids, row_differs)
        > 0
    )[ids]

    baseline = torch.where(all_equal_at_t, returns, baseline)
    if handle_zero_tail:
        tail = (covering == 1) & group_differs.unsqueeze(-1)
        baseline = torch.where(tail, 0.0, baseline)
    advantages = (returns - baseline) * mask
    return advantages.to(dtype), returns.to(dtype)


def _expand(ids: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """``ids`` as a ``(batch, response_len)`` index for a scatter into ``shape`` rows."""
    return ids.unsqueeze(-1).expand(-1, shape[1])
