"""What the OpenAI-compatible endpoint (:mod:`verl.rollout.openai_server`) records and
queues: its requests, answers and refusals.

Contract: a :class:`Session` is one rollout's key and state: the :class:`Record` of every
answered request in order (the last one's context, flags and log-probs are the whole
trajectory), the number of refused requests and how each prompt was stitched. A
:class:`PendingRequest` is a queued request; the rollout thread settles it exactly once,
with :meth:`PendingRequest.answer` or :meth:`PendingRequest.refuse` (later calls are
ignored). :class:`RequestRefused` is an HTTP error with OpenAI's error body.
"""

from __future__ import annotations

import concurrent.futures
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PendingRequest", "Record", "RequestRefused", "Session"]


class RequestRefused(Exception):
    """A request the endpoint answers with an HTTP error (OpenAI's error body)."""

    def __init__(self, status: int, message: str, code: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.code, self.kind = status, message, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "code": self.code}}


@dataclass
class Record:
    """One answered model request of a rollout.

    ``context``: the prompt ids the engine continued; ``flags[i]`` is 1 where
    ``context[i]`` is an id the model sampled earlier in this rollout, and
    ``context_log_probs[i]`` its log-prob (0.0 elsewhere). ``prompt_len``: the length of the
    chain's first prompt (the training row's prompt; the rest is its response).
    ``sampled`` / ``log_probs``: the new ids and their log-probs. ``parent``: the index of
    the record whose ids were reused (None: a new chain). ``messages`` / ``reply``: the chat
    request's messages and the assistant message it was answered with (None for
    completions). ``versions`` / ``context_versions``: with partial rollouts, the policy
    version that sampled each id of ``sampled`` / ``context`` (-1 on ids the model did not
    sample in this rollout); None when the engine records no versions.
    """

    endpoint: str
    context: list[int]
    flags: list[int]
    context_log_probs: list[float]
    prompt_len: int
    parent: int | None
    sampled: list[int]
    log_probs: list[float]
    finish_reason: str
    text: str
    stitch: str  # "messages", "text", "ids", "partial" or "new"
    kept: int = 0  # how many of the parent's sampled ids this context reuses
    messages: list[dict[str, Any]] | None = None
    reply: dict[str, Any] | None = None
    versions: list[int] | None = None
    context_versions: list[int] | None = None
    _full_text: str | None = None


@dataclass
class Session:
    """The state of one rollout's key: its records and what was refused."""

    key: str
    row: int
    records: list[Record] = field(default_factory=list)
    open: bool = True
    refused: int = 0
    stitching: Counter = field(default_factory=Counter)


@dataclass
class PendingRequest:
    """A queued request; the rollout thread answers it with :meth:`answer` or :meth:`refuse`."""

    session: Session
    endpoint: str  # "chat" or "completions"
    body: dict[str, Any]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)

    def answer(self, record: Record, logprobs: bool) -> None:
        if not self.future.done():
            self.future.set_result((record, logprobs))

    def refuse(self, exc: RequestRefused) -> None:
        if not self.future.done():
            self.future.set_exception(exc)
