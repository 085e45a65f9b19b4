"""Per-step metrics computed on the driver from a finished batch, and stage timers.

Names follow the field's conventions (``critic/score/mean``, ``response_length/mean``,
``timing_s/gen``) so dashboards built for other PPO frameworks read the same keys.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from verl.algorithms.rollout_correction import rollout_mismatch_metrics
from verl.protocol import DataProto
from verl.rollout.agent_loop import multi_turn_metrics
from verl.rollout.agent_rewards import agent_program_metrics

logger = logging.getLogger(__name__)


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    values = values.float()
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def compute_data_metrics(batch: DataProto, max_response_length: int) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values and lengths of one training batch.

    Token-level tensors are reduced over valid response tokens; sequence scores are the sum
    of the token-level scores of each response.
    """
    b = batch.batch
    mask = b["response_mask"].bool()
    metrics: dict[str, float] = {}
    metrics |= _stats("critic/score", b["token_level_scores"].sum(-1))
    metrics |= _stats("critic/rewards", b["token_level_rewards"].sum(-1))
    for key, name in (("advantages", "advantages"), ("returns", "returns"), ("values", "values")):
        if key in b:
            metrics |= _stats(f"critic/{name}", b[key][mask])
    if "entropys" in b:
        # Entropy of the sampling policy (computed with the old log-probs), per valid token.
        metrics["actor/entropy"] = b["entropys"][mask].float().mean().item() if mask.any() else 0.0
    # Every token of the response, tool results of multi-turn rollouts included (they are
    # attended to but masked out of response_mask); the same as response_mask otherwise.
    response_length = b["attention_mask"][:, -mask.shape[1] :].sum(-1).float()
    metrics |= _stats("response_length", response_length)
    metrics["response_length/clip_ratio"] = (
        (response_length >= max_response_length).float().mean().item()
    )
    prompt_length = b["attention_mask"][:, : b["prompts"].shape[1]].sum(-1).float()
    metrics |= _stats("prompt_length", prompt_length)
    metrics |= multi_turn_metrics(batch.non_tensor_batch)  # empty unless multi_turn.enable
    metrics |= agent_program_metrics(batch.non_tensor_batch)  # empty unless rollout.agent
    return metrics


def compute_rollout_mismatch_metrics(batch: DataProto) -> dict[str, float]:
    """Gap between the rollout's sampling log-probs and the trainer's recomputed ones
    (``old_log_probs`` vs ``rollout_log_probs``): see
    :func:`verl.algorithms.rollout_correction.rollout_mismatch_metrics`."""
    b = batch.batch
    return rollout_mismatch_metrics(b["old_log_probs"], b["rollout_log_probs"], b["response_mask"])


class RolloutGapWatch:
    """Warns when a synchronous run's rollout and trainer disagree about the same tokens.

    In synchronous training the rollout samples with the weights the trainer then scores the
    samples with, so ``rollout/logprob_abs_diff_mean`` (mean |trainer - rollout| log-prob per
    response token) measures numerics alone: about 1e-5 in fp32, 1e-4 to 1e-2 across bf16
    kernels. Above ``threshold`` nats the rollout most likely sampled from other weights
    (a stale copy, a weight push that did not land) or another distribution (a sampling
    setting the trainer does not apply). A warning at most every ``every`` steps; the run
    goes on (the update's importance ratios are computed from the trainer's log-probs).
    """

    def __init__(self, threshold: float = 0.05, every: int = 20) -> None:
        self.threshold = threshold
        self.every = every
        self._warned_at: int | None = None

    def __call__(self, metrics: Mapping[str, Any], step: int) -> bool:
        """Check one step's metrics; True when it warned."""
        gap = metrics.get("rollout/logprob_abs_diff_mean")
        if gap is None or not gap > self.threshold:
            return False
        if self._warned_at is not None and step - self._warned_at < self.every:
            return False
        self._warned_at = step
        logger.warning(
            "step %d: the rollout's log-probs of its own samples differ from the trainer's by "
            "%.3g nats per token on average (rollout/logprob_abs_diff_mean; numerics alone "
            "give < %.3g in synchronous training): check that the rollout samples with the "
            "current weights and that its sampling settings are the trainer's",
            step,
            gap,
            self.threshold,
        )
        return True


def compute_throughput_metrics(batch: DataProto, step_seconds: float) -> dict[str, float]:
    """Tokens (prompt + response) processed per second over the whole step."""
    n_tokens = batch.batch["attention_mask"].sum().item()
    return {
        "perf/total_num_tokens": float(n_tokens),
        "perf/throughput_tokens_per_s": n_tokens / max(step_seconds, 1e-9),
    }


def compute_validation_metrics(
    accs: Sequence[float],
    scores: Sequence[float],
    sources: Sequence[str],
    extra_infos: Sequence[Mapping[str, Any] | None] = (),
    group_by: Sequence[str] = (),
) -> dict[str, float]:
    """``val/acc`` and ``val/score`` over all responses, and per data source
    (``val/acc/<data_source>``, ``val/score/<data_source>``).

    Each field of ``group_by`` splits every data source further by the row's
    ``extra_info[field]``: ``val/acc/<data_source>/<field>=<value>`` (rows without the field
    are left out of that split). A field no row carries is an error naming the fields seen.
    """
    groups: dict[str, list[int]] = defaultdict(list)
    for i, source in enumerate(sources):
        groups[source].append(i)
    for field in group_by:
        found = False
        for i, (source, info) in enumerate(zip(sources, extra_infos)):
            if isinstance(info, Mapping) and field in info:
                groups[f"{source}/{field}={info[field]}"].append(i)
                found = True
        if not found:
            seen = sorted({k for info in extra_infos if isinstance(info, Mapping) for k in info})
            raise ValueError(
                f"trainer.val_group_by: no validation row has extra_info[{field!r}]; "
                f"fields present: {seen or 'none'}"
            )
    out = {"val/acc": float(np.mean(accs)), "val/score": float(np.mean(scores))}
    for name, idx in sorted(groups.items()):
        out[f"val/acc/{name}"] = float(np.mean([accs[i] for i in idx]))
        out[f"val/score/{name}"] = float(np.mean([scores[i] for i in idx]))
    return out


@contextmanager
def timer(name: str, sink: dict[str, Any]) -> Iterator[None]:
    """Time a block and store the seconds under ``timing_s/<name>`` in ``sink``."""
    start = time.perf_counter()
    try:
        yield
    finally:
        sink[f"timing_s/{name}"] = time.perf_counter() - start
