"""Tool calls in model text, and the token ids of the messages appended after them.

**Parsing.** A call is a JSON object between ``<tool_call>`` and ``</tool_call>`` (the
Qwen / Hermes convention): ``<tool_call>{"name": "calculator", "arguments": {"expression":
"12*34"}}</tool_call>``. ``arguments`` may also be a JSON string holding the object. A block
that is not such an object is still returned, with the reason in ``error``, so the model
gets told what was wrong with it and the failure is counted. Parsing is bounded whatever the
model writes: a block longer than :data:`MAX_CALL_CHARS` or nesting brackets deeper than
:data:`MAX_CALL_DEPTH` (found by one linear scan before ``json.loads``, whose recursion
would otherwise raise ``RecursionError``) is refused, and blocks after the first
:data:`MAX_CALLS_PER_TURN` of a turn are refused together.

**Deltas.** Earlier turns are never re-tokenized: the ids appended after a model turn are
the chat template's rendering of the new messages as a *delta*,
``render(base + [assistant, tool...], add_generation_prompt=True)`` minus
``render(base + [assistant])``, checked to be a pure suffix, where ``base`` is a fixed
stand-in conversation (templates render a message independently of what came long before
it). When the model stopped on ``</tool_call>`` rather than its end-of-turn token, the
template's end of the assistant turn (``<|im_end|>\\n`` for ChatML) comes first, so the
delta continues the model's own ids exactly the way the template would have written them.

**Tool and environment text is plain text.** Only the template's own delimiters become
special tokens: the delta is rendered with a placeholder for each message's content, the
rendering is split at the tokenizer's special tokens (each one id), and the text between
them, contents put back, is encoded with ``split_special_tokens=True``. A tool result
holding ``<|im_end|>\\n<|im_start|>assistant`` is then those characters' ordinary ids, not
a turn boundary the model never wrote. Content without special-token text gets exactly the
ids of encoding the whole rendering.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "TOOL_CALL_END",
    "TOOL_CALL_START",
    "ChatDeltaRenderer",
    "ToolCall",
    "parse_tool_calls",
]

# Bounds on parsing model text (a turn is at most max_response_length tokens, but a token
# can be many characters): longer blocks, deeper nesting and further blocks are refused.
MAX_CALL_CHARS = 64 * 1024
MAX_CALL_DEPTH = 64
MAX_CALLS_PER_TURN = 64
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_MARK = "\u2063VERL_ASSISTANT_TEXT\u2063"
_CONTENT_MARK = "\u2063VERL_CONTENT_{}\u2063"
_CONTENT_MARK_RE = re.compile("\u2063VERL_CONTENT_([0-9]+)\u2063")


@dataclass
class ToolCall:
    """One parsed call; ``error`` is set (and ``name`` may be empty) when it is malformed."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def json_depth(text: str, limit: int) -> int:
    """The bracket nesting depth of JSON ``text`` (brackets inside strings do not count),
    in one pass; once it passes ``limit`` the scan stops and returns ``limit + 1``."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return limit + 1
        elif char in "]}":
            depth -= 1
    return deepest


def _load_json(text: str, what: str) -> tuple[Any, str | None]:
    """``json.loads(text)`` within the bounds, or ``(None, why it was refused)``."""
    if len(text) > MAX_CALL_CHARS:
        return None, f"{what} is longer than {MAX_CALL_CHARS} characters"
    if json_depth(text, MAX_CALL_DEPTH) > MAX_CALL_DEPTH:
        return None, f"{what} nests brackets deeper than {MAX_CALL_DEPTH} levels"
    try:
        return json.loads(text), None
    except json.JSONDecodeError as exc:
        return None, f"{what} is not valid JSON ({exc.msg})"
    except (RecursionError, ValueError) as exc:  # not expected within the bounds; still bounded
        return None, f"{what} could not be read as JSON ({type(exc).__name__})"


def _parse_one(body: str) -> ToolCall:
    obj, error = _load_json(body.strip(), "the tool call")
    if error is not None:
        return ToolCall("", error=error)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall("", error='a tool call must be {"name": ..., "arguments": {...}}')
    args = obj.get("arguments", {})
    if isinstance(args, str):
        args, error = _load_json(args, "the arguments string") if args.strip() else ({}, None)
        if error is not None:
            return ToolCall(obj["name"], error=error)
    if not isinstance(args, dict):
        return ToolCall(obj["name"], error="the arguments of a tool call must be an object")
    return ToolCall(obj["name"], args)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every complete ``<tool_call>...</tool_call>`` block of ``text``, in order; the blocks
    after the first :data:`MAX_CALLS_PER_TURN` become one refused call. Never raises, for
    any ``text``; time and memory are linear in its length."""
    calls: list[ToolCall] = []
    pos = 0
    # str.find, not a regex: a lazy regex rescans the rest of the text from every
    # unclosed start tag (quadratic in "<tool_call>" * n); here each character is read once.
    while (start := text.find(TOOL_CALL_START, pos)) >= 0:
        body_start = start + len(TOOL_CALL_START)
        end = text.find(TOOL_CALL_END, body_start)
        if end < 0:  # no later block can be complete either
            break
        if len(calls) == MAX_CALLS_PER_TURN:
            calls.append(ToolCall("", error=f"more than {MAX_CALLS_PER_TURN} tool calls in a turn"))
            break
        calls.append(_parse_one(text[body_start:end]))
        pos = end + len(TOOL_CALL_END)
    return calls


def _suffix(longer: str, shorter: str, what: str) -> str:
    if not longer.startswith(shorter):
        raise ValueError(
            f"the chat template does not render {what} as an append-only suffix, so the "
            "ids of earlier turns could not be kept exactly; multi-turn rollouts need a "
            f"template that renders each message independently (ChatML, Qwen, Llama 3). "
            f"Prefix rendering: {shorter[-80:]!r}; with the new messages: {longer[-120:]!r}"
        )
    return longer[len(shorter) :]


class ChatDeltaRenderer:
    """Token ids of messages appended to a conversation, rendered by the chat template.

    Args:
        tokenizer: a HF tokenizer with a chat template.
        eos_token_ids: the model's end-of-turn ids; a turn that ended with one of them
            already holds the start of the template's turn closer.
    """

    def __init__(self, tokenizer: Any, eos_token_ids: list[int]) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "multi-turn rollouts render tool results with the chat template, and the "
                "tokenizer has none; use an instruct model's tokenizer"
            )
        self.tokenizer = tokenizer
        self.eos_token_ids = set(eos_token_ids)
        self._base = [{"role": "user", "content": "Hi"}]
        self._with_assistant = [*self._base, {"role": "assistant", "content": _MARK}]
        gen_prompt = self._render(self._base, add_generation_prompt=True)
        self._assistant_text = self._render(self._with_assistant, add_generation_prompt=False)
        body = _suffix(self._assistant_text, gen_prompt, "an assistant message")
        if _MARK not in body:
            raise ValueError("the chat template drops the assistant message's content")
        # What the template writes after an assistant message, e.g. "<|im_end|>\n".
        self.turn_closer = body[body.index(_MARK) + len(_MARK) :]
        # What is left of the closer after each end-of-turn id, when the closer starts with
        # that token's text (ChatML: "<|im_end|>" leaves "\n"; another eos leaves it all).
        self._closer_after: dict[int, str] = {}
        for token in self.eos_token_ids:
            text = tokenizer.decode([token])
            if text and self.turn_closer.startswith(text):
                self._closer_after[token] = self.turn_closer[len(text) :]
        # The template's delimiters: every special token, longest first ("<|im_end|>" must
        # not be read as a shorter token that starts it).
        specials = set(getattr(tokenizer, "all_special_tokens", None) or [])
        for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
            if getattr(added, "special", False):
                specials.add(str(added))
        specials = sorted((t for t in specials if t), key=len, reverse=True)
        self._special_ids = {t: tokenizer.convert_tokens_to_ids(t) for t in specials}
        self._special_re = (
            re.compile("(" + "|".join(re.escape(t) for t in specials) + ")") if specials else None
        )

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        """Ids of template text: special-token text becomes the special tokens."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_plain(self, text: str) -> list[int]:
        """Ids of content text: special-token text stays ordinary text."""
        return list(
            self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        )

    def delta_text(self, messages: list[dict[str, Any]], last_token: int | None) -> str:
        """The text appended after a model turn whose last id is ``last_token``: the rest of
        the turn's closer, then ``messages`` (tool results or a user turn), then the next
        generation prompt."""
        full = self._render([*self._with_assistant, *messages], add_generation_prompt=True)
        closer = self._closer_after.get(last_token, self.turn_closer)
        return closer + _suffix(full, self._assistant_text, "appended (tool or user) messages")

    def delta_ids(self, messages: list[dict[str, Any]], last_token: int | None) -> list[int]:
        """:meth:`delta_text` as token ids: the template's special tokens are special, the
        messages' contents are plain text (module docstring)."""
        marks = [_CONTENT_MARK.format(i) for i in range(len(messages))]
        masked = [{**m, "content": mark} for m, mark in zip(messages, marks)]
        text = self.delta_text(masked, last_token)
        positions = [text.find(mark) for mark in marks]
        if any(p < 0 or text.count(mark) != 1 for p, mark in zip(positions, marks)) or (
            positions != sorted(positions)
        ):
            raise ValueError(
                "the chat template does not write each message's content once and verbatim, "
                "so tool results could not be kept apart from its delimiters; multi-turn "
                f"rollouts need a template that does (ChatML, Qwen, Llama 3). Rendering: "
                f"{text[-200:]!r}"
            )
        contents = [str(m.get("content") or "") for m in messages]
        pieces = self._special_re.split(text) if self._special_re is not None else [text]
        ids: list[int] = []
        for i, piece in enumerate(pieces):
            if i % 2:  # a delimiter of the template
                ids.append(self._special_ids[piece])
            elif piece:  # template text and placeholders: put the contents back in one pass
                parts = _CONTENT_MARK_RE.split(piece)
                parts[1::2] = [contents[int(k)] for k in parts[1::2]]
                ids += self.encode_plain("".join(parts))
        return ids
