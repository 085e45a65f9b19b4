"""Metrics and rewards of agent-program rollouts (:mod:`verl.rollout.agent_program`).

Contract: :func:`agent_program_metrics` gives the ``agent/*`` metrics of a batch (counts by
status, requests, refused and untrained requests, the longest run, the endpoint's
server-wide refusal totals), or nothing for a batch without agent columns.
:class:`AgentRewardManager` (``reward_model.reward_manager=agent``) scores a row with the
reward its agent returned (checked like a reward function's result), a row whose agent
failed as a failed reward call, and the other rows like the default manager.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from verl.rewards.manager import RewardManager
from verl.rewards.results import ERROR, TIMEOUT, check_bound, coerce_result, failed
from verl.rollout.agent_runs import STATUSES

__all__ = ["AgentRewardManager", "agent_program_metrics"]


def agent_program_metrics(non_tensor: Any) -> dict[str, float]:
    """``agent/*`` metrics of a batch from agent programs (empty for other batches)."""
    if "agent_status" not in non_tensor:
        return {}
    status = list(non_tensor["agent_status"])
    requests = np.asarray(non_tensor["agent_requests"], dtype=np.float64)
    out = {f"agent/{s if s != 'error' else 'errors'}": float(status.count(s)) for s in STATUSES}
    out["agent/timeouts"] = out.pop("agent/timeout")
    out |= {
        "agent/requests": float(requests.sum()),
        "agent/requests_mean": float(requests.mean()) if requests.size else 0.0,
        "agent/untrained_requests": float(np.sum(non_tensor["agent_untrained_requests"])),
        "agent/refused_requests": float(np.sum(non_tensor["agent_refused_requests"])),
        "agent/seconds_max": float(np.max(non_tensor["agent_seconds"], initial=0.0)),
        "agent/unauthorized_requests_total": float(
            np.max(non_tensor["agent_unauthorized_total"], initial=0)
        ),
        "agent/late_requests_total": float(np.max(non_tensor["agent_late_total"], initial=0)),
    }
    return out


class AgentRewardManager(RewardManager):
    """The reward manager of agent programs (``reward_model.reward_manager=agent``).

    A row whose ``extra_info`` has an ``agent_reward`` gets that reward (checked like a
    reward function's result: a number or a dict with ``score``, finite, within
    ``max_abs_reward``); a row whose agent failed (``agent_status`` ``error`` or
    ``timeout``) is a failed reward call (score 0, counted as ``reward/errors`` or
    ``reward/timeouts``, and part of the failure rate that stops a run); the other rows are
    scored as by the default manager (the built-in scorers or the custom function).
    """

    def _score(self, kwargs_list: list[dict[str, Any]]) -> list[Any]:
        results: list[Any] = [None] * len(kwargs_list)
        rest: list[int] = []
        own: list[int] = []
        for i, kw in enumerate(kwargs_list):
            info = kw.get("extra_info")
            info = info if isinstance(info, Mapping) else {}
            status = info.get("agent_status")
            if status in ("error", "timeout"):
                kind = ERROR if status == "error" else TIMEOUT
                results[i] = failed(kind, f"agent {status}: {info.get('agent_error')}")
            elif info.get("agent_reward") is not None:
                results[i] = check_bound(coerce_result(info["agent_reward"]), self.max_abs_reward)
            else:
                rest.append(i)
                continue
            own.append(i)
        if rest:
            for i, result in zip(rest, super()._score([kwargs_list[i] for i in rest])):
                results[i] = result
        for i in own:
            self.failures.record(results[i], f"agent of sample {i}")
        if own:
            self._stop_if_failing([kwargs_list[i] for i in own], [results[i] for i in own], {})
        return results
