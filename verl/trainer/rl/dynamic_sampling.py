"""DAPO dynamic sampling (Yu et al. 2025): fill every step with informative prompt groups.

With a group baseline (GRPO, RLOO, ...) a prompt whose ``n`` responses all got the same
reward has zero advantage on every token: it costs a forward/backward and teaches nothing,
and as the policy improves more and more groups are all-correct. DAPO drops those groups and
keeps generating from new prompt batches until the step holds ``data.train_batch_size``
informative prompts::

    gen = generate_and_score(batch)                 # n responses per prompt, scored
    keep the groups whose metric is not identical   # acc / score / seq_reward
    until kept groups >= train_batch_size: batch = next_batch(); repeat
    trim to exactly train_batch_size groups (train_batch_size * n rows)

Every prompt batch drawn counts as consumed by the data loader (the trainer passes the
loader's own iterator), so a resumed run continues after the last batch generated from.
The log-probs, values and advantages are computed afterwards, on the kept rows only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from verl.algorithms import informative_group_mask
from verl.protocol import DataProto

logger = logging.getLogger(__name__)

__all__ = [
    "collect_informative_groups",
    "concat_responses",
    "filter_metric_values",
    "merge_step_metrics",
]

FILTER_METRICS = ("acc", "score", "seq_reward")


def filter_metric_values(gen: DataProto, metric: str) -> torch.Tensor:
    """The per-response value dynamic sampling compares within a group, ``(batch,)`` float64.

    ``seq_reward`` is the sum of ``token_level_scores`` (the shaped score); ``acc`` and
    ``score`` are the scorer's per-response outputs the trainer stores in
    ``non_tensor_batch`` (NaN where the scorer reported none, which is an error here).
    """
    if metric == "seq_reward":
        return gen.batch["token_level_scores"].sum(-1).to(torch.float64)
    if metric not in FILTER_METRICS:
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r}: must be one of {', '.join(FILTER_METRICS)}"
        )
    column = gen.non_tensor_batch.get(metric)
    values = None if column is None else np.asarray(column, dtype=np.float64)
    if values is None or np.isnan(values).any():
        missing = len(gen) if values is None else int(np.isnan(values).sum())
        raise ValueError(
            f"algorithm.filter_groups.metric={metric}: the reward function reported no "
            f"{metric} for {missing} of {len(gen)} responses; use metric=seq_reward or make "
            f"the scorer return {{'score': ..., '{metric}': ...}}"
        )
    return torch.from_numpy(values)


def merge_step_metrics(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine the metrics of several generation batches of one step.

    ``timing_s/*`` are summed (the step spent that long); keys ending in ``max`` / ``min``
    take the max / min; every other number is averaged (the batches have equal size, so a
    mean of per-batch means is the mean over all generated responses).
    """
    out: dict[str, Any] = {}
    for key in {k for part in parts for k in part}:
        values = [part[key] for part in parts if key in part]
        if key.startswith("timing_s/"):
            out[key] = float(sum(values))
        elif key.endswith("max"):
            out[key] = max(values)
        elif key.endswith("min"):
            out[key] = min(values)
        else:
            out[key] = float(np.mean(values))
    return out


def _left_pad_prompts(gen: DataProto, width: int, pad_token_id: int) -> DataProto:
    """``gen`` with its prompt part left-padded to ``width`` tokens (batches differ in width).

    Padding is masked out (attention 0, position 0), so log-probs are unchanged.
    """
    pad = width - gen.batch["prompts"].shape[1]
    if pad == 0:
        return gen
    rows = len(gen)
    fill = {
        "prompts": pad_token_id,
        "input_ids": pad_token_id,
        "attention_mask": 0,
        "position_ids": 0,
    }
    tensors = dict(gen.batch)
    for key, value in fill.items():
        t = tensors[key]
        tensors[key] = torch.cat([t.new_full((rows, pad), value), t], dim=1)
    return DataProto.from_dict(
        tensors=tensors, non_tensors=dict(gen.non_tensor_batch), meta_info=dict(gen.meta_info)
    )


def concat_responses(parts: list[DataProto], pad_token_id: int) -> DataProto:
    """``DataProto.concat`` of response batches whose prompt parts may differ in width (the
    narrower ones left-padded with ``pad_token_id``, masked)."""
    if "prompts" in parts[0].batch:
        width = max(p.batch["prompts"].shape[1] for p in parts)
        parts = [_left_pad_prompts(p, width, pad_token_id) for p in parts]
    return DataProto.concat(parts)


def _first_groups(gen: DataProto, num_groups: int) -> DataProto:
    """The rows of the first ``num_groups`` distinct uids, in order of first appearance."""
    uids = gen.non_tensor_batch["uid"]
    first = list(dict.fromkeys(uids.tolist()))[:num_groups]
    return gen[np.isin(uids, np.array(first, dtype=object))]


def collect_informative_groups(
    batch: DataProto,
    next_batch: Callable[[], DataProto],
    generate_and_score: Callable[[DataProto], tuple[DataProto, dict[str, Any]]],
    *,
    metric: str,
    num_prompts: int,
    max_num_gen_batches: int,
    pad_token_id: int = 0,
) -> tuple[DataProto, dict[str, Any]]:
    """Generate from prompt batches until ``num_prompts`` informative groups are kept.

    Args:
        batch: the step's first prompt batch.
        next_batch: draws the next prompt batch from the data loader.
        generate_and_score: ``prompts -> (responses, metrics)``; the responses carry
            ``token_level_scores``, the group id ``non_tensor_batch["uid"]`` (and the
            ``acc`` / ``score`` columns for those metrics).
        metric: ``acc``, ``score`` or ``seq_reward`` (see :func:`filter_metric_values`).
        num_prompts: groups the step needs (``data.train_batch_size``).
        max_num_gen_batches: generation batches allowed per step; 0 = unbounded.
        pad_token_id: fills the prompt padding when batches of different prompt widths
            are concatenated.

    Returns:
        ``(responses, metrics)``: the kept responses of exactly ``num_prompts`` groups, in
        generation order, and the generation batches' metrics (merged with
        :func:`merge_step_metrics`) plus ``dapo/num_gen_batches``,
        ``dapo/prompts_generated``, ``dapo/groups_dropped`` (uninformative groups) and
        ``dapo/groups_trimmed`` (informative groups beyond ``num_prompts``).

    Raises:
        RuntimeError: ``max_num_gen_batches`` batches did not yield enough groups.
    """
    kept: list[DataProto] = []
    step_metrics: list[dict[str, Any]] = []
    num_kept = prompts_generated = groups_dropped = num_gen_batches = 0
    while True:
        num_gen_batches += 1
        gen, gen_metrics = generate_and_score(batch)
        step_metrics.append(gen_metrics)
        uids = gen.non_tensor_batch["uid"]
        keep = informative_group_mask(filter_metric_values(gen, metric), uids).numpy()
        groups, groups_kept = len(set(uids.tolist())), len(set(uids[keep].tolist()))
        prompts_generated += groups
        groups_dropped += groups - groups_kept
        num_kept += groups_kept
        if groups_kept:
            kept.append(gen[keep])
        if num_kept >= num_prompts:
            break
        if 0 < max_num_gen_batches <= num_gen_batches:
            raise RuntimeError(
                f"dynamic sampling: {num_kept} of data.train_batch_size={num_prompts} "
                f"informative prompts after {num_gen_batches} generation batches "
                f"({prompts_generated} prompts, {groups_dropped} groups with identical "
                f"{metric}), algorithm.filter_groups.max_num_gen_batches={max_num_gen_batches}; "
                "the prompts are too easy or too hard for the policy: raise "
                "max_num_gen_batches (0 = unbounded), use a larger rollout.n or other data"
            )
        batch = next_batch()
    out = _first_groups(concat_responses(kept, pad_token_id), num_prompts)
    metrics = merge_step_metrics(step_metrics)
    metrics |= {
        "dapo/num_gen_batches": float(num_gen_batches),
        "dapo/prompts_generated": float(prompts_generated),
        "dapo/groups_dropped": float(groups_dropped),
        "dapo/groups_trimmed": float(num_kept - num_prompts),
    }
    logger.debug(
        "dynamic sampling: %d generation batches, %d prompts, %d groups dropped",
        num_gen_batches,
        prompts_generated,
        groups_dropped,
    )
    return out, metrics
