"""OpenAI response bodies and server-sent events of the endpoint's answered requests.

Contract: :func:`response_body` renders a :class:`~verl.rollout.openai_records.Record` as
OpenAI's ``chat.completion`` or ``text_completion`` object (with per-token ``logprobs``
when asked, no alternatives: ``top_logprobs`` empty; ``prompt_token_ids`` / ``token_ids`` with
``return_token_ids``); :func:`stream_events` gives the same response as ``stream=true``
server-sent events: one chunk per token of the returned text (a stop string cut from the
text is not streamed), the finish reason, the usage when
``stream_options.include_usage``, then ``data: [DONE]``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from verl.rollout.openai_records import Record
from verl.rollout.openai_stitching import decode_ids

__all__ = ["response_body", "stream_events"]


def _token_texts(tokenizer: Any, ids: list[int]) -> list[str]:
    """The text each id adds to the decoded (special tokens skipped) text before it."""
    texts, before = [], ""
    for i in range(len(ids)):
        now = decode_ids(tokenizer, ids[: i + 1], skip_special=True)
        texts.append(now[len(before) :] if now.startswith(before) else "")
        before = now
    return texts


def _chat_logprobs(tokenizer: Any, record: Record) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": decode_ids(tokenizer, [i]),
                "logprob": lp,
                "bytes": list(decode_ids(tokenizer, [i]).encode()),
                "top_logprobs": [],
            }
            for i, lp in zip(record.sampled, record.log_probs)
        ]
    }


def _completion_logprobs(tokenizer: Any, record: Record) -> dict[str, Any]:
    tokens = [decode_ids(tokenizer, [i]) for i in record.sampled]
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
