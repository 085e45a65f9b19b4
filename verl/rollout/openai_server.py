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
each into token ids (:func:`~verl.rollout.openai_stitching.build_context`), runs one
batched engine call per stop-string set and answers with
:meth:`~verl.rollout.openai_records.PendingRequest.answer`. All session state is touched
by that one thread; the handlers only read whether a key is open, under a lock.

**Token in, token out.** A request's prompt becomes ids without re-tokenizing anything the
model sampled earlier in the same rollout (:mod:`verl.rollout.openai_stitching`); each
answered request is a :class:`~verl.rollout.openai_records.Record` of its rollout's
:class:`~verl.rollout.openai_records.Session`; responses are rendered by
:mod:`verl.rollout.openai_responses`.

**Sampling.** Every request samples with the rollout's settings (temperature, top-p,
top-k), whatever the request says, so that the recorded log-probs are those of the policy
the trainer recomputes; ``max_tokens`` / ``max_completion_tokens`` and ``stop`` are
honoured (``stop`` strings are cut from the returned text, as OpenAI does; the sampled ids
keep them). ``n`` must be 1. ``logprobs`` returns each sampled token's log-prob; the
engine reports no alternatives, so chat's ``top_logprobs`` > 0 is refused and a
completion's ``top_logprobs`` dicts are empty (``logprobs=k`` counted). With
``"return_token_ids": true`` a response also carries ``prompt_token_ids`` and
``token_ids`` (as vLLM's server does). ``stream=true`` answers as server-sent events once
the response is generated (the engine produces a response in one call).
"""

# No ``from __future__ import annotations``: FastAPI reads the handlers' annotations
# (``request: Request``, imported inside ``_app``) at definition time.
import asyncio
import json
import logging
import queue
import secrets
import socket
import threading
import time
from collections import Counter
from typing import Any

from verl.rollout.openai_records import PendingRequest, RequestRefused, Session
from verl.rollout.openai_responses import response_body, stream_events

logger = logging.getLogger(__name__)

__all__ = ["OpenAIEndpoint"]

#: How long :meth:`OpenAIEndpoint.stop` waits for the server thread.
STOP_TIMEOUT_S = 10.0


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
