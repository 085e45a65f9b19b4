"""A generative reward: a causal LM (the judge) grades each response against the reference.

    scorer = JudgeScorer(backend, tokenizer)                 # the actor's tokenizer decodes
    reward = SourceReward(scorer, shaper=rules_manager)      # in the reward contract

For each response the judge is sent the prompt template filled with ``{question}`` (the
prompt's last user message), ``{response}`` (the decoded response) and ``{reference}`` (the
row's ground truth); its reply is parsed into a score in ``[0, 1]``:

- ``parser="verdict"`` (default): the last ``VERDICT: correct`` / ``VERDICT: incorrect``
  of the reply (also yes/no, true/false, pass/fail, right/wrong; any case) -> 1 / 0;
- ``parser="score"``: the last ``SCORE: <number>`` with the number in ``[0, max_score]``
  -> number / ``max_score``;
- ``pattern``: a regex of one's own with a named group ``verdict`` or ``score``, read as
  above (the last match counts).

A reply with no match (or a score out of range) is a parse failure: score 0, counted in
``judge/parse_failures``; a backend failure (the endpoint timed out, answered 5xx ...) is
counted as ``judge/<kind>``. Both are bounded like rule failures
(:class:`~verl.rewards.sources.SourceReward`). Metrics: ``judge/parse_failures``,
``judge/mean_score`` (over the parsed replies), ``judge/latency_s_mean`` / ``_max`` (per
backend call), the failure counts.

Backends (``complete(prompts) -> (replies, latencies)``): :class:`HttpJudgeBackend`, an
OpenAI-compatible ``/chat/completions`` endpoint (greedy, the API key read from an
environment variable); the local model served by this project's rollout engine is
``verl.trainer.rl.judge_local.LocalJudgeBackend`` (it needs the rollout package, a layer
above this one). :class:`ScriptedJudgeBackend` answers from a function, for tests.
"""

from __future__ import annotations

import logging
import math
import re
import string
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from verl.rewards.http import HttpSettings, JsonPoster
from verl.rewards.sources import SampleScorer, SourceScores, sample_texts

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_SCORE_TEMPLATE",
    "DEFAULT_VERDICT_TEMPLATE",
    "HttpJudgeBackend",
    "JudgeBackend",
    "JudgeParser",
    "JudgeReply",
    "JudgeScorer",
    "ScriptedJudgeBackend",
    "load_template",
]

TEMPLATE_FIELDS = ("question", "response", "reference")
PARSERS = ("verdict", "score")

DEFAULT_VERDICT_TEMPLATE = """\
You are grading a response to a question, using a reference answer.

Question:
{question}

Response:
{response}

Reference answer:
{reference}

Is the final answer of the response correct? End your reply with one line, exactly
VERDICT: correct
or
VERDICT: incorrect"""

DEFAULT_SCORE_TEMPLATE = """\
You are grading a response to a question, using a reference answer.

Question:
{question}

Response:
{response}

Reference answer:
{reference}

Rate the response from 0 (wrong) to {max_score} (fully correct). End your reply with one \
line: SCORE: <number>"""

_VERDICT_PATTERN = r"VERDICT\s*:\s*\**\s*(?P<verdict>[A-Za-z]+)"
_SCORE_PATTERN = r"SCORE\s*:\s*\**\s*(?P<score>[-+]?\d+(?:\.\d+)?)"
_POSITIVE = frozenset({"correct", "yes", "true", "pass", "right"})
_NEGATIVE = frozenset({"incorrect", "no", "false", "fail", "wrong"})


def load_template(value: str | None, parser: str = "verdict", max_score: float = 10.0) -> str:
    """The judge's prompt template: the default for ``parser`` when ``value`` is None, the
    text of the file ``value`` when it names one (and has no ``{``), else ``value``.

    Raises:
        ValueError: the template names a field other than ``{question}``, ``{response}``,
            ``{reference}`` (literal braces are written ``{{`` and ``}}``), or lacks
            ``{response}``.
    """
    if value is None:
        if parser == "score":
            return DEFAULT_SCORE_TEMPLATE.replace("{max_score}", f"{max_score:g}")
        return DEFAULT_VERDICT_TEMPLATE
    if "{" not in value and Path(value).is_file():
        value = Path(value).read_text(encoding="utf-8")
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
    except ValueError as exc:
        raise ValueError(f"judge prompt template {value[:80]!r}...: {exc}") from None
    unknown = names - set(TEMPLATE_FIELDS)
    if unknown:
        raise ValueError(
            f"judge prompt template names {sorted(unknown)}: only {{question}}, {{response}} "
            "and {reference} are filled (write literal braces as {{ and }})"
        )
    if "response" not in names:
        raise ValueError(
            "judge prompt template has no {response} field: the judge would not see the "
            f"response it grades (template: {value[:80]!r}...)"
        )
    return value


class JudgeParser:
    """A judge's reply -> a score in ``[0, 1]``, or None when it cannot be read (see the
    module docstring for ``kind``, ``pattern`` and ``max_score``)."""

    def __init__(
        self, kind: str = "verdict", pattern: str | None = None, max_score: float = 10.0
    ) -> None:
        if kind not in PARSERS:
            raise ValueError(f"judge parser={kind!r} is not one of {PARSERS}")
        if not max_score > 0:
            raise ValueError(f"judge max_score={max_score} must be > 0")
        source = pattern or (_SCORE_PATTERN if kind == "score" else _VERDICT_PATTERN)
        try:
            self.regex = re.compile(source, re.IGNORECASE)
        except re.error as exc:
            raise ValueError(
                f"judge score_pattern={source!r} is not a valid regex: {exc}"
            ) from None
        groups = set(self.regex.groupindex)
        if not groups & {"verdict", "score"}:
            raise ValueError(
                f"judge score_pattern={source!r} has no named group 'verdict' or 'score': "
                r"write e.g. 'GRADE: (?P<score>\d+)'"
            )
        self.group = "score" if "score" in groups else "verdict"
        self.max_score = float(max_score)

    def __call__(self, text: str | None) -> tuple[float | None, str | None]:
        """``(score, None)``, or ``(None, why)`` for a reply that cannot be read."""
        if text is None:
            return None, "no reply"
        matches = list(self.regex.finditer(text))
        if not matches:
            return None, f"no match of {self.regex.pattern!r} in the reply {text[-200:]!r}"
        value = matches[-1].group(self.group)
        if self.group == "verdict":
            word = (value or "").strip().lower()
            if word in _POSITIVE:
                return 1.0, None
            if word in _NEGATIVE:
                return 0.0, None
            return None, f"verdict {value!r} is neither correct nor incorrect"
        try:
            number = float(value)
        except (TypeError, ValueError):
            return None, f"score {value!r} is not a number"
        if not math.isfinite(number) or not 0 <= number <= self.max_score:
            return None, f"score {value!r} is outside [0, {self.max_score:g}]"
        return number / self.max_score, None


@dataclass
class JudgeReply:
    """The judge's text for one prompt, or why there is none (``failure``: a kind such as
    ``timeouts``, ``http_status``, ``malformed``, ``errors``)."""

    text: str | None
    failure: str | None = None
    message: str | None = None


class JudgeBackend(Protocol):
    def complete(self, prompts: Sequence[str]) -> tuple[list[JudgeReply], list[float]]:
        """One reply per prompt, in order, and the seconds of each call made."""
        ...

    def close(self) -> None: ...


class ScriptedJudgeBackend:
    """Replies from ``fn(prompt) -> str`` (deterministic tests, dry runs)."""

    def __init__(self, fn: Callable[[str], str]) -> None:
        self.fn = fn
        self.prompts: list[str] = []

    def complete(self, prompts: Sequence[str]) -> tuple[list[JudgeReply], list[float]]:
        start = time.perf_counter()
        self.prompts += list(prompts)
        replies = [JudgeReply(self.fn(p)) for p in prompts]
        return replies, [time.perf_counter() - start]

    def close(self) -> None:
        return None


class HttpJudgeBackend:
    """An OpenAI-compatible endpoint: ``POST {base_url}/chat/completions`` with one user
    message per prompt, greedy (``temperature=0``), ``max_tokens``; the reply is
    ``choices[0].message.content``. Requests go through a :class:`JsonPoster` (its
    concurrency, timeout, retries and rate limit); ``settings.headers`` carries the key."""

    def __init__(
        self,
        base_url: str,
        model: str,
        settings: HttpSettings | None = None,
        max_new_tokens: int = 256,
    ) -> None:
        if not base_url:
            raise ValueError("the HTTP judge needs base_url (reward_model.judge.base_url)")
        if not model:
            raise ValueError("the HTTP judge needs the model name (reward_model.judge.model)")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.max_new_tokens = max_new_tokens
        self.poster = JsonPoster(settings)

    def complete(self, prompts: Sequence[str]) -> tuple[list[JudgeReply], list[float]]:
        bodies = [
            {
                "model": self.model,
                "messages": [{"role": "user", "content": p}],
                "max_tokens": self.max_new_tokens,
                "temperature": 0.0,
            }
            for p in prompts
        ]
        outcomes = self.poster.post_many(self.url, bodies)
        replies = []
        for outcome in outcomes:
            if not outcome.ok:
                replies.append(JudgeReply(None, outcome.failure, outcome.message))
                continue
            try:
                content = outcome.body["choices"][0]["message"]["content"]
                if not isinstance(content, str):
                    raise TypeError(f"content is {type(content).__name__}")
            except (KeyError, IndexError, TypeError) as exc:
                body = str(outcome.body)[:200]
                replies.append(
                    JudgeReply(
                        None, "malformed", f"no choices[0].message.content ({exc!r}): {body}"
                    )
                )
                continue
            replies.append(JudgeReply(content))
        return replies, [o.latency_s for o in outcomes]

    def close(self) -> None:
        self.poster.close()


class JudgeScorer(SampleScorer):
    """The judge as a reward source (:class:`~verl.rewards.sources.SampleScorer`).

    Args:
        backend: sends prompts, returns replies (see the module docstring).
        tokenizer: the actor's tokenizer (decodes the responses and prompts).
        template: the prompt template (:func:`load_template`); None: the parser's default.
        parser: a :class:`JudgeParser` (default: verdicts).
        batch_size: prompts per backend call.
    """

    name = "judge"
    hint = (
        "check the judge's replies against reward_model.judge.parser / score_pattern and "
        "its endpoint or model (docs/judge.md)"
    )

    def __init__(
        self,
        backend: JudgeBackend,
        tokenizer: Any,
        template: str | None = None,
        parser: JudgeParser | None = None,
        batch_size: int = 8,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"judge batch_size={batch_size} must be >= 1")
        self.backend = backend
        self.tokenizer = tokenizer
        self.parser = parser or JudgeParser()
        self.template = load_template(
            template, "score" if self.parser.group == "score" else "verdict", self.parser.max_score
        )
        self.batch_size = batch_size

    def prompts(self, batch: Any) -> list[str]:
        """The filled template of every response of ``batch``."""
        texts = sample_texts(batch, self.tokenizer)
        return [
            self.template.format(question=q, response=r, reference="" if g is None else g)
            for q, r, g in zip(texts.questions, texts.responses, texts.references)
        ]

    def score(self, batch: Any) -> SourceScores:
        prompts = self.prompts(batch)
        replies: list[JudgeReply] = []
        latencies: list[float] = []
        for start in range(0, len(prompts), self.batch_size):
            got, seconds = self.backend.complete(prompts[start : start + self.batch_size])
            replies += got
            latencies += seconds
        scores = np.zeros(len(prompts))
        failures: list[str | None] = [None] * len(prompts)
        messages: list[str | None] = [None] * len(prompts)
        for i, reply in enumerate(replies):
            if reply.failure is not None:
                failures[i], messages[i] = f"judge/{reply.failure}", reply.message
                continue
            value, why = self.parser(reply.text)
            if value is None:
                failures[i], messages[i] = "judge/parse_failures", why
            else:
                scores[i] = value
        text = np.empty(len(replies), dtype=object)
        text[:] = [r.text for r in replies]
        extras = {"judge_reply": text}
        if self.parser.group == "verdict":
            extras["acc"] = scores.astype(np.float32)
        return SourceScores(scores, failures, messages, extras=extras, latencies=latencies)

    def metrics(self, scores: SourceScores) -> dict[str, float]:
        metrics = super().metrics(scores)
        metrics.setdefault("judge/parse_failures", 0.0)
        parsed = ~scores.failed
        metrics["judge/mean_score"] = float(scores.scores[parsed].mean()) if parsed.any() else 0.0
        return metrics

    def close(self) -> None:
        self.backend.close()
