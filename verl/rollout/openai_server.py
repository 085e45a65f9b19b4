"""An OpenAI-compatible endpoint over the rollout engine, for agent programs as rollouts.

:class:`OpenAIEndpoint` serves ``POST /v1/chat/completions``, ``POST /v1/completions`` and
``GET /v1/models`` on ``127.0.0.1`` (FastAPI, run by ``uvicorn.Server`` in a daemon thread
of the worker process; :meth:`OpenAIEndpoint.stop` sets ``should_exit`` and joins it). The
ordinary ``openai`` client talks to it: ``OpenAI(base_url=endpoint.base_url,
api_key=session.key)``.

**Keys.** Every rollout (one agent run, one training row) gets its own random API key
(:meth:`OpenAIEndpoint.open_session`). A request without a key the endpoint ever issued is
refused with 401; one with the key of a rollout that has ended with 403. An agent only
knows its own key, so it cannot write into another rollout's trajectory, and nothing is
served that reads a trajectory back.

**Who generates.** The HTTP handlers generate nothing: they check the key, queue the
request and await its answer. The thread that runs the rollout
(:class:`verl.rollout.agent_program.AgentProgramRollout`, the worker's thread with its
autocast and gathered parameters) takes queued requests in batches (:meth:`take`), turns
each into token ids (:func:`build_context`), runs one batched engine call per stop-string
set and answers with :meth:`PendingRequest.answer`. All session state is touched by that
one thread; the handlers only read whether a key is open, under a lock.

**Token in, token out.** A request's prompt becomes ids without re-tokenizing anything the
model sampled earlier in the same rollout:

1. chat: when the request's messages start with an earlier request's messages followed by
   the assistant message that request was answered with, the prompt is that request's
   context, its sampled ids exactly, then the chat template's *delta* for the new messages
   (``verl.rollout.tool_calls.ChatDeltaRenderer``, as the agent loop appends tool results);
2. otherwise (and for ``/v1/completions``), the prompt text (the chat template applied to
   ``messages`` with ``add_generation_prompt=True``, or the completion's ``prompt``) is
   matched against earlier requests' context + sampled ids decoded: the longest earlier
   ``context + sampled[:k]`` whose text the prompt starts with is reused as ids, and only
   the rest of the text is tokenized; a completion prompt given as token ids is matched as
   ids;
3. no match: the text is tokenized as it is, and the request starts a new chain.

Each :class:`Record` keeps its context ids with a flag per id (1: sampled by the model in
this rollout) and the log-probs of the sampled ids, so the last request's record is the
whole trajectory: prompt, model tokens (flag 1) and the tokens the agent inserted (tool
results, user turns, template markup; flag 0).

**Sampling.** Every request samples with the rollout's settings (temperature, top-p,
top-k), whatever the request says, so that the recorded log-probs are those of the policy
the trainer recomputes; ``max_tokens`` / ``max_completion_tokens`` and ``stop`` are
honoured (``stop`` strings are cut from the returned text, as OpenAI does; the sampled ids
keep them). ``n`` must be 1. ``logprobs`` returns each sampled token's log-prob
(``top_logprobs`` lists are empty: the engine reports the chosen token only). With
``"return_token_ids": true`` a response also carries ``prompt_token_ids`` and
``token_ids`` (as vLLM's server does). ``stream=true`` answers as server-sent events once
the response is generated (the engine produces a response in one call).
"""

# No ``from __future__ import annotations``: FastAPI reads the handlers' annotations
# (``request: Request``, imported inside ``_app``) at definition time.
import asyncio
import concurrent.futures
import contextlib
import json
import logging
import queue
import secrets
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

__all__ = [
    "OpenAIEndpoint",
    "PendingRequest",
    "Record",
    "RequestRefused",
    "Session",
    "build_context",
]

#: How long :meth:`OpenAIEndpoint.stop` waits for the server thread.
STOP_TIMEOUT_S = 10.0


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
    completions).
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


def _decode(tokenizer: Any, ids: list[int], skip_special: bool = False) -> str:
    return tokenizer.decode(
        ids, skip_special_tokens=skip_special, clean_up_tokenization_spaces=False
    )


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


def _content_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            else:
                raise RequestRefused(
                    400, f"only text content parts are supported, got {part!r:.80}", "bad_content"
                )
        return "".join(parts)
    raise RequestRefused(400, f"message content must be text, got {content!r:.80}", "bad_content")


def _tool_calls_key(calls: Any) -> list[tuple[str, Any]]:
    out = []
    for call in calls or []:
        fn = call.get("function", call) if isinstance(call, dict) else {}
        args = fn.get("arguments")
        if isinstance(args, str):
            with contextlib.suppress(json.JSONDecodeError):
                args = json.loads(args)
        out.append((fn.get("name"), args))
    return out


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """The request's messages with text content (raises :class:`RequestRefused` if bad)."""
    if not isinstance(messages, list) or not messages:
        raise RequestRefused(400, "'messages' must be a non-empty list", "bad_messages")
    out = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestRefused(400, f"each message needs a 'role', got {m!r:.80}", "bad_messages")
        message = {k: v for k, v in m.items() if v is not None}
        message["content"] = _content_text(m.get("content"))
        out.append(message)
    return out


def same_message(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two messages say the same: role, text and tool calls (name, arguments)."""
    return (
        a.get("role") == b.get("role")
        and (a.get("content") or "") == (b.get("content") or "")
        and _tool_calls_key(a.get("tool_calls")) == _tool_calls_key(b.get("tool_calls"))
    )


@dataclass
class Context:
    """The ids a request continues, with their flags and log-probs (see :class:`Record`)."""

    ids: list[int]
    flags: list[int]
    log_probs: list[float]
    prompt_len: int
    parent: int | None
    stitch: str
    kept: int = 0


def _extend(records: list[Record], parent: int, kept: int, rest: list[int], how: str) -> Context:
    r = records[parent]
    return Context(
        ids=r.context + r.sampled[:kept] + rest,
        flags=r.flags + [1] * kept + [0] * len(rest),
        log_probs=r.context_log_probs + r.log_probs[:kept] + [0.0] * len(rest),
        prompt_len=r.prompt_len,
        parent=parent,
        stitch=how,
        kept=kept,
    )


def _full_text(tokenizer: Any, record: Record) -> str:
    if record._full_text is None:
        record._full_text = _decode(tokenizer, record.context + record.sampled)
    return record._full_text


def _match_text(tokenizer: Any, records: list[Record], text: str) -> Context | None:
    """The earlier ``context + sampled[:k]`` with the longest text that ``text`` starts
    with (``k`` as large as possible), reused as ids; the rest of ``text`` tokenized."""
    best: tuple[int, int, int] | None = None  # (chars matched, record, kept)
    for index in range(len(records) - 1, -1, -1):
        r = records[index]
        full = _full_text(tokenizer, r)
        if best is not None and len(full) <= best[0]:
            continue
        if text.startswith(full):
            best = (len(full), index, len(r.sampled))
            continue
        if not text.startswith(_decode(tokenizer, r.context)):
            continue
        for kept in range(len(r.sampled) - 1, -1, -1):
            prefix = _decode(tokenizer, r.context + r.sampled[:kept])
            if text.startswith(prefix):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index, kept)
                break
    if best is None:
        return None
    chars, index, kept = best
    how = "text" if kept == len(records[index].sampled) else "partial"
    return _extend(records, index, kept, _encode(tokenizer, text[chars:]), how)


def _match_ids(records: list[Record], ids: list[int]) -> Context | None:
    best: tuple[int, int, int] | None = None
    for index, r in enumerate(records):
        full = r.context + r.sampled
        if len(ids) < len(r.context) or ids[: len(r.context)] != r.context:
            continue
        kept = 0
        while kept < len(r.sampled) and len(r.context) + kept < len(ids):
            if ids[len(r.context) + kept] != full[len(r.context) + kept]:
                break
            kept += 1
        if best is None or len(r.context) + kept > best[0]:
            best = (len(r.context) + kept, index, kept)
    if best is None:
        return None
    length, index, kept = best
    how = "ids" if kept == len(records[index].sampled) else "partial"
    return _extend(records, index, kept, ids[length:], how)


def _match_messages(
    records: list[Record], messages: list[dict[str, Any]], renderer: Any
) -> Context | None:
    """The latest chat record whose messages + reply start ``messages``: its ids exactly,
    then the template's delta of the messages after them."""
    for index in range(len(records) - 1, -1, -1):
        r = records[index]
        if r.messages is None or r.reply is None or not r.sampled:
            continue
        head = [*r.messages, r.reply]
        if len(messages) <= len(head) or not all(
            same_message(a, b) for a, b in zip(head, messages)
        ):
            continue
        try:
            delta = renderer.delta_ids(messages[len(head) :], r.sampled[-1])
        except ValueError:  # a template that re-renders earlier messages: match as text
            return None
        return _extend(records, index, len(r.sampled), delta, "messages")
    return None


def build_context(
    tokenizer: Any,
    session: Session,
    endpoint: str,
    body: dict[str, Any],
    renderer: Any = None,
) -> tuple[Context, list[dict[str, Any]] | None]:
    """The ids of a request's prompt (the module docstring's three steps) and, for chat,
    its normalized messages. Raises :class:`RequestRefused` for a malformed body."""
    records = session.records
    messages = None
    if endpoint == "chat":
        messages = normalize_messages(body.get("messages"))
        if renderer is not None and (found := _match_messages(records, messages, renderer)):
            return found, messages
        try:
            text = tokenizer.apply_chat_template(
                messages,
                tools=body.get("tools") or None,
                tokenize=False,
                add_generation_prompt=True,
            )
        except Exception as exc:  # the template's own error about these messages
            raise RequestRefused(
                400, f"the chat template cannot render these messages: {exc}", "bad_messages"
            ) from exc
        ids = None
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            text, ids = prompt, None
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt)
        ):
            text, ids = None, [int(i) for i in prompt]
            vocab = len(tokenizer)
            if any(i < 0 or i >= vocab for i in ids):
                raise RequestRefused(400, f"prompt token ids must be in [0, {vocab})", "bad_prompt")
        else:
            raise RequestRefused(
                400, "'prompt' must be one string or one list of token ids", "bad_prompt"
            )
    found = _match_ids(records, ids) if ids is not None else _match_text(tokenizer, records, text)
    if found is not None:
        return found, messages
    if ids is None:
        ids = _encode(tokenizer, text)
    if not ids:
        raise RequestRefused(400, "the prompt is empty", "bad_prompt")
    return Context(ids, [0] * len(ids), [0.0] * len(ids), len(ids), None, "new"), messages


# ---------------------------------------------------------------------------- responses
def _token_texts(tokenizer: Any, ids: list[int]) -> list[str]:
    """The text each id adds to the decoded (special tokens skipped) text before it."""
    texts, before = [], ""
    for i in range(len(ids)):
        now = _decode(tokenizer, ids[: i + 1], skip_special=True)
        texts.append(now[len(before) :] if now.startswith(before) else "")
        before = now
    return texts


def _chat_logprobs(tokenizer: Any, record: Record) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": _decode(tokenizer, [i]),
                "logprob": lp,
                "bytes": list(_decode(tokenizer, [i]).encode()),
                "top_logprobs": [],
            }
            for i, lp in zip(record.sampled, record.log_probs)
        ]
    }


def _completion_logprobs(tokenizer: Any, record: Record) -> dict[str, Any]:
    tokens = [_decode(tokenizer, [i]) for i in record.sampled]
    offsets, at = [], 0
    for piece in _token_texts(tokenizer, record.sampled):
        offsets.append(at)
        at += len(piece)
    return {
        "tokens": tokens,
        "token_logprobs": list(record.log_probs),
        "top_logprobs": [{} for _ in tokens],
        "text_offset": offsets,
    }


def _usage(record: Record) -> dict[str, int]:
    return {
        "prompt_tokens": len(record.context),
        "completion_tokens": len(record.sampled),
        "total_tokens": len(record.context) + len(record.sampled),
    }


def response_body(
    tokenizer: Any, endpoint: str, record: Record, body: dict[str, Any], logprobs: bool
) -> dict[str, Any]:
    """The OpenAI response object of ``record`` (non-streaming)."""
    model = str(body.get("model") or "policy")
    created = int(time.time())
    if endpoint == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": dict(record.reply or {"role": "assistant", "content": record.text}),
            "finish_reason": record.finish_reason,
            "logprobs": _chat_logprobs(tokenizer, record) if logprobs else None,
        }
        out = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": _usage(record),
        }
    else:
        choice = {
            "index": 0,
            "text": record.text,
            "finish_reason": record.finish_reason,
            "logprobs": _completion_logprobs(tokenizer, record) if logprobs else None,
        }
        out = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": _usage(record),
        }
    if body.get("return_token_ids"):
        out["prompt_token_ids"] = list(record.context)
        choice["token_ids"] = list(record.sampled)
    return out


def stream_events(
    tokenizer: Any, endpoint: str, record: Record, body: dict[str, Any], logprobs: bool
) -> Iterator[str]:
    """The server-sent events of a ``stream=true`` response: one chunk per token of the
    returned text, the finish reason, the usage when ``stream_options.include_usage``."""
    full = response_body(tokenizer, endpoint, record, body, logprobs)
    base = {"id": full["id"], "created": full["created"], "model": full["model"]}
    pieces = _token_texts(tokenizer, record.sampled)
    # only the returned text streams (a stop string is cut from it)
    shown, left = [], len(record.text)
    for piece in pieces:
        shown.append(piece[: max(left, 0)])
        left -= len(piece)
    per_token = full["choices"][0]["logprobs"]

    def event(payload: dict[str, Any]) -> str:
        return f"data: {json.dumps(payload)}\n\n"

    if endpoint == "chat":
        kind = "chat.completion.chunk"
        first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        yield event({**base, "object": kind, "choices": [first]})
        for i, piece in enumerate(shown):
            choice: dict[str, Any] = {
                "index": 0,
                "delta": {"content": piece},
                "finish_reason": None,
            }
            if per_token is not None:
                choice["logprobs"] = {"content": [per_token["content"][i]]}
            if piece or per_token is not None:
                yield event({**base, "object": kind, "choices": [choice]})
        last: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": record.finish_reason}
        calls = (record.reply or {}).get("tool_calls")
        if calls:
            last["delta"] = {"tool_calls": [{"index": i, **call} for i, call in enumerate(calls)]}
        yield event({**base, "object": kind, "choices": [last]})
    else:
        kind = "text_completion"
        for i, piece in enumerate(shown):
            choice = {"index": 0, "text": piece, "finish_reason": None, "logprobs": None}
            if per_token is not None:
                choice["logprobs"] = {
                    key: per_token[key][i : i + 1]
                    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")
                }
            yield event({**base, "object": kind, "choices": [choice]})
        last = {"index": 0, "text": "", "finish_reason": record.finish_reason, "logprobs": None}
        yield event({**base, "object": kind, "choices": [last]})
    options = body.get("stream_options") or {}
    if isinstance(options, dict) and options.get("include_usage"):
        yield event({**base, "object": kind, "choices": [], "usage": full["usage"]})
    yield "data: [DONE]\n\n"


# ---------------------------------------------------------------------------- the server
class OpenAIEndpoint:
    """The HTTP endpoint and its keys (see the module docstring).

    Args:
        tokenizer: renders responses (the rollout thread tokenizes requests).
        host: the address to bind; only the loopback makes sense (agents run here).
        max_requests: requests one rollout may make; more are refused with 429.
    """

    def __init__(self, tokenizer: Any, *, host: str = "127.0.0.1", max_requests: int = 64):
        if max_requests < 1:
            raise ValueError(f"max_requests={max_requests} must be >= 1")
        self.tokenizer = tokenizer
        self.host = host
        self.max_requests = max_requests
        self.counters: Counter[str] = Counter()  # server-wide, since start
        self._lock = threading.Lock()
        self._open: dict[str, Session] = {}
        self._ended: set[str] = set()
        self._queue: queue.Queue[PendingRequest | None] = queue.Queue()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.port: int | None = None

    # ------------------------------------------------------------------ lifecycle
    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the OpenAI endpoint is not running; call start() first")
        return f"http://{self.host}:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout_s: float = 30.0) -> str:
        """Bind a free port, serve in a daemon thread, return the base URL (``.../v1``)."""
        if self.running:
            return self.base_url
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self._socket = sock
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app(),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
            timeout_keep_alive=30,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [sock]},
            daemon=True,
            name=f"verl-openai-endpoint-{self.port}",
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"the OpenAI endpoint on {self.host}:{self.port} did not start within "
                    f"{timeout_s:g} s"
                )
            time.sleep(0.01)
        logger.info("OpenAI-compatible rollout endpoint at %s", self.base_url)
        return self.base_url

    def stop(self) -> None:
        """Refuse whatever is queued, stop the server and join its thread."""
        with self._lock:
            for session in self._open.values():
                session.open = False
                self._ended.add(session.key)
            self._open.clear()
        self.refuse_queued()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(STOP_TIMEOUT_S)
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = None

    # ------------------------------------------------------------------ sessions
    def open_session(self, row: int) -> Session:
        """A new rollout with a fresh random key."""
        session = Session(key=f"verl-{secrets.token_urlsafe(24)}", row=row)
        with self._lock:
            self._open[session.key] = session
        return session

    def close_session(self, session: Session) -> None:
        """End a rollout: later requests with its key are refused with 403."""
        with self._lock:
            session.open = False
            self._open.pop(session.key, None)
            self._ended.add(session.key)

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counters[key] += n

    def _submit(self, key: str | None, endpoint: str, body: dict[str, Any]) -> PendingRequest:
        with self._lock:
            self.counters["requests"] += 1
            session = self._open.get(key) if key else None
            if session is None:
                if key in self._ended:
                    self.counters["after_end"] += 1
                    raise RequestRefused(
                        403,
                        "this rollout has ended; its key no longer accepts requests",
                        "rollout_ended",
                        "permission_error",
                    )
                self.counters["unauthorized"] += 1
                raise RequestRefused(
                    401,
                    "invalid API key: use the key given to this rollout's agent",
                    "invalid_api_key",
                    "authentication_error",
                )
            pending = PendingRequest(session, endpoint, body)
            self._queue.put(pending)
            return pending

    def take(self, wait_s: float, settle_s: float, want: int) -> list[PendingRequest]:
        """Queued requests: waits up to ``wait_s`` for one, then up to ``settle_s`` more
        until requests from ``want`` distinct rollouts are in, then takes the rest."""
        items: list[PendingRequest] = []
        try:
            first = self._queue.get(timeout=wait_s)
        except queue.Empty:
            return items
        if first is not None:
            items.append(first)
        deadline = time.monotonic() + settle_s
        while len({id(p.session) for p in items}) < want:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                item = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if item is not None:
                items.append(item)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                items.append(item)
        return items

    def wake(self) -> None:
        """Make a waiting :meth:`take` return now (an agent finished)."""
        self._queue.put(None)

    def refuse_queued(self) -> int:
        """Refuse every queued request (403: its rollout ended); returns how many."""
        refused = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return refused
            if item is not None:
                item.session.refused += 1
                self._count("after_end")
                item.refuse(
                    RequestRefused(
                        403, "this rollout has ended", "rollout_ended", "permission_error"
                    )
                )
                refused += 1

    # ------------------------------------------------------------------ ASGI app
    def _app(self) -> Any:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse, StreamingResponse

        app = FastAPI(title="verl rollout endpoint", docs_url=None, redoc_url=None)
        tokenizer = self.tokenizer

        def error(exc: RequestRefused) -> JSONResponse:
            return JSONResponse(exc.body(), status_code=exc.status)

        async def handle(request: Request, endpoint: str) -> Any:
            auth = request.headers.get("authorization", "")
            key = auth[7:].strip() if auth.lower().startswith("bearer ") else None
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                body = None
            try:
                if not isinstance(body, dict):
                    raise RequestRefused(400, "the request body must be a JSON object", "bad_body")
                pending = self._submit(key, endpoint, body)
                record, logprobs = await asyncio.wrap_future(pending.future)
            except RequestRefused as exc:
                return error(exc)
            if body.get("stream"):
                return StreamingResponse(
                    stream_events(tokenizer, endpoint, record, body, logprobs),
                    media_type="text/event-stream",
                )
            return JSONResponse(response_body(tokenizer, endpoint, record, body, logprobs))

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            return await handle(request, "chat")

        @app.post("/v1/completions")
        async def completions(request: Request) -> Any:
            return await handle(request, "completions")

        @app.get("/v1/models")
        async def models() -> Any:
            return {
                "object": "list",
                "data": [{"id": "policy", "object": "model", "created": 0, "owned_by": "verl"}],
            }

        return app
