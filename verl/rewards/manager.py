"""Reward manager: decoded responses -> scores -> token-level scores, with metrics.

`RewardManager(data)` for a batch of generated responses:

1. decodes each response (`responses` where `response_mask` is set, special tokens skipped);
2. scores it with the scorer for its `data_source` (or a custom reward function), isolated
   so that no failure escapes (see `verl.rewards.isolation`);
3. shapes the sequence score: raw + overlong penalty -> running normalisation -> clip;
4. puts the shaped score on the last valid response token (`placement.place_on_last_token`;
   an empty response gets it at position 0, masked out of the loss, so that row sums always
   equal the sequence score).

Where scoring runs (`isolation="auto"`): the built-in scorers are pure and fast, so they run
inline in this process unless `timeout_s` is set; a custom reward function always runs in a
persistent pool of forked worker processes with a per-call timeout (`timeout_s`, default
`DEFAULT_CUSTOM_TIMEOUT_S`), so a hang costs one killed worker, not the run. Force one mode
with `isolation="inline"` (no hang protection; for functions that cannot run in a forked
child) or `isolation="process"`. Scorers registered after the first pooled batch are not
seen by the already-forked workers.

When rewards break the run: every result is checked against a finite bound
(`max_abs_reward`, failures counted as `reward/out_of_bound`), and when the fraction of
failed calls in one call of the manager (one step's batch) exceeds `max_failure_rate`
(default 0.5; the trainer passes 1.0 for validation, where 1.0 means "stop only when every
call failed") the manager raises `RewardFailureError` naming the function and its most
common failure, so the trainer's loop stops instead of training on zeros. A custom
function's signature is checked when the manager is built: it must accept the keyword
arguments `data_source, solution_str, ground_truth, extra_info`.

Batch contract (`DataProto`): tensors `responses` (batch, response_len) and
`response_mask` (batch, response_len) (falls back to the last response_len columns of
`attention_mask`); non-tensors `data_source`, `ground_truth` (or verl-style
`reward_model={"ground_truth": ...}`) and optional `extra_info`.

Multi-turn rollouts (`rollout.multi_turn`, non-tensor `messages`): `solution_str` is the
model's own tokens of every turn (tool results are masked out, so a tool cannot write the
answer for it), and `extra_info` gains `messages`, the whole conversation (the prompt's
messages, then each assistant turn and tool result), `num_turns` and `turn_info`.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verl.algorithms.reward_shaping import overlong_penalty
from verl.registry import REWARD_MANAGERS, UnknownNameError
from verl.rewards.contract import RewardFunction
from verl.rewards.isolation import FailureTracker, RewardFailureError, callable_name
from verl.rewards.normalization import RunningMeanStd
from verl.rewards.placement import place_on_last_token
from verl.rewards.results import DEFAULT_MAX_ABS_REWARD, RewardResult, call_inline, check_bound
from verl.rewards.scorers import default_compute_score, get_scorer
from verl.rewards.worker_pool import RewardWorkerPool

logger = logging.getLogger(__name__)

DEFAULT_CUSTOM_TIMEOUT_S = 30.0
DEFAULT_MAX_FAILURE_RATE = 0.5
CALL_ARGUMENTS = ("data_source", "solution_str", "ground_truth", "extra_info")
ISOLATION_MODES = ("auto", "inline", "process")
# extras keys the manager fills itself; scorer dict keys with these names are not copied
_RESERVED_EXTRAS = ("score", "shaped_score", "acc", "data_source", "failure")


@dataclass
class OverlongBuffer:
    """DAPO soft overlong penalty settings for the reward manager.

    The formula and its boundaries live in one place,
    `verl.algorithms.reward_shaping.overlong_penalty`: 0 up to
    `max_response_length - buffer_len` tokens, then linear down to `-penalty_factor` at
    `max_response_length` (default: the batch's response_len); `buffer_len ==
    max_response_length` ramps over the whole range.
    """

    buffer_len: int
    penalty_factor: float = 1.0
    max_response_length: int | None = None

    def __post_init__(self) -> None:
        if self.buffer_len <= 0:
            raise ValueError(f"overlong buffer_len={self.buffer_len} must be > 0")

    @classmethod
    def from_config(cls, config: Any) -> OverlongBuffer | None:
        """Build from an `OverlongBuffer`, a mapping or a config object with `len`,
        `penalty_factor` and optional `enable` / `max_response_length`; None if disabled."""
        if config is None or isinstance(config, OverlongBuffer):
            return config
        get = config.get if isinstance(config, Mapping) else lambda k, d=None: getattr(config, k, d)
        if not get("enable", True):
            return None
        length = get("buffer_len", get("len"))
        if length is None:
            raise ValueError(f"overlong buffer config {config!r} needs a 'len' (buffer length)")
        return cls(int(length), float(get("penalty_factor", 1.0)), get("max_response_length"))

    def penalty(self, lengths: np.ndarray, response_len: int) -> np.ndarray:
        """Penalty in `[-penalty_factor, 0]` per sequence for valid lengths `lengths` (batch,)."""
        max_len = self.max_response_length or response_len
        lengths64 = np.asarray(lengths, dtype=np.float64)
        return overlong_penalty(lengths64, max_len, self.buffer_len, self.penalty_factor).numpy()


def _column(non_tensor: Mapping[str, Any], key: str, size: int) -> list[Any] | None:
    values = non_tensor.get(key)
    if values is None:
        return None
    values = list(values)
    if len(values) != size:
        raise ValueError(f"non_tensor_batch[{key!r}] has {len(values)} rows, batch has {size}")
    return values


def _with_conversation(
    extra_infos: list[Any], non_tensor: Mapping[str, Any], size: int
) -> list[dict[str, Any]]:
    """``extra_info`` of multi-turn rollouts plus ``messages`` (the prompt's messages, then
    the model's turns and the tool results), ``num_turns`` and ``turn_info`` (per model turn:
    ``model_tokens``, ``tool_calls``, ``tool_status``, ``feedback``)."""
    prompts = _column(non_tensor, "raw_prompt", size) or [[] for _ in range(size)]
    turns = _column(non_tensor, "num_turns", size) or [None] * size
    per_turn = _column(non_tensor, "turn_info", size) or [None] * size
    out = []
    for info, prompt, messages, n, each in zip(
        extra_infos, prompts, _column(non_tensor, "messages", size), turns, per_turn
    ):
        prompt = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        conversation = [*(dict(m) for m in prompt), *messages]
        out.append({**(info or {}), "messages": conversation, "num_turns": n, "turn_info": each})
    return out


def check_signature(fn: Callable[..., Any]) -> None:
    """Raise `TypeError` unless `fn` accepts the keyword arguments the manager passes.

    A signature check, not a dry call: calling the function with made-up arguments could
    hang, have side effects or fail for reasons unrelated to its signature.
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no introspectable signature (some C callables)
        return
    try:
        signature.bind(**dict.fromkeys(CALL_ARGUMENTS))
    except TypeError as exc:
        raise TypeError(
            f"reward function {callable_name(fn)} has signature {signature} and cannot be "
            f"called as fn(data_source=..., solution_str=..., ground_truth=..., "
            f"extra_info=...): {exc}. Accept these keyword arguments (or **kwargs)."
        ) from None


def too_many_failures(failed: int, total: int, max_rate: float | None) -> bool:
    """Whether `failed` of `total` calls is above `max_rate` (1.0: only when all failed)."""
    if max_rate is None or total == 0:
        return False
    return failed / total > max_rate or (max_rate >= 1.0 and failed == total)


def _acc_of(result: RewardResult) -> float:
    value = result.extra.get("acc")
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else 0.0


def _stats(prefix: str, values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {}
    return {
        f"{prefix}_mean": float(values.mean()),
        f"{prefix}_min": float(values.min()),
        f"{prefix}_max": float(values.max()),
    }


class RewardManager(RewardFunction):
    """Score a batch of responses into `token_level_scores` (batch, response_len): the
    per-response scorers in the reward contract (`verl.rewards.contract`).

    Args:
        tokenizer: has `batch_decode(list[list[int]], skip_special_tokens=True)` or `decode`.
        compute_score: custom reward function called with keyword arguments `data_source,
            solution_str, ground_truth, extra_info`; None uses the built-in scorers.
        num_examine: decoded examples per data source logged at INFO on every call.
        timeout_s: per-call time limit in seconds (see the module docstring).
        normalize: standardise sequence scores with running mean/std across calls.
        clip_range: `(lo, hi)` clip of the (normalised) sequence score.
        overlong_buffer: DAPO overlong penalty (`OverlongBuffer`, a mapping or a config
            object with `enable`, `len`, `penalty_factor`); None disables it.
        isolation: "auto", "inline" or "process".
        num_workers: worker processes when scoring runs in a pool.
        norm_eps: epsilon in `(r - mean) / (std + eps)`.
        max_logged_failures: failures logged with their message per kind; then only counted.
        max_abs_reward: bound on `|score|`; a score outside it is an `out_of_bound` failure.
            None: any finite score.
        max_failure_rate: raise `RewardFailureError` when more than this fraction of one
            call's samples failed (1.0: only when all failed); None never raises.

    Raises:
        TypeError: `compute_score` does not accept the manager's keyword arguments.
    """

    def __init__(
        self,
        tokenizer: Any,
        compute_score: Callable[..., Any] | None = None,
        num_examine: int = 0,
        timeout_s: float | None = None,
        normalize: bool = False,
        clip_range: tuple[float, float] | None = None,
        overlong_buffer: Any = None,
        *,
        isolation: str = "auto",
        num_workers: int = 2,
        norm_eps: float = 1e-8,
        max_logged_failures: int = 5,
        max_abs_reward: float | None = DEFAULT_MAX_ABS_REWARD,
        max_failure_rate: float | None = DEFAULT_MAX_FAILURE_RATE,
    ) -> None:
        if isolation not in ISOLATION_MODES:
            raise ValueError(f"isolation={isolation!r} is not one of {ISOLATION_MODES}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0 seconds or None")
        if isolation == "inline" and timeout_s is not None:
            raise ValueError(
                f"isolation='inline' cannot enforce timeout_s={timeout_s}: inline calls cannot "
                "be interrupted; use isolation='process' or timeout_s=None"
            )
        if max_abs_reward is not None and not 0 < max_abs_reward < math.inf:
            raise ValueError(f"max_abs_reward={max_abs_reward} must be a finite number > 0")
        if max_failure_rate is not None and not 0 <= max_failure_rate <= 1:
            raise ValueError(f"max_failure_rate={max_failure_rate} must be in [0, 1] or None")
        if compute_score is not None and compute_score is not default_compute_score:
            check_signature(compute_score)
        if clip_range is not None:
            if len(clip_range) != 2 or not clip_range[0] < clip_range[1]:
                raise ValueError(f"clip_range={clip_range!r} must be (lo, hi) with lo < hi")
            clip_range = (float(clip_range[0]), float(clip_range[1]))
        self.tokenizer = tokenizer
        self.builtin = compute_score is None or compute_score is default_compute_score
        self.compute_score = default_compute_score if compute_score is None else compute_score
        self.num_examine = num_examine
        self.clip_range = clip_range
        self.overlong_buffer = OverlongBuffer.from_config(overlong_buffer)
        self.normalizer = RunningMeanStd(norm_eps) if normalize else None
        self.failures = FailureTracker(max_logged_failures)
        self.max_abs_reward = max_abs_reward
        self.max_failure_rate = max_failure_rate
        self._invalid_gt_logged = 0
        self._max_logged = max_logged_failures
        use_pool = isolation == "process" or (
            isolation == "auto" and (not self.builtin or timeout_s is not None)
        )
        self.timeout_s = (timeout_s or DEFAULT_CUSTOM_TIMEOUT_S) if use_pool else None
        self._pool = (
            RewardWorkerPool(self.compute_score, num_workers, self.timeout_s) if use_pool else None
        )

    # ------------------------------------------------------------------ scoring
    def _decode(self, responses: torch.Tensor, mask: torch.Tensor) -> list[str]:
        rows = [ids[m != 0].tolist() for ids, m in zip(responses.cpu(), mask.cpu())]
        if hasattr(self.tokenizer, "batch_decode"):
            return list(self.tokenizer.batch_decode(rows, skip_special_tokens=True))
        return [self.tokenizer.decode(row, skip_special_tokens=True) for row in rows]

    def _score(self, kwargs_list: list[dict[str, Any]]) -> list[RewardResult]:
        scorers: dict[Any, Callable[..., Any]] = {}
        if self.builtin:
            # Resolved up front, once per data source: an unknown source is a configuration
            # error that must stop the run (UnknownDataSourceError), unlike a scoring failure.
            for kw in kwargs_list:
                if kw["data_source"] not in scorers:
                    scorers[kw["data_source"]] = get_scorer(kw["data_source"])
        if self._pool is not None:
            results = self._pool.map(kwargs_list)
        elif self.builtin:
            results = [
                call_inline(
                    scorers[kw["data_source"]], {k: v for k, v in kw.items() if k != "data_source"}
                )
                for kw in kwargs_list
            ]
        else:
            results = [call_inline(self.compute_score, kw) for kw in kwargs_list]
        results = [check_bound(r, self.max_abs_reward) for r in results]
        for i, (kw, result) in enumerate(zip(kwargs_list, results)):
            fn = scorers.get(kw["data_source"], self.compute_score)
            self.failures.record(
                result,
                f"function {callable_name(fn)}, sample {i}, data_source={kw['data_source']!r}",
            )
        self._stop_if_failing(kwargs_list, results, scorers)
        return results

    def _stop_if_failing(
        self,
        kwargs_list: list[dict[str, Any]],
        results: list[RewardResult],
        scorers: Mapping[Any, Callable[..., Any]],
    ) -> None:
        """Raise `RewardFailureError` when too many of this batch's calls failed."""
        failures = [(kw, r) for kw, r in zip(kwargs_list, results) if not r.ok]
        if not too_many_failures(len(failures), len(results), self.max_failure_rate):
            return
        common: Counter[tuple[str, str]] = Counter()
        example: dict[tuple[str, str], str] = {}
        for kw, r in failures:
            fn = scorers.get(kw["data_source"], self.compute_score)
            key = (callable_name(fn), str(r.failure))
            common[key] += 1
            example.setdefault(key, str(r.message))
        (name, kind), count = common.most_common(1)[0]
        raise RewardFailureError(
            f"reward function {name} failed on {len(failures)} of {len(results)} calls in "
            f"this step ({len(failures) / len(results):.0%}), above max_failure_rate="
            f"{self.max_failure_rate:g} (reward_model.max_failure_rate, or "
            f"val_max_failure_rate in validation). Most common failure: {kind} ({count} "
            f"calls), e.g. {example[(name, kind)]}. "
            "Fix the reward function (see docs/errors.md, 'Rewards'); the run stops instead "
            "of training on zero rewards."
        )

    def __call__(
        self, data: Any, *, update_stats: bool = True
    ) -> tuple[torch.Tensor, dict[str, float], dict[str, np.ndarray]]:
        """Score `data` (a DataProto of generated responses).

        Args:
            data: batch with the keys listed in the module docstring.
            update_stats: update the running normaliser with this batch (pass False for
                validation so it does not shift training's statistics).

        Returns:
            token_level_scores: float32 (batch, response_len), shaped score on the last
                valid response token, zeros elsewhere.
            metrics: `reward/...` floats (see `_metrics`).
            extras: per-sample arrays (batch,): `score` (raw scorer score), `shaped_score`,
                `data_source`, `failure` (kind or None), `acc` when any scorer reported
                one (NaN where a successful scorer did not, 0 where the call failed), and
                any other keys the scorers returned (object arrays, None where absent).

        Raises:
            RewardFailureError: more than `max_failure_rate` of the calls failed.
            UnknownDataSourceError: a data source has no built-in scorer.
            ValueError / KeyError: the batch lacks a required key.
        """
        responses = data.batch["responses"]
        if "response_mask" in data.batch:
            mask = data.batch["response_mask"]
        else:
            mask = data.batch["attention_mask"][:, -responses.shape[1] :]
        size, response_len = responses.shape
        non_tensor = data.non_tensor_batch
        sources = _column(non_tensor, "data_source", size)
        truths = _column(non_tensor, "ground_truth", size)
        if truths is None and "reward_model" in non_tensor:
            truths = [row.get("ground_truth") for row in _column(non_tensor, "reward_model", size)]
        if sources is None or truths is None:
            raise KeyError(
                "the reward manager needs non_tensor_batch keys 'data_source' and "
                f"'ground_truth'; the batch has {sorted(non_tensor)}"
            )
        extra_infos = _column(non_tensor, "extra_info", size) or [None] * size
        if "messages" in non_tensor:  # a multi-turn rollout: the scorer sees the conversation
            extra_infos = _with_conversation(extra_infos, non_tensor, size)
        texts = self._decode(responses, mask)
        kwargs_list = [
            {"data_source": s, "solution_str": t, "ground_truth": g, "extra_info": e}
            for s, t, g, e in zip(sources, texts, truths, extra_infos)
        ]
        self.failures.reset()
        results = self._score(kwargs_list)

        raw = np.array([r.score for r in results], dtype=np.float64)
        lengths = (mask != 0).sum(dim=-1).cpu().numpy()
        shaped, metrics = self._shape(raw, lengths, response_len, update_stats)
        token_level_scores = place_on_last_token(torch.from_numpy(shaped).float(), mask)

        extras = self._extras(results, raw, shaped, sources)
        rows = _column(non_tensor, "index", size)
        metrics.update(self._metrics(results, raw, shaped, sources, truths, lengths, extras, rows))
        self._examine(data, texts, sources, truths, raw, shaped)
        return token_level_scores, metrics, extras

    # ------------------------------------------------------------------ shaping
    def _shape(
        self, raw: np.ndarray, lengths: np.ndarray, response_len: int, update_stats: bool
    ) -> tuple[np.ndarray, dict[str, float]]:
        """raw -> (+ overlong penalty) -> (normalise) -> (clip); returns shaped and metrics."""
        metrics: dict[str, float] = {}
        shaped = raw.copy()
        if self.overlong_buffer is not None:
            penalty = self.overlong_buffer.penalty(lengths, response_len)
            shaped = shaped + penalty
            metrics["reward/overlong_penalty_mean"] = _mean(penalty)
            metrics["reward/overlong_ratio"] = _mean(penalty < 0)
        if self.normalizer is not None:
            if update_stats:
                self.normalizer.update(shaped)
            shaped = self.normalizer.normalize(shaped)
            metrics["reward/running_mean"] = self.normalizer.mean
            metrics["reward/running_std"] = self.normalizer.std
        if self.clip_range is not None:
            lo, hi = self.clip_range
            metrics["reward/clip_ratio"] = _mean((shaped < lo) | (shaped > hi))
            shaped = np.clip(shaped, lo, hi)
        return shaped, metrics

    # ------------------------------------------------------------------ reporting
    def _extras(
        self,
        results: list[RewardResult],
        raw: np.ndarray,
        shaped: np.ndarray,
        sources: list[Any],
    ) -> dict[str, np.ndarray]:
        extras: dict[str, np.ndarray] = {
            "score": raw.astype(np.float32),
            "shaped_score": shaped.astype(np.float32),
            "data_source": np.array(sources, dtype=object),
            "failure": np.array([r.failure for r in results], dtype=object),
        }
        if any(r.ok and "acc" in r.extra for r in results):
            extras["acc"] = np.array(
                [_acc_of(r) if r.ok else 0.0 for r in results], dtype=np.float32
            )
        keys = {k for r in results for k in r.extra if k not in _RESERVED_EXTRAS}
        for key in sorted(keys):
            column = np.empty(len(results), dtype=object)
            column[:] = [r.extra.get(key) for r in results]
            extras[key] = column
        return extras

    def _metrics(
        self,
        results: list[RewardResult],
        raw: np.ndarray,
        shaped: np.ndarray,
        sources: list[Any],
        truths: list[Any],
        lengths: np.ndarray,
        extras: dict[str, np.ndarray],
        rows: list[Any] | None = None,
    ) -> dict[str, float]:
        metrics = {**_stats("reward/score", raw), **_stats("reward/shaped_score", shaped)}
        metrics.update(self.failures.metrics())
        metrics["reward/failure_rate"] = _mean(np.array([not r.ok for r in results]))
        invalid = [i for i, r in enumerate(results) if r.extra.get("invalid_ground_truth")]
        metrics["reward/invalid_ground_truth"] = float(len(invalid))
        for i in invalid:
            if self._invalid_gt_logged < self._max_logged:
                self._invalid_gt_logged += 1
                row = "" if rows is None else f", dataset row index {rows[i]}"
                logger.warning(
                    "unparseable ground truth %r (sample %d%s, data_source=%r): scored 0 and "
                    "counted in reward/invalid_ground_truth; fix the row's "
                    "reward_model.ground_truth",
                    truths[i],
                    i,
                    row,
                    sources[i],
                )
        metrics["reward/empty_responses"] = float((lengths == 0).sum())
        by_source: dict[str, list[int]] = defaultdict(list)
        for i, source in enumerate(sources):
            by_source[str(source)].append(i)
        for source, index in by_source.items():
            metrics[f"reward/score_mean/{source}"] = float(raw[index].mean())
        acc = extras.get("acc")
        if acc is not None:
            if not np.isnan(acc).all():
                metrics["reward/acc"] = float(np.nanmean(acc))
            for source, index in by_source.items():
                if not np.isnan(acc[index]).all():
                    metrics[f"reward/acc/{source}"] = float(np.nanmean(acc[index]))
        return metrics

    def _examine(
        self,
        data: Any,
        texts: list[str],
        sources: list[Any],
        truths: list[Any],
        raw: np.ndarray,
        shaped: np.ndarray,
    ) -> None:
        if self.num_examine <= 0 or not logger.isEnabledFor(logging.INFO):
            return
        shown: Counter[str] = Counter()
        for i, source in enumerate(sources):
            if shown[str(source)] >= self.num_examine:
                continue
            shown[str(source)] += 1
            prompt = self._decode_prompt(data, i)
            logger.info(
                "[%s] prompt: %r\n  response: %r\n  ground_truth: %r  score: %.4g  shaped: %.4g",
                source,
                prompt,
                texts[i],
                truths[i],
                raw[i],
                shaped[i],
            )

    def _decode_prompt(self, data: Any, i: int) -> str | None:
        prompts = data.batch.get("prompts") if hasattr(data.batch, "get") else None
        if prompts is None:
            return None
        ids = prompts[i]
        if "attention_mask" in data.batch:
            ids = ids[data.batch["attention_mask"][i, : prompts.shape[1]] != 0]
        return self._decode(ids.unsqueeze(0), torch.ones_like(ids).unsqueeze(0))[0]

    # ------------------------------------------------------------------ lifecycle
    def shape_scores(
        self, token_scores: torch.Tensor, response_mask: torch.Tensor, update_stats: bool
    ) -> tuple[torch.Tensor, dict[str, float], dict[str, Any]]:
        """Sequence scores made elsewhere (a reward model's, stored rollouts'; each on one
        token of ``token_scores`` ``(batch, response_len)``) shaped exactly like this
        manager's own: overlong penalty, running normalisation, clip
        (``reward_model.overlong_buffer / normalize / clip_range``), in that order.
        ``update_stats``: move the running mean/std (training batches only).

        Returns ``(token_level_scores, metrics, extras)``: the shaped sequence score on each
        response's last valid token, the shaping metrics, and ``{"score": raw score}``.
        """
        mask = response_mask.cpu()
        raw = token_scores.detach().cpu().double().sum(-1).numpy()
        lengths = (mask != 0).sum(dim=-1).numpy()
        shaped, metrics = self._shape(raw, lengths, mask.shape[-1], update_stats)
        metrics |= _stats("reward/model_score", raw)
        shaped_tokens = place_on_last_token(torch.from_numpy(shaped).float(), mask)
        return shaped_tokens, (metrics if update_stats else {}), {"score": raw}

    def state_dict(self) -> dict[str, Any]:
        """Checkpointable state: the running normaliser (empty when normalize=False)."""
        return {"normalizer": self.normalizer.state_dict()} if self.normalizer else {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.normalizer is not None and "normalizer" in state:
            self.normalizer.load_state_dict(state["normalizer"])

    def close(self) -> None:
        """Stop the worker processes, if any."""
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


# ---------------------------------------------------------------------- registry
def register_reward_manager(name: str, *, override: bool = False) -> Callable[[type], type]:
    """Class decorator registering a reward manager under `name` (config `reward_manager`).

    A name already bound to another class raises `ValueError` unless `override=True`.
    """
    return REWARD_MANAGERS.register(name, override=override)


def get_reward_manager(name: str) -> type:
    """The reward manager class registered as `name`."""
    if name not in REWARD_MANAGERS:
        raise UnknownNameError(
            f"unknown reward_manager={name!r}; registered: {', '.join(REWARD_MANAGERS.names())}"
        )
    return REWARD_MANAGERS.get(name)
