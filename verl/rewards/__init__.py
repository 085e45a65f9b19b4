"""Rewards: rule-based scorers, custom reward functions, isolation, and the reward manager.

    from verl.rewards import RewardManager, load_reward_function
    manager = RewardManager(tokenizer)                      # built-in scorers by data_source
    token_level_scores, metrics, extras = manager(batch)    # (batch, response_len), dict, dict

The trainer calls every reward through one contract, `contract.py` (batch in, scores,
metrics and per-response extras out); per-response scorers enter it through the manager.

Layout: `scorers/` (text -> score, with a registry by data source), `custom.py` (load a
function from a file), `isolation.py` + `worker_pool.py` (failures -> score 0 and a count,
timeouts in killable worker processes), `normalization.py` (running mean/std),
`placement.py` (sequence score -> last valid token), `manager.py` (the batch-level
`RewardManager`, which stops the run when too many calls fail), `model_reward.py` (seam for
reward-model scores), `sandbox.py` + `sandbox_init.py` (run model-written code in
namespaces, with limits and a seccomp filter, for `scorers/code.py`, whose test harness is
`scorers/code_harness.py`). Sources scored per response and wrapped into the contract by
`sources.py`: `judge.py` (an LLM judge), `remote.py` (a scoring service over HTTP, through
`http.py`), `mixture.py` (a weighted sum of sources) and `overlap.py` (scoring chunks in
the background while generation continues); docs/judge.md.
"""

from verl.rewards.contract import (
    BatchReward,
    ModelScoredReward,
    RewardFunction,
    as_reward_function,
)
from verl.rewards.custom import load_reward_function
from verl.rewards.isolation import FailureTracker, RewardFailureError, safe_call
from verl.rewards.manager import (
    OverlongBuffer,
    RewardManager,
    get_reward_manager,
    register_reward_manager,
)
from verl.rewards.model_reward import rm_scores_to_token_level, sequence_scores_from_values
from verl.rewards.normalization import RunningMeanStd
from verl.rewards.placement import place_on_last_token
from verl.rewards.results import FAILURE_KINDS, RewardResult
from verl.rewards.scorers import (
    UnknownDataSourceError,
    default_compute_score,
    get_scorer,
    known_data_sources,
    register_scorer,
)
from verl.rewards.worker_pool import RewardWorkerPool

__all__ = [
    "FAILURE_KINDS",
    "BatchReward",
    "FailureTracker",
    "ModelScoredReward",
    "OverlongBuffer",
    "RewardFailureError",
    "RewardFunction",
    "RewardManager",
    "RewardResult",
    "RewardWorkerPool",
    "RunningMeanStd",
    "UnknownDataSourceError",
    "as_reward_function",
    "default_compute_score",
    "get_reward_manager",
    "get_scorer",
    "known_data_sources",
    "load_reward_function",
    "place_on_last_token",
    "register_reward_manager",
    "register_scorer",
    "rm_scores_to_token_level",
    "safe_call",
    "sequence_scores_from_values",
]
