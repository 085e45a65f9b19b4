"""Advantage estimators: per-token rewards (+ values or group ids) -> advantages and returns.

Every estimator is registered by name and called with keyword arguments; each takes what it
needs and ignores the rest (``**kwargs``), so the trainer can call any of them the same way::

    fn = get_advantage_estimator(config.algorithm.adv_estimator)
    advantages, returns = fn(token_level_rewards=r, response_mask=m, values=v, index=uid,
                             gamma=g, lam=l, reward_baselines=b)

Both outputs have shape ``(batch, response_len)`` and are 0 on masked tokens. The built-in
estimators are declared in :mod:`verl.registry.builtin` with what they need
(:func:`estimator_info`: ``needs_critic``, ``needs_index``, ``needs_baseline``,
``needs_reference``, ``needs_sum_pi_squared``); a new one is one :func:`register_advantage_estimator` decorator.

Outcome estimators (all but ``gae`` and ``reinforce_plus_plus``) work on the sequence
score ``s_i = sum_t mask * token_level_rewards``; rewards on masked positions are ignored,
so a zero-length response scores 0. Group statistics are computed in float64, and a group
whose scores are all equal (or a group of one) gets an advantage of exactly 0: float32
rounding of its mean would otherwise give every member the same nonzero advantage. ``index`` is a sequence of hashable prompt ids (the
``uid`` column: a numpy object array of strings, a list of ints, ...); responses sharing an
id form a group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from verl.algorithms.core import masked_whiten
from verl.registry import ADVANTAGE_ESTIMATORS

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "compute_gae_advantages",
    "compute_gpg_advantages",
    "compute_grpo_advantages",
    "compute_grpo_passk_advantages",
    "compute_opo_advantages",
    "compute_reinforce_plus_plus_advantages",
    "compute_reinforce_plus_plus_baseline_advantages",
    "compute_remax_advantages",
    "compute_rloo_advantages",
    "estimator_info",
    "estimator_requires_critic",
    "get_advantage_estimator",
    "group_ids_from_index",
    "informative_group_mask",
    "register_advantage_estimator",
]

AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def register_advantage_estimator(name: str, *aliases: str, override: bool = False, **needs: Any):
    """Decorator adding an estimator to :data:`ADVANTAGE_ESTIMATORS`.

    ``needs`` are ``needs_critic``, ``needs_index``, ``needs_baseline``,
    ``needs_reference`` and ``needs_sum_pi_squared`` (all default ``False``); the trainer derives from them which roles to
    place, whether to run the greedy baseline pass and what to pass. Keyword parameters with
    defaults that the trainer does not pass itself are the estimator's hyperparameters,
    settable with ``algorithm.adv_estimator_kwargs``.
    """
    return ADVANTAGE_ESTIMATORS.register(name, *aliases, override=override, **needs)


def get_advantage_estimator(name: str) -> AdvantageFn:
    """The estimator registered as ``name`` (raises listing the available names)."""
    return ADVANTAGE_ESTIMATORS.get(name)


def estimator_info(name: str) -> dict[str, Any]:
    """What estimator ``name`` needs: ``needs_critic``, ``needs_index``, ``needs_baseline``,
    ``needs_reference``, ``needs_sum_pi_squared``."""
    return ADVANTAGE_ESTIMATORS.info(name)


def estimator_requires_critic(name: str) -> bool:
    """Whether estimator ``name`` needs ``values`` from a critic (only ``gae`` built in)."""
    return bool(estimator_info(name)["needs_critic"])


# --------------------------------------------------------------------------- helpers


def group_ids_from_index(
    index: Sequence[Any] | np.ndarray | torch.Tensor, batch_size: int, device=None
) -> tuple[torch.Tensor, int]:
    """Map prompt ids to dense group numbers ``0..G-1`` in order of first appearance.

    Returns ``(group_ids (batch,) long, G)``. Raises if ``index`` is missing or its length
    differs from the batch.
    """
    if index is None:
        raise ValueError("this advantage estimator needs `index` (the prompt uid of each row)")
    if isinstance(index, (torch.Tensor, np.ndarray)):
        # tolist() turns tensor/numpy scalars into plain Python values, which hash by value
        # (a 0-dim tensor hashes by identity).
        index = index.tolist()
    keys = list(index)
    if len(keys) != batch_size:
        raise ValueError(f"len(index)={len(keys)} does not match batch size {batch_size}")
    dense: dict[Any, int] = {}
    ids = [dense.setdefault(k, len(dense)) for k in keys]
    return torch.tensor(ids, dtype=torch.long, device=device), len(dense)


def _group_sum(x: torch.Tensor, ids: torch.Tensor, num_groups: int) -> torch.Tensor:
    return torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(0, ids, x)


class _GroupStats(NamedTuple):
    """Per-row statistics of each row's group, all ``(batch,)`` float64 (``same`` bool)."""

    mean: torch.Tensor
    std: torch.Tensor  # unbiased
    count: torch.Tensor
    same: torch.Tensor  # the group's scores are all equal (max == min), groups of one too


def _group_stats(scores: torch.Tensor, index) -> _GroupStats:
    """Group mean, unbiased std, size and an all-equal flag of each row's group.

    Computed in float64, and ``same`` compares the group's max with its min exactly: the mean
    of three float32 copies of 5.7 is 5.6999993 with a std of 5.8e-7, so any estimator that
    trusted ``scores - mean`` (or ``std > 0``) would push the whole group one way. Callers give
    such groups an advantage of exactly 0.
    """
    scores = scores.to(torch.float64)
    ids, num_groups = group_ids_from_index(index, scores.shape[0], scores.device)
    counts = _group_sum(torch.ones_like(scores), ids, num_groups)
    mean = _group_sum(scores, ids, num_groups) / counts
    sq_dev = _group_sum((scores - mean[ids]) ** 2, ids, num_groups)
    std = torch.sqrt(sq_dev / torch.clamp(counts - 1, min=1))
    empty = torch.full((num_groups,), torch.inf, dtype=scores.dtype, device=scores.device)
    lo = empty.scatter_reduce(0, ids, scores, reduce="amin")
    hi = (-empty).scatter_reduce(0, ids, scores, reduce="amax")
    return _GroupStats(mean[ids], std[ids], counts[ids], (hi == lo)[ids])


def _sequence_scores(token_level_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask != 0, token_level_rewards * mask, 0.0).sum(dim=-1)


def _float_mask(response_mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return response_mask.to(device=like.device, dtype=like.dtype)


def _broadcast(seq_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return seq_values.unsqueeze(-1) * mask


# --------------------------------------------------------------------------- estimators


@torch.no_grad()
def compute_gae_advantages(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) with a critic.

    Backwards over the valid tokens: ``delta_t = r_t + gamma * V_next - V_t``,
    ``A_t = delta_t + gamma * lam * A_next`` where "next" is the next *valid* token; beyond
    the last valid token ``V_next = A_next = 0``. Masked positions are skipped (they carry
    ``V_next``/``A_next`` through unchanged and their rewards are ignored), so right padding
    never leaks into valid tokens and masked spans inside a response (e.g. tool output in a
    multi-turn rollout) are transparent.

    Args:
        token_level_rewards, values, response_mask: ``(batch, response_len)``.
        gamma: discount; lam: GAE lambda.

    Returns:
        ``advantages`` whitened over all valid tokens of the batch, and
        ``returns = advantages + values`` (before whitening); both 0 on masked tokens.
    """
    if values is None:
        raise ValueError("adv_estimator='gae' needs `values` from a critic")
    mask = _float_mask(response_mask, token_level_rewards)
    valid = mask != 0
    values = torch.where(valid, values.to(token_level_rewards.dtype), 0.0)
    rewards = torch.where(valid, token_level_rewards, 0.0)
    batch, length = rewards.shape
    next_value = rewards.new_zeros(batch)
    next_adv = rewards.new_zeros(batch)
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(length)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv_t = delta + gamma * lam * next_adv
        next_adv = torch.where(valid[:, t], adv_t, next_adv)
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        advantages[:, t] = next_adv
    returns = torch.where(valid, advantages + values, 0.0)
    advantages = masked_whiten(advantages, mask)
    return advantages, returns


@torch.no_grad()
def compute_grpo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al. 2024): the score relative to the other responses to the same prompt.

    ``A_i = (s_i - mean_g) / (std_g + epsilon)`` with the unbiased group std (as
    ``torch.std``), or ``A_i = s_i - mean_g`` when ``norm_adv_by_std=False`` (Dr.GRPO). A
    group of one has no baseline and gets 0, and so does a group whose scores are all equal
    (exactly 0, whatever the float rounding of its mean). Statistics in float64. Broadcast
    over valid tokens.

    Args:
        token_level_rewards, response_mask: ``(batch, response_len)``.
        index: ``batch`` hashable prompt ids.

    Returns:
        ``(advantages, returns)``, equal, ``(batch, response_len)``.
    """
    mask = _float_mask(response_mask, token_level_rewards)
    scores = _sequence_scores(token_level_rewards, mask)
    group = _group_stats(scores, index)
    adv = scores.to(torch.float64) - group.mean
    if norm_adv_by_std:
        adv = adv / (group.std + epsilon)
    adv = torch.where(group.same, 0.0, adv)
    advantages = _broadcast(adv.to(scores.dtype), mask)
    return advantages, advantages.clone()


@torch.no_grad()
def compute_rloo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out (Ahmadian et al. 2024): baseline = mean of the *other* scores.

    ``A_i = s_i - mean_{j != i} s_j = n / (n - 1) * (s_i - mean_g)`` for a group of ``n``;
    a group of one or of all-equal scores gets exactly 0. Broadcast over valid tokens; returns
    equal advantages.
    """
    mask = _float_mask(response_mask, token_level_rewards)
    scores = _sequence_scores(token_level_rewards, mask)
    group = _group_stats(scores, index)
    scale = group.count / torch.clamp(group.count - 1, min=1)
    adv = torch.where(group.same, 0.0, scale * (scores.to(torch.float64) - group.mean))
    advantages = _broadcast(adv.to(scores.dtype), mask)
    return advantages, advantages.clone()


@torch.no_grad()
def compute_reinforce_plus_plus_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025): discounted return-to-go, whitened over the batch.

    ``G_t = r_t + gamma * G_next`` over valid tokens (masked positions skipped as in GAE;
    ``G`` beyond the last valid token is 0). ``returns = G``; ``advantages`` = ``G`` whitened
    over every valid token of the batch. Both 0 on masked tokens.
    """
    mask = _float_mask(response_mask, token_level_rewards)
    valid = mask != 0
    rewards = torch.where(valid, token_level_rewards, 0.0)
    running = rewards.new_zeros(rewards.shape[0])
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(valid[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    returns = torch.where(valid, returns, 0.0)
    return masked_whiten(returns, mask), returns


@torch.no_grad()
def compute_reinforce_plus_plus_baseline_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group baseline: ``s_i - mean_g`` broadcast, then batch-whitened.

    The centred score is broadcast over valid tokens and whitened over every valid token of
    the batch (so long responses weigh more in the statistics). A group of one or of
    all-equal scores is centred to exactly 0 before whitening. Returns equal advantages.
    """
    mask = _float_mask(response_mask, token_level_rewards)
    scores = _sequence_scores(token_level_rewards, mask)
    group = _group_stats(scores, index)
    centred = torch.where(group.same, 0.0, scores.to(torch.float64) - group.mean)
    advantages = masked_whiten(_broadcast(centred.to(scores.dtype), mask), mask)
    return advantages, advantages.clone()


@torch.no_grad()
def compute_remax_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    reward_baselines: torch.Tensor,
    reward_to_go: bool = False,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023): score minus the score of a greedy rollout of the same prompt.

    Args:
        reward_baselines: ``(batch,)`` the greedy response's score for each row's prompt.
        reward_to_go: ``False`` (the paper): ``A_t = s_i - b_i`` on every valid token.
            ``True``: the causal form ``A_t = sum_{t' >= t} r_t' - b_i`` (the rewards of
            valid tokens from ``t`` on), which differs only with dense rewards (KL in the
            reward) and then has lower variance: a token is not credited with the KL
            penalties of the tokens before it. Upstream verl uses this form.

    Returns:
        ``(advantages, returns)``, equal, ``(batch, response_len)``, 0 on masked tokens.
    """
    if reward_baselines is None:
        raise ValueError("adv_estimator='remax' needs `reward_baselines` (greedy-rollout scores)")
    mask = _float_mask(response_mask, token_level_rewards)
    scores = _sequence_scores(token_level_rewards, mask)
    baselines = reward_baselines.to(device=scores.device, dtype=scores.dtype).reshape(-1)
    if baselines.shape[0] != scores.shape[0]:
        raise ValueError(
            f"reward_baselines has {baselines.shape[0]} entries for a batch of {scores.shape[0]}"
        )
    if reward_to_go:
        valid = mask != 0
        rewards = torch.where(valid, token_level_rewards, 0.0)
        to_go = rewards.flip(-1).cumsum(-1).flip(-1)
        advantages = torch.where(valid, to_go - baselines.unsqueeze(-1), 0.0)
    else:
        advantages = _broadcast(scores - baselines, mask)
    return advantages, advantages.clone()


@torch.no_grad()
def compute_opo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (Hao et al. 2025): the optimal baseline for on-policy RL, length-weighted.

    ``b_g = sum_i len_i * s_i / sum_i len_i`` within a group (``len_i`` = valid tokens);
    ``A_i = s_i - b_g``. A group of one, a group whose scores are all equal and a group whose
    responses are all empty get 0. Broadcast over valid tokens; returns equal advantages.
    """
    mask = _float_mask(response_mask, token_level_rewards)
    scores = _sequence_scores(token_level_rewards, mask)
    scores64 = scores.to(torch.float64)
    lengths = mask.sum(dim=-1).to(torch.float64)
    ids, num_groups = group_ids_from_index(index, scores.shape[0], scores.device)
    weighted = _group_sum(lengths * scores64, ids, num_groups)
    total_len = _group_sum(lengths, ids, num_groups)
    baseline = weighted / torch.clamp(total_len, min=1e-12)
    dead = _group_stats(scores, index).same | (total_len == 0)[ids]
    adv = torch.where(dead, 0.0, scores64 - baseline[ids])
    advantages = _broadcast(adv.to(scores.dtype), mask)
    return advantages, advantages.clone()


@torch.no_grad()
def compute_gpg_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (Chu et al. 2025): group-mean baseline, no std, rescaled for dead groups.

    ``A_i = alpha * (s_i - mean_g)`` with ``alpha = B / M``: ``B`` the batch size and ``M``
    the number of rows whose group has non-identical scores (groups with identical scores
    give no gradient; ``alpha`` keeps the gradient scale as if every group contributed).
    ``alpha = 1`` when ``M = 0``. A group of one or of all-equal scores gets exactly 0.
    Returns equal advantages.
    """
    mask = _float_mask(response_mask, token_level_rewards)
    scores = _sequence_scores(token_level_rewards, mask)
    group = _group_stats(scores, index)
    num_informative = int((~group.same).sum())
    alpha = scores.shape[0] / num_informative if num_informative > 0 else 1.0
    adv = torch.where(group.same, 0.0, alpha * (scores.to(torch.float64) - group.mean))
    advantages = _broadcast(adv.to(scores.dtype), mask)
    return advantages, advantages.clone()


@torch.no_grad()
def compute_grpo_passk_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any],
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO for pass@k (Tang et al. 2025, arXiv 2503.19595): only the best response of a
    group is credited.

    The group's pass@n reward is its best score, and the leave-one-out advantage of that
    objective is nonzero only for the best response: ``A = s_max - s_second`` (how much
    the group's best score would drop without it), divided by ``std_g + epsilon`` (unbiased
    group std) when ``norm_adv_by_std``. Every other response gets 0. When several responses
    share the maximum, ``s_second = s_max`` and all get 0. A group of one gets 0. The best
    response is the first in batch order among equals. Statistics in float64. Broadcast over
    valid tokens; returns equal advantages.

    Args:
        token_level_rewards, response_mask: ``(batch, response_len)``.
        index: ``batch`` hashable prompt ids.

    Returns:
        ``(advantages, returns)``, equal, ``(batch, response_len)``.
    """
    mask = _float_mask(response_mask, token_level_rewards)
    scores = _sequence_scores(token_level_rewards, mask)
    group = _group_stats(scores, index)
    s = scores.to(torch.float64)
    ids, num_groups = group_ids_from_index(index, s.shape[0], s.device)
    neg_inf = torch.full((num_groups,), -torch.inf, dtype=s.dtype, device=s.device)
    best_score = neg_inf.scatter_reduce(0, ids, s, reduce="amax")[ids]
    rows = torch.arange(s.shape[0], device=s.device)
    first_best = torch.full((num_groups,), s.shape[0], dtype=rows.dtype, device=s.device)
    candidates = torch.where(s == best_score, rows, s.shape[0])
    is_best = rows == first_best.scatter_reduce(0, ids, candidates, reduce="amin")[ids]
    others = torch.where(is_best, -torch.inf, s)
    second = neg_inf.scatter_reduce(0, ids, others, reduce="amax")[ids]
    adv = torch.where(is_best & (group.count > 1), best_score - second, 0.0)
    if norm_adv_by_std:
        adv = adv / (group.std + epsilon)
    advantages = _broadcast(adv.to(scores.dtype), mask)
    return advantages, advantages.clone()


# --------------------------------------------------------------------------- filtering


@torch.no_grad()
def informative_group_mask(scores: torch.Tensor, index: Sequence[Any]) -> torch.Tensor:
    """DAPO dynamic sampling: which rows belong to a group whose scores are not all equal.

    A group where every response got the same score has zero group-relative advantage and
    contributes no gradient; DAPO drops such groups and samples more prompts instead. Groups
    of one are dropped too.

    Args:
        scores: ``(batch,)`` sequence scores (or any per-row metric).
        index: ``batch`` hashable prompt ids.

    Returns:
        ``(batch,)`` bool, True for rows to keep.
    """
    return ~_group_stats(scores, index).same
