"""JSON over HTTP for rewards scored elsewhere (a scoring service, an LLM judge's endpoint):
bounded concurrency, a per-request timeout, retries with exponential backoff and jitter, a
rate limit, and every failure classified.

    poster = JsonPoster(HttpSettings(timeout_s=10, max_retries=3, concurrency=8, rate_limit=20))
    outcomes = poster.post_many(url, [body, body, ...])   # one HttpOutcome per body, in order
    poster.close()

Contract of :meth:`JsonPoster.post_many`: it never raises for a failed request; each body
gets an :class:`HttpOutcome` with the decoded JSON (``ok``) or the failure's kind and
message. The kinds (the ``<prefix>/<kind>`` metrics of the caller):

| kind | when | retried |
|---|---|---|
| ``timeouts`` | no full answer within ``timeout_s`` | yes |
| ``http_status`` | an answer with a status outside 2xx | 429 and 5xx; other 4xx are not |
| ``malformed`` | a 2xx answer whose body is not JSON | no |
| ``errors`` | the connection failed (refused, reset, DNS) | yes |

A retried request waits ``min(max_backoff_s, backoff_s * 2**attempt)`` times a uniform
jitter factor in ``[0.5, 1.0]`` (so many clients that failed together do not retry
together); the outcome is the last attempt's. ``rate_limit`` spaces the starts of requests
(retries included) at least ``1 / rate_limit`` seconds apart across all threads; at most
``concurrency`` requests are in flight. The client is ``httpx`` (installed with the
``openai`` client of the ``[agent]`` / ``[test]`` extras); its absence is reported when the
first poster is built, naming the extra.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "HTTP_FAILURE_KINDS",
    "HttpOutcome",
    "HttpSettings",
    "JsonPoster",
    "RateLimiter",
    "bearer_headers",
]

HTTP_FAILURE_KINDS = ("timeouts", "http_status", "malformed", "errors")
_RETRIED_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass
class HttpSettings:
    """How requests are sent; see the module docstring for the retry and rate rules."""

    timeout_s: float = 10.0
    max_retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    concurrency: int = 8
    rate_limit: float | None = None  # requests per second over all threads; None: no limit
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s={self.timeout_s} must be > 0 seconds")
        if self.max_retries < 0:
            raise ValueError(f"max_retries={self.max_retries} must be >= 0")
        if self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError(
                f"backoff_s={self.backoff_s} and max_backoff_s={self.max_backoff_s} must be >= 0"
            )
        if self.concurrency < 1:
            raise ValueError(f"concurrency={self.concurrency} must be >= 1")
        if self.rate_limit is not None and not self.rate_limit > 0:
            raise ValueError(f"rate_limit={self.rate_limit} must be > 0 requests/s or None")


@dataclass
class HttpOutcome:
    """One request's result: ``body`` (decoded JSON) when ``ok``, else ``failure`` (one of
    :data:`HTTP_FAILURE_KINDS`) and ``message``; ``attempts`` counts the tries,
    ``latency_s`` the seconds from the first try to the last answer."""

    body: Any = None
    failure: str | None = None
    message: str | None = None
    attempts: int = 1
    latency_s: float = 0.0
    status: int | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


class RateLimiter:
    """Spaces events at least ``1 / rate`` seconds apart, across threads."""

    def __init__(self, rate: float | None, clock: Any = time.monotonic, sleep: Any = time.sleep):
        self.interval = 0.0 if rate is None else 1.0 / rate
        self._next = 0.0
        self._lock = threading.Lock()
        self._clock = clock
        self._sleep = sleep

    def wait(self) -> None:
        if self.interval == 0.0:
            return
        with self._lock:
            now = self._clock()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            self._sleep(start - now)


def _httpx() -> Any:
    try:
        import httpx
    except ImportError as exc:  # pragma: no cover - httpx comes with the test extras
        raise ImportError(
            "rewards over HTTP (reward_model.remote, reward_model.judge.backend=http) need "
            "httpx: pip install 'verl[agent]' (or pip install httpx)"
        ) from exc
    return httpx


class JsonPoster:
    """POSTs JSON bodies with the limits of ``settings``; thread-safe; ``close()`` when done."""

    def __init__(self, settings: HttpSettings | None = None, *, seed: int | None = None) -> None:
        httpx = _httpx()
        self.settings = settings or HttpSettings()
        s = self.settings
        self._client = httpx.Client(
            timeout=httpx.Timeout(s.timeout_s),
            limits=httpx.Limits(max_connections=s.concurrency),
            headers=dict(s.headers),
        )
        self._pool = ThreadPoolExecutor(s.concurrency, thread_name_prefix="reward-http")
        self._limiter = RateLimiter(s.rate_limit)
        self._random = random.Random(seed)
        self._random_lock = threading.Lock()
        self._timeout_error = httpx.TimeoutException
        self._transport_error = httpx.TransportError

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before retry ``attempt`` (0-based): capped exponential, jittered."""
        s = self.settings
        with self._random_lock:
            jitter = self._random.uniform(0.5, 1.0)
        return min(s.max_backoff_s, s.backoff_s * 2**attempt) * jitter

    def post(self, url: str, body: Any) -> HttpOutcome:
        """One body, retried as the module docstring says; never raises for a failed request."""
        start = time.perf_counter()
        attempts = self.settings.max_retries + 1
        outcome = HttpOutcome()
        for attempt in range(attempts):
            self._limiter.wait()
            outcome, retry = self._try(url, body)
            outcome.attempts = attempt + 1
            if outcome.ok or not retry or attempt + 1 == attempts:
                break
            time.sleep(self.backoff(attempt))
        outcome.latency_s = time.perf_counter() - start
        return outcome

    def _try(self, url: str, body: Any) -> tuple[HttpOutcome, bool]:
        try:
            response = self._client.post(url, json=body)
        except self._timeout_error as exc:
            return HttpOutcome(failure="timeouts", message=f"POST {url}: timed out ({exc})"), True
        except self._transport_error as exc:
            return HttpOutcome(failure="errors", message=f"POST {url}: {exc!r}"), True
        status = response.status_code
        if not 200 <= status < 300:
            text = response.text[:200]
            return HttpOutcome(
                failure="http_status", message=f"POST {url}: HTTP {status}: {text}", status=status
            ), status in _RETRIED_STATUS
        try:
            decoded = json.loads(response.content)
        except ValueError as exc:
            return HttpOutcome(
                failure="malformed",
                message=f"POST {url}: the answer is not JSON ({exc}): {response.text[:200]!r}",
                status=status,
            ), False
        return HttpOutcome(body=decoded, status=status), False

    def post_many(self, url: str, bodies: Sequence[Any]) -> list[HttpOutcome]:
        """Every body, at most ``concurrency`` at a time; outcomes in the order of ``bodies``."""
        return list(self._pool.map(lambda b: self.post(url, b), bodies))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()

    def __enter__(self) -> JsonPoster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def bearer_headers(api_key_env: str | None, environ: Mapping[str, str] | None = None) -> dict:
    """``{"Authorization": "Bearer <key>"}`` from the environment variable ``api_key_env``
    (the config names the variable, never the key); ``{}`` when ``api_key_env`` is None.

    Raises:
        KeyError: the variable is named but not set.
    """
    if not api_key_env:
        return {}
    env = os.environ if environ is None else environ
    key = env.get(api_key_env)
    if not key:
        raise KeyError(
            f"api_key_env={api_key_env!r}: the environment variable {api_key_env} is not set; "
            "export the API key there (the config names the variable, never the key)"
        )
    return {"Authorization": f"Bearer {key}"}
