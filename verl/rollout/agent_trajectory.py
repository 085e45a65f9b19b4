"""Agent trajectories as training rows: the output of an agent-program rollout.

Contract: :func:`assemble_agent_batch` turns the runs of one rollout step into the layout
of ``verl.rollout.base``, one row per run in order. A run's trajectory is the chain of
its requests that ends in its last one (each request's ``parent`` is the one whose ids
it reused): the row's prompt is the chain's first prompt (left-padded), its response
everything after it (right-padded), ``response_mask`` 1 on the model's sampled tokens
and 0 on what the agent inserted, ``rollout_log_probs`` on the model's tokens, the
attention mask 1 on every real token. A run that did not finish ``ok``, or that made no
request (``no_requests``), gets its dataset prompt and no response, so nothing of it is
trained. Requests outside the chain are counted (``agent_untrained_requests``), not
trained. The per-sample columns are ``messages`` (:func:`conversation`), ``turn_info``
(per request of the chain: model tokens, trained tokens, finish reason, endpoint,
stitch), :data:`AGENT_KEYS` and ``extra_info`` with ``agent_reward``, ``agent_status`` and
``agent_error``. With partial rollouts (the engine records each token's policy version) the
output also has ``rollout_token_versions`` (rows, R): a model token's version, -1 on what
the agent inserted, on padding and on the rows of failed runs; it is left out when a row's
trajectory has a turn without versions.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from verl.rollout.agent_runs import AgentRun
from verl.rollout.base import SamplingParams, assemble_rollout_output
from verl.rollout.openai_records import Record
from verl.rollout.partial import TOKEN_VERSIONS

logger = logging.getLogger(__name__)

__all__ = ["AGENT_KEYS", "assemble_agent_batch", "conversation"]

#: Per-sample columns of the output's non_tensor_batch (besides ``messages``,
#: ``turn_info`` and the updated ``extra_info``).
AGENT_KEYS = (
    "agent_status",
    "agent_error",
    "agent_requests",
    "agent_untrained_requests",
    "agent_refused_requests",
    "agent_seconds",
    "agent_unauthorized_total",
    "agent_late_total",
)


def assemble_agent_batch(
    prompts: Any,
    params: SamplingParams,
    runs: list[AgentRun],
    width: int,
    *,
    pad_token_id: int,
    counters: Mapping[str, int],
    warned: set[str],
) -> Any:
    """The rollout output of ``runs`` (``params.n`` per prompt of ``prompts``, in order):
    the layout of ``verl.rollout.base`` with prompts ``width`` wide and responses
    ``params.max_new_tokens`` long, plus the per-sample columns ``messages``,
    ``turn_info``, :data:`AGENT_KEYS` and ``extra_info`` with the agent's reward.
    ``counters``: the endpoint's (``unauthorized``, ``after_end``); ``warned``: the
    one-time log messages already given (updated)."""
    from verl.protocol import DataProto

    rows, budget = len(runs), params.max_new_tokens
    input_ids = prompts.batch["input_ids"].cpu()
    input_mask = prompts.batch["attention_mask"].cpu()
    prompt_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((rows, width), dtype=input_mask.dtype)
    responses = torch.full((rows, budget), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((rows, budget), dtype=torch.long)
    real = torch.zeros((rows, budget), dtype=torch.long)
    log_probs = torch.zeros((rows, budget), dtype=torch.float32)
    versions = torch.full((rows, budget), -1, dtype=torch.long)
    has_versions = True  # every trained row's turns recorded their tokens' versions
    columns: dict[str, list[Any]] = {k: [] for k in ("messages", "turn_info", *AGENT_KEYS)}
    extra_infos = []
    for r, run in enumerate(runs):
        records = run.session.records
        status = run.status
        if status == "ok" and not records:
            status = "no_requests"
        chain: list[int] = []
        kept: list[int] = []
        if status == "ok":
            index: int | None = len(records) - 1
            while index is not None:
                chain.append(index)
                index = records[index].parent
            chain.reverse()
            last = records[chain[-1]]
            prompt = last.context[: last.prompt_len]
            response = last.context[last.prompt_len :] + last.sampled
            mask = last.flags[last.prompt_len :] + [1] * len(last.sampled)
            lps = last.context_log_probs[last.prompt_len :] + last.log_probs
            if len(response) > budget:  # the endpoint's budget check makes this impossible
                raise RuntimeError(f"agent row {r}: {len(response)} response tokens > {budget}")
            n = len(response)
            responses[r, :n] = torch.tensor(response, dtype=torch.long)
            response_mask[r, :n] = torch.tensor(mask, dtype=torch.long)
            real[r, :n] = 1
            log_probs[r, :n] = torch.tensor(lps, dtype=torch.float32)
            if last.versions is None or last.context_versions is None:
                has_versions = False
            else:
                row_versions = last.context_versions[last.prompt_len :] + last.versions
                versions[r, :n] = torch.tensor(row_versions, dtype=torch.long)
            columns["messages"].append(conversation(records, chain))
        else:  # nothing of a failed agent is trained: its dataset prompt, no response
            source = r // params.n
            prompt = input_ids[source][input_mask[source].bool()].tolist()
            columns["messages"].append([])
        prompt_ids[r, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        prompt_mask[r, width - len(prompt) :] = 1
        # of each request of the chain, the sampled ids that are in the row
        kept = [records[i].kept for i in chain[1:]] + [len(records[i].sampled) for i in chain[-1:]]
        columns["turn_info"].append(
            [
                {
                    "model_tokens": len(records[i].sampled),
                    "trained_tokens": k,
                    "finish_reason": records[i].finish_reason,
                    "endpoint": records[i].endpoint,
                    "stitch": records[i].stitch,
                }
                for i, k in zip(chain, kept)
            ]
        )
        columns["agent_status"].append(status)
        columns["agent_error"].append(run.error)
        columns["agent_requests"].append(len(records))
        columns["agent_untrained_requests"].append(len(records) - sum(k > 0 for k in kept))
        columns["agent_refused_requests"].append(run.session.refused)
        columns["agent_seconds"].append(run.seconds)
        columns["agent_unauthorized_total"].append(counters["unauthorized"])
        columns["agent_late_total"].append(counters["after_end"])
        info = run.task["extra_info"]
        info = dict(info) if isinstance(info, Mapping) else {}
        extra_infos.append(
            info | {"agent_reward": run.reward, "agent_status": status, "agent_error": run.error}
        )
    given = sum(1 for run in runs if run.reward is not None)
    if given and "reward_manager" not in warned:
        warned.add("reward_manager")
        logger.info(
            "%d of %d agents returned a reward; reward_model.reward_manager=agent uses it",
            given,
            rows,
        )
    statuses = [c for c in columns["agent_status"] if c != "ok"]
    if statuses:
        logger.warning(
            "agent rollouts: %s of %d did not finish normally",
            {s: statuses.count(s) for s in set(statuses)},
            rows,
        )
    src_non_tensor = {
        k: np.repeat(v, params.n, axis=0) for k, v in prompts.non_tensor_batch.items()
    }
    tensors = {
        k: v.cpu().repeat_interleave(params.n, dim=0)
        for k, v in prompts.batch.items()
        if k not in ("input_ids", "attention_mask", "position_ids")
    }
    position_ids = (prompt_mask.long().cumsum(-1) - 1).clamp_min(0)
    rolled = DataProto.from_dict(
        tensors={
            **tensors,
            "input_ids": prompt_ids,
            "attention_mask": prompt_mask,
            "position_ids": position_ids,
        },
        non_tensors=src_non_tensor,
        meta_info=dict(prompts.meta_info),
    )
    device = prompts.batch["input_ids"].device
    out = assemble_rollout_output(
        rolled.to(device), dataclasses.replace(params, n=1), responses, response_mask, log_probs
    )
    attention = out.batch["attention_mask"]
    attention[:, -budget:] = real.to(device=attention.device, dtype=attention.dtype)
    if has_versions and any(run.status == "ok" and run.session.records for run in runs):
        out.batch[TOKEN_VERSIONS] = versions.to(device)
    columns["extra_info"] = extra_infos
    for key, values in columns.items():
        column = np.empty(rows, dtype=object)  # element-wise: a list stays one object
        for i, value in enumerate(values):
            column[i] = value
        out.non_tensor_batch[key] = column
    return out


def conversation(records: list[Record], chain: list[int]) -> list[dict[str, Any]]:
    """The conversation after the chain's first prompt: for chat, the last request's
    messages past the first request's, then the last reply; for completions, each
    turn's text as an assistant message."""
    first, last = records[chain[0]], records[chain[-1]]
    if last.messages is not None and first.messages is not None:
        return [*last.messages[len(first.messages) :], dict(last.reply or {})]
    return [{"role": "assistant", "content": records[i].text} for i in chain]
