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


MIXTURE_SOURCES = ("rules", "model", "judge", "remote")


def check_reward_sources(c: Any, rm: Any, p: str = "reward_model") -> None:
    """Report (``c.error(keys, message)``, a :class:`~verl.config.checks.Checks`) the reward
    source settings of ``rm`` (a ``RewardModelConfig``) that cannot work."""
    judge = rm.judge
    if judge.enable and judge.backend == "local" and not judge.model_path:
        c.error(
            (f"{p}.judge.model_path", f"{p}.judge.backend"),
            f"{p}.judge.backend=local needs {p}.judge.model_path (a HF causal LM directory)",
        )
    if judge.enable and judge.backend == "http":
        for key in ("base_url", "model"):
            if not getattr(judge, key):
                c.error(
                    (f"{p}.judge.{key}", f"{p}.judge.backend"),
                    f"{p}.judge.backend=http needs {p}.judge.{key}",
                )
    if rm.remote.url is not None and not rm.remote.url.startswith(("http://", "https://")):
        c.error(f"{p}.remote.url", f"{p}.remote.url={rm.remote.url!r}: must be an http(s):// URL")
    on = {
        "model": rm.enable,
        "judge": judge.enable,
        "remote": rm.remote.url is not None,
        "rules": True,
    }
    for name, weight in rm.mixture.items():
        if name not in MIXTURE_SOURCES:
            c.error(
                f"{p}.mixture",
                f"{p}.mixture names {name!r}: the sources are {', '.join(MIXTURE_SOURCES)}",
            )
        elif not on[name]:
            need = {"model": "reward_model.enable=true", "judge": "reward_model.judge.enable=true"}
            c.error(
                f"{p}.mixture",
                f"{p}.mixture weighs {name!r}, which is not configured: set "
                f"{need.get(name, 'reward_model.remote.url')}",
            )
        if not isinstance(weight, int | float) or weight != weight or abs(weight) == float("inf"):
            c.error(f"{p}.mixture", f"{p}.mixture.{name}={weight!r}: must be a finite number")
    extra = [name for name in ("model", "judge", "remote") if on[name]]
    if not rm.mixture and len(extra) > 1:
        c.error(
            f"{p}.mixture",
            f"{' and '.join(extra)} are all configured as reward sources: say how to weigh "
            f"them in {p}.mixture, e.g. {{{', '.join(f'{n}: 0.5' for n in extra)}}}",
        )
    if rm.overlap.num_chunks > 1 and not (rm.mixture or judge.enable or on["remote"]):
        c.error(
            f"{p}.overlap.num_chunks",
            f"{p}.overlap.num_chunks={rm.overlap.num_chunks}: overlap scores the judge, remote "
            "and mixture rewards; the rules and the reward model are scored after generation "
            "(set it to 1, or use one of those sources)",
        )
