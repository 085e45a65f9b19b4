"""Reward sources scored per response, and the one wrapper that puts any of them in the
reward contract (:mod:`verl.rewards.contract`).

A source (:class:`SampleScorer`) turns a batch of responses into raw per-response scores,
:class:`SourceScores`, and moves no running state, so scoring a batch in chunks and
joining the chunks (:meth:`SourceScores.concat`) gives exactly the scores of one call:

- :class:`RuleSource`: any reward function in the contract (the rules' manager, a user's
  function), its raw ``score`` per response;
- :class:`ModelSource`: a reward model's worker group (``compute_rm_score``);
- ``verl.rewards.judge.JudgeScorer`` (an LLM judge), ``verl.rewards.remote.RemoteScorer``
  (a scoring service over HTTP), ``verl.rewards.mixture.MixtureScorer`` (a weighted sum of
  sources).

:class:`SourceReward` is a source in the contract, in two phases: :meth:`~SourceReward.score_raw`
(per response, any thread; what :mod:`verl.rewards.overlap` runs in the background while
generation continues) and :meth:`~SourceReward.finish` (the failure bound, then the
shaping of the rules' manager: overlong penalty, running normalisation, clip; then the
metrics), which runs once per step on the whole batch.

Failures: a source marks each failed response with a kind (``judge/parse_failures``,
``remote/timeouts`` ...) and scores it 0; when more than ``max_failure_rate`` of a step's
responses failed, :meth:`SourceReward.finish` raises
:class:`~verl.rewards.isolation.RewardFailureError` naming the source, its most common
failure and an example, as the rules' manager does for its calls.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from verl.rewards.contract import RewardFunction, RewardOutput
from verl.rewards.isolation import RewardFailureError
from verl.rewards.manager import too_many_failures
from verl.rewards.placement import place_on_last_token

logger = logging.getLogger(__name__)

__all__ = [
    "ModelSource",
    "RuleSource",
    "SampleScorer",
    "SampleTexts",
    "SourceReward",
    "SourceScores",
    "sample_texts",
]

MAX_LOGGED_PER_KIND = 5


@dataclass
class SourceScores:
    """Raw scores of one source for ``B`` responses (a batch or a chunk of one).

    ``scores`` (B,) float64, 0 where the response failed; ``failures`` (B,) object: the
    failure kind (``<source>/<kind>``) or None; ``messages``: why each failed (None when
    not); ``extras``: per-response arrays (B,) (``acc``, the judge's text ...);
    ``latencies``: seconds of each request or call the source made; ``counts``: additive
    counters (``remote/retries`` ...).
    """

    scores: np.ndarray
    failures: np.ndarray
    messages: list[str | None] = field(default_factory=list)
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    counts: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.scores = np.asarray(self.scores, dtype=np.float64)
        failures = np.empty(len(self.scores), dtype=object)
        failures[:] = list(self.failures)
        self.failures = failures
        if not self.messages:
            self.messages = [None] * len(self.scores)
        if len(self.messages) != len(self.scores):
            raise ValueError(
                f"SourceScores: {len(self.messages)} messages for {len(self.scores)} scores"
            )

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def failed(self) -> np.ndarray:
        """(B,) bool: which responses failed."""
        return np.array([f is not None for f in self.failures], dtype=bool)

    @staticmethod
    def concat(parts: Sequence[SourceScores]) -> SourceScores:
        """The parts joined in order (chunks of one batch -> the batch's scores)."""
        parts = list(parts)
        if not parts:
            raise ValueError("SourceScores.concat: no parts")
        if len(parts) == 1:
            return parts[0]
        keys = [k for k in parts[0].extras if all(k in p.extras for p in parts)]
        counts: Counter[str] = Counter()
        for p in parts:
            counts.update(p.counts)
        return SourceScores(
            scores=np.concatenate([p.scores for p in parts]),
            failures=np.concatenate([p.failures for p in parts]),
            messages=[m for p in parts for m in p.messages],
            extras={k: np.concatenate([p.extras[k] for p in parts]) for k in keys},
            latencies=[t for p in parts for t in p.latencies],
            counts=dict(counts),
        )


@dataclass
class SampleTexts:
    """What text-reading sources see of each response: the ``question`` (the prompt's last
    user message, else the decoded prompt), the ``response`` (decoded, special tokens
    skipped), the ``reference`` (the row's ground truth), ``data_source``, ``extra_info``."""

    questions: list[str]
    responses: list[str]
    references: list[Any]
    data_sources: list[Any]
    extra_infos: list[Any]


def _decode(tokenizer: Any, rows: list[list[int]]) -> list[str]:
    if hasattr(tokenizer, "batch_decode"):
        return list(tokenizer.batch_decode(rows, skip_special_tokens=True))
    return [tokenizer.decode(row, skip_special_tokens=True) for row in rows]


def _question_of(raw_prompt: Any) -> str | None:
    if isinstance(raw_prompt, str):
        return raw_prompt
    messages = list(raw_prompt) if raw_prompt is not None else []
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if users:
        return str(users[-1].get("content", ""))
    return None


def sample_texts(batch: Any, tokenizer: Any) -> SampleTexts:
    """The :class:`SampleTexts` of a batch of generated responses (the reward manager's
    batch contract: ``responses``, ``response_mask``, ``data_source``, ``ground_truth`` or
    ``reward_model.ground_truth``, optional ``extra_info`` and ``raw_prompt``)."""
    responses = batch.batch["responses"]
    if "response_mask" in batch.batch:
        mask = batch.batch["response_mask"]
    else:
        mask = batch.batch["attention_mask"][:, -responses.shape[1] :]
    size = responses.shape[0]
    rows = [ids[m != 0].tolist() for ids, m in zip(responses.cpu(), mask.cpu())]
    texts = _decode(tokenizer, rows)
    nt = batch.non_tensor_batch

    def column(key: str) -> list[Any]:
        return list(nt[key]) if key in nt else [None] * size

    references = column("ground_truth")
    if "ground_truth" not in nt and "reward_model" in nt:
        references = [(r or {}).get("ground_truth") for r in nt["reward_model"]]
    questions = [_question_of(p) for p in column("raw_prompt")]
    if any(q is None for q in questions) and "prompts" in batch.batch:
        prompts = batch.batch["prompts"]
        pmask = batch.batch["attention_mask"][:, : prompts.shape[1]]
        decoded = _decode(
            tokenizer, [ids[m != 0].tolist() for ids, m in zip(prompts.cpu(), pmask.cpu())]
        )
        questions = [q if q is not None else d for q, d in zip(questions, decoded)]
    questions = [q if q is not None else "" for q in questions]
    return SampleTexts(questions, texts, references, column("data_source"), column("extra_info"))


class SampleScorer:
    """A reward source: per-response raw scores, no running state (see the module
    docstring). ``name`` prefixes its metrics and failure kinds; ``hint`` ends the error
    raised when too many of its responses fail."""

    name = "source"
    hint = "fix the reward source"

    def score(self, batch: Any) -> SourceScores:
        raise NotImplementedError

    def metrics(self, scores: SourceScores) -> dict[str, float]:
        """``<name>/score_mean``, every failure kind's count, the latencies and counters."""
        metrics = {f"{self.name}/score_mean": float(scores.scores.mean()) if len(scores) else 0.0}
        for kind, count in Counter(f for f in scores.failures if f is not None).items():
            metrics[kind] = float(count)
        if scores.latencies:
            metrics[f"{self.name}/latency_s_mean"] = float(np.mean(scores.latencies))
            metrics[f"{self.name}/latency_s_max"] = float(np.max(scores.latencies))
        metrics |= {k: float(v) for k, v in scores.counts.items()}
        return metrics

    def close(self) -> None:
        """Release what the source holds (nothing here)."""


class RuleSource(SampleScorer):
    """A reward function in the contract as a source: its raw ``score`` extra per response
    (else its token-level scores' row sums), its ``failure`` and ``acc`` extras. It is
    called with ``update_stats=False`` (its own shaping state is never moved) and keeps its
    own failure bound (the rules' manager raises on its own)."""

    name = "rules"
    hint = "fix the reward function (see docs/errors.md, 'Rewards')"

    def __init__(self, reward: RewardFunction) -> None:
        self.reward = reward

    def score(self, batch: Any) -> SourceScores:
        token_scores, _, extras = self.reward(batch, update_stats=False)
        raw = extras.get("score")
        if raw is None:
            raw = token_scores.detach().cpu().double().sum(-1).numpy()
        failures = extras.get("failure", [None] * len(batch))
        kinds = [None if f is None else f"{self.name}/{f}" for f in failures]
        kept = {k: np.asarray(extras[k]) for k in ("acc",) if k in extras}
        return SourceScores(np.asarray(raw, dtype=np.float64), kinds, extras=kept)

    def close(self) -> None:
        self.reward.close()


class ModelSource(SampleScorer):
    """A reward model's worker group as a source: each response's ``rm_scores`` row sum."""

    name = "model"
    hint = "check the reward model (reward_model.model.path)"

    def __init__(self, group: Any) -> None:
        self.group = group

    def score(self, batch: Any) -> SourceScores:
        rm_scores = self.group.compute_rm_score(batch).batch["rm_scores"]
        raw = rm_scores.detach().cpu().double().sum(-1).numpy()
        return SourceScores(raw, [None] * len(raw))


class SourceReward(RewardFunction):
    """A :class:`SampleScorer` in the reward contract (see the module docstring).

    Args:
        scorer: the source.
        shaper: shapes the raw sequence scores (``shape_scores``: the rules' manager, so
            ``reward_model.overlong_buffer / normalize / clip_range`` apply as to rules);
            None leaves them raw.
        max_failure_rate: the bound on failed responses per call (1.0: only when all
            failed; None: never raise).
    """

    def __init__(
        self,
        scorer: SampleScorer,
        shaper: RewardFunction | None = None,
        max_failure_rate: float | None = 0.5,
    ) -> None:
        if max_failure_rate is not None and not 0 <= max_failure_rate <= 1:
            raise ValueError(f"max_failure_rate={max_failure_rate} must be in [0, 1] or None")
        self.scorer = scorer
        self.shaper = shaper
        self.max_failure_rate = max_failure_rate
        self._prescored: tuple[Any, list[Future]] | None = None
        self._logged: Counter[str] = Counter()

    # ------------------------------------------------------------------ the two phases
    def score_raw(self, batch: Any) -> SourceScores:
        """Raw per-response scores of ``batch`` (or of a chunk of it); moves no state."""
        scores = self.scorer.score(batch)
        if len(scores) != len(batch):
            raise ValueError(
                f"reward source {self.scorer.name} returned {len(scores)} scores for "
                f"{len(batch)} responses"
            )
        return scores

    def prescore(self, batch: Any, pending: list[Future]) -> None:
        """Hand over the raw scores of ``batch``'s chunks, being computed in ``pending``
        (in order): the next call with this very batch object waits for them instead of
        scoring again (:mod:`verl.rewards.overlap`)."""
        self._prescored = (batch, list(pending))

    def finish(
        self, batch: Any, parts: Sequence[SourceScores], update_stats: bool = True
    ) -> RewardOutput:
        """The contract's output from the raw scores of ``batch`` in ``parts`` (its chunks
        in order): failure bound, shaping, metrics.

        Raises:
            RewardFailureError: more than ``max_failure_rate`` of the responses failed.
        """
        raw = SourceScores.concat(parts)
        if len(raw) != len(batch):
            raise ValueError(f"{len(raw)} raw scores for a batch of {len(batch)} responses")
        self._log_failures(raw)
        self._stop_if_failing(raw)
        mask = batch.batch["response_mask"]
        placed = place_on_last_token(torch.from_numpy(raw.scores).float(), mask)
        if self.shaper is not None:
            token_scores, metrics, _ = self.shaper.shape_scores(placed, mask, update_stats)
            metrics = dict(metrics)
        else:
            token_scores, metrics = placed, {}
        shaped = token_scores.sum(-1).double().cpu().numpy()
        metrics["reward/score_mean"] = float(raw.scores.mean()) if len(raw) else 0.0
        metrics["reward/shaped_score_mean"] = float(shaped.mean()) if len(raw) else 0.0
        metrics["reward/failure_rate"] = float(raw.failed.mean()) if len(raw) else 0.0
        metrics |= self.scorer.metrics(raw)
        extras: dict[str, Any] = {
            "score": raw.scores.astype(np.float32),
            "shaped_score": shaped.astype(np.float32),
            "failure": raw.failures,
            **raw.extras,
        }
        return token_scores, metrics, extras

    def __call__(self, batch: Any, *, update_stats: bool = True) -> RewardOutput:
        pending = self._prescored
        if pending is not None and pending[0] is batch:  # another batch leaves it waiting
            self._prescored = None
            parts = [future.result() for future in pending[1]]
        else:
            parts = [self.score_raw(batch)]
        return self.finish(batch, parts, update_stats)

    # ------------------------------------------------------------------ failures
    def _log_failures(self, raw: SourceScores) -> None:
        for i, (kind, message) in enumerate(zip(raw.failures, raw.messages)):
            if kind is None or self._logged[kind] >= MAX_LOGGED_PER_KIND:
                continue
            self._logged[kind] += 1
            logger.warning("reward source failure [%s] (response %d): %s", kind, i, message)
            if self._logged[kind] == MAX_LOGGED_PER_KIND:
                logger.warning(
                    "logged %d failures [%s]; further ones are only counted",
                    MAX_LOGGED_PER_KIND,
                    kind,
                )

    def _stop_if_failing(self, raw: SourceScores) -> None:
        failed = int(raw.failed.sum())
        if not too_many_failures(failed, len(raw), self.max_failure_rate):
            return
        kinds = Counter(f for f in raw.failures if f is not None)
        kind, count = kinds.most_common(1)[0]
        example = next(m for f, m in zip(raw.failures, raw.messages) if f == kind)
        raise RewardFailureError(
            f"reward source {self.scorer.name} failed on {failed} of {len(raw)} responses "
            f"in this step ({failed / len(raw):.0%}), above max_failure_rate="
            f"{self.max_failure_rate:g} (reward_model.max_failure_rate). Most common "
            f"failure: {kind} ({count} responses), e.g. {example}. {self.scorer.hint}; the "
            "run stops instead of training on zero rewards."
        )

    # ------------------------------------------------------------------ lifecycle
    def shape_scores(
        self, token_scores: torch.Tensor, response_mask: torch.Tensor, update_stats: bool
    ) -> RewardOutput:
        if self.shaper is None:
            return token_scores, {}, {}
        return self.shaper.shape_scores(token_scores, response_mask, update_stats)

    def state_dict(self) -> dict[str, Any] | None:
        return None if self.shaper is None else self.shaper.state_dict()

    def load_state_dict(self, state: Any) -> None:
        if self.shaper is not None:
            self.shaper.load_state_dict(state)

    def close(self) -> None:
        self.scorer.close()
        if self.shaper is not None:  # closing twice (a rule source over it) is harmless
            self.shaper.close()
