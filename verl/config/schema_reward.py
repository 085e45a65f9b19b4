"""Config sections of the reward sources beyond the rules and the reward model
(``reward_model.judge``, ``reward_model.remote``, ``reward_model.overlap``): an LLM judge,
a scoring service over HTTP, and scoring overlapped with generation. ``reward_model.mixture``
(in :class:`~verl.config.schema_roles.RewardModelConfig`) weighs them. What they do:
``docs/judge.md``; the code: ``verl.rewards.judge``, ``verl.rewards.remote``,
``verl.rewards.mixture``, ``verl.rewards.overlap``.
"""

# `entry(...)` returns a dataclasses.Field (default_factory for mutables), which RUF009 cannot see.
# ruff: noqa: RUF009

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from verl.config._fields import Device, Dtype, entry

JudgeBackendName = Literal["local", "http"]
JudgeParserName = Literal["verdict", "score"]
RemoteMode = Literal["sample", "batch"]


# The limits of a reward served over HTTP, shared by reward_model.judge and .remote.
_HTTP: dict[str, tuple[Any, str, dict[str, float]]] = {
    "api_key_env": (
        None,
        "environment variable holding the API key (sent as a Bearer token); null = no key. "
        "Never the key itself",
        {},
    ),
    "concurrency": (8, "requests in flight at most", {"ge": 1}),
    "timeout_s": (30.0, "seconds per request before it counts as a timeout", {"gt": 0}),
    "max_retries": (
        3,
        "retries of a timed-out, refused, 429 or 5xx request (exponential backoff)",
        {"ge": 0},
    ),
    "backoff_s": (
        0.5,
        "first retry's wait in seconds; doubled each retry, times a jitter in [0.5, 1]",
        {"ge": 0},
    ),
    "max_backoff_s": (8.0, "longest wait between retries, seconds", {"ge": 0}),
    "rate_limit": (
        None,
        "requests per second at most (retries included); null = no limit",
        {"gt": 0},
    ),
}


def _http(name: str) -> Any:
    default, help_text, bounds = _HTTP[name]
    return entry(default, help_text, **bounds)


@dataclass
class JudgeConfig:
    """An LLM judge grading each response against the reference (``docs/judge.md``)."""

    enable: bool = entry(
        False, "score responses with the judge (alone, or in reward_model.mixture)"
    )
    backend: JudgeBackendName = entry(
        "local", "local (a causal LM through the native rollout engine) or http"
    )
    model_path: str | None = entry(
        None, "local backend: the judge's HF causal LM directory (or the embedded model's name)"
    )
    dtype: Dtype = entry("fp32", "local backend: the judge's parameter dtype")
    device: Device = entry("auto", "local backend: where the judge runs (auto: trainer.device)")
    base_url: str | None = entry(
        None, "http backend: the OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1"
    )
    model: str | None = entry(None, "http backend: the endpoint's model name")
    prompt_template: str | None = entry(
        None,
        "the judge's prompt: a string with {question}, {response}, {reference}, or a file "
        "holding one; null = the parser's default template",
    )
    parser: JudgeParserName = entry(
        "verdict", "verdict (VERDICT: correct / incorrect -> 1 / 0) or score (SCORE: n)"
    )
    score_pattern: str | None = entry(
        None, "regex with a named group verdict or score, read instead of the parser's"
    )
    max_score: float = entry(10.0, "score parser: the top score (scores are divided by it)", gt=0)
    max_new_tokens: int = entry(64, "tokens of the judge's reply at most (greedy)", ge=1)
    batch_size: int = entry(8, "prompts per judge call (local: per generate call)", ge=1)
    api_key_env: str | None = _http("api_key_env")
    concurrency: int = _http("concurrency")
    timeout_s: float = _http("timeout_s")
    max_retries: int = _http("max_retries")
    backoff_s: float = _http("backoff_s")
    max_backoff_s: float = _http("max_backoff_s")
    rate_limit: float | None = _http("rate_limit")


@dataclass
class RemoteRewardConfig:
    """A scoring service of one's own: POST JSON samples, read scores (``docs/judge.md``)."""

    url: str | None = entry(
        None, "where to POST (http:// or https://); null = no remote reward source"
    )
    mode: RemoteMode = entry(
        "sample", "sample: one sample per request; batch: batch_size samples per request"
    )
    batch_size: int = entry(32, "batch mode: samples per request", ge=1)
    api_key_env: str | None = _http("api_key_env")
    concurrency: int = _http("concurrency")
    timeout_s: float = _http("timeout_s")
    max_retries: int = _http("max_retries")
    backoff_s: float = _http("backoff_s")
    max_backoff_s: float = _http("max_backoff_s")
    rate_limit: float | None = _http("rate_limit")


@dataclass
class RewardOverlapConfig:
    """Scoring while generation continues: the rollout batch is generated in chunks of
    prompts and each chunk scored in the background (judge, remote and mixture rewards)."""

    num_chunks: int = entry(
        1, "chunks of each rollout batch; chunk k is scored while k+1 generates (1 = off)", ge=1
    )
    num_workers: int = entry(1, "background scoring threads", ge=1)
