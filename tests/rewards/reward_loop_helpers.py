"""Helpers of the reward-loop tests: a character tokenizer, generated batches, and a JSON
HTTP server on 127.0.0.1 in a thread (started and shut down by the test)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto


class CharTokenizer:
    """id = ord(character); 0 is padding."""

    eos_token_id = None
    pad_token_id = 0

    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(chr(i) for i in row if i) for row in rows]


def gen_batch(
    responses: list[str], truths: list[Any], questions: list[str] | None = None, width: int = 24
) -> DataProto:
    """A generated batch in the reward manager's contract (right-padded responses)."""
    size = len(responses)
    ids = torch.zeros((size, width), dtype=torch.long)
    mask = torch.zeros((size, width), dtype=torch.long)
    for i, text in enumerate(responses):
        codes = [ord(c) for c in text[:width]]
        ids[i, : len(codes)] = torch.tensor(codes, dtype=torch.long)
        mask[i, : len(codes)] = 1
    questions = questions or [f"question {i}" for i in range(size)]
    raw = np.empty(size, dtype=object)
    raw[:] = [[{"role": "user", "content": q}] for q in questions]
    return DataProto.from_dict(
        tensors={"responses": ids, "response_mask": mask},
        non_tensors={
            "data_source": np.array(["arithmetic"] * size, dtype=object),
            "ground_truth": np.array([str(t) for t in truths], dtype=object),
            "raw_prompt": raw,
        },
    )


class JsonServer:
    """``handler(path, body) -> (status, answer)`` served on 127.0.0.1 (an ephemeral port);
    ``answer`` is JSON-encoded unless it is ``bytes``. Counts requests and the most in
    flight at once; use as a context manager."""

    def __init__(self, handler: Callable[[str, Any], tuple[int, Any]]) -> None:
        self.handler = handler
        self.requests: list[tuple[float, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"null")
                with server._lock:
                    server.requests.append((time.monotonic(), body))
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    status, answer = server.handler(self.path, body)
                finally:
                    with server._lock:
                        server.in_flight -= 1
                data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            def log_message(self, *args: Any) -> None:
                return None

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> JsonServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=10)


def chat_reply(content: str) -> dict[str, Any]:
    """An OpenAI-compatible /chat/completions answer with ``content``."""
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}


def scripted_judge(path: str, body: Any) -> tuple[int, Any]:
    """A deterministic judge endpoint: correct when the reference is in the response."""
    if not path.endswith("/chat/completions"):
        return 404, {"error": "not found"}
    prompt = body["messages"][0]["content"]
    response = prompt.split("Response:\n", 1)[1].split("\n\nReference answer:", 1)[0]
    reference = prompt.split("Reference answer:\n", 1)[1].split("\n", 1)[0]
    if "MALFORMED" in response:
        return 200, chat_reply("I cannot decide.")
    verdict = "correct" if reference and reference in response else "incorrect"
    return 200, chat_reply(f"Reasoning...\nVERDICT: {verdict}")
