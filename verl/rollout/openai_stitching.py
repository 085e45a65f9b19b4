"""Prefix stitching for the OpenAI-compatible endpoint: a request's prompt as token ids,
reusing the ids its rollout's earlier requests were given and sampled.

Contract: :func:`build_context` returns the :class:`Context` of a request (its ids, a flag
per id, 1 where the model sampled it earlier in this rollout, their log-probs, the chain's
first prompt length and the record it extends) and, for chat, its normalized messages;
it raises :class:`~verl.rollout.openai_records.RequestRefused` (400) for a malformed
body. Ids the model sampled are never re-tokenized:

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

Each :class:`~verl.rollout.openai_records.Record` keeps its context ids with a flag per id (1: sampled by the model in
this rollout) and the log-probs of the sampled ids, so the last request's record is the
whole trajectory: prompt, model tokens (flag 1) and the tokens the agent inserted (tool
results, user turns, template markup; flag 0).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from verl.rollout.openai_records import Record, RequestRefused, Session

__all__ = [
    "Context",
    "build_context",
    "decode_ids",
    "encode_text",
    "normalize_messages",
    "same_message",
]


def decode_ids(tokenizer: Any, ids: list[int], skip_special: bool = False) -> str:
    """``ids`` as text, exactly (no clean-up of tokenization spaces)."""
    return tokenizer.decode(
        ids, skip_special_tokens=skip_special, clean_up_tokenization_spaces=False
    )


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """The ids of ``text`` without special tokens (none for empty text)."""
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
    """The ids a request continues, with their flags, log-probs and policy versions (see
    :class:`Record`; ``versions`` None when a reused turn has none)."""

    ids: list[int]
    flags: list[int]
    log_probs: list[float]
    prompt_len: int
    parent: int | None
    stitch: str
    kept: int = 0
    versions: list[int] | None = None


def _extend(records: list[Record], parent: int, kept: int, rest: list[int], how: str) -> Context:
    r = records[parent]
    versions = None
    if r.context_versions is not None and r.versions is not None:
        versions = r.context_versions + r.versions[:kept] + [-1] * len(rest)
    return Context(
        ids=r.context + r.sampled[:kept] + rest,
        flags=r.flags + [1] * kept + [0] * len(rest),
        log_probs=r.context_log_probs + r.log_probs[:kept] + [0.0] * len(rest),
        prompt_len=r.prompt_len,
        parent=parent,
        stitch=how,
        kept=kept,
        versions=versions,
    )


def _full_text(tokenizer: Any, record: Record) -> str:
    if record._full_text is None:
        record._full_text = decode_ids(tokenizer, record.context + record.sampled)
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
        if not text.startswith(decode_ids(tokenizer, r.context)):
            continue
        for kept in range(len(r.sampled) - 1, -1, -1):
            prefix = decode_ids(tokenizer, r.context + r.sampled[:kept])
            if text.startswith(prefix):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index, kept)
                break
    if best is None:
        return None
    chars, index, kept = best
    how = "text" if kept == len(records[index].sampled) else "partial"
    return _extend(records, index, kept, encode_text(tokenizer, text[chars:]), how)


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
        ids = encode_text(tokenizer, text)
    if not ids:
        raise RequestRefused(400, "the prompt is empty", "bad_prompt")
    new = Context(
        ids, [0] * len(ids), [0.0] * len(ids), len(ids), None, "new", versions=[-1] * len(ids)
    )
    return new, messages
