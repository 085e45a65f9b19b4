"""Tool calls in model text, and the token ids of the messages appended after them.

**Parsing.** A call is a JSON object between ``<tool_call>`` and ``</tool_call>`` (the
Qwen / Hermes convention): ``<tool_call>{"name": "calculator", "arguments": {"expression":
"12*34"}}</tool_call>``. ``arguments`` may also be a JSON string holding the object. A block
that is not such an object is still returned, with the reason in ``error``, so the model
gets told what was wrong with it.

**Deltas.** Earlier turns are never re-tokenized: the ids appended after a model turn are
the chat template's rendering of the new messages as a *delta*,
``render(base + [assistant, tool...], add_generation_prompt=True)`` minus
``render(base + [assistant])``, checked to be a pure suffix, where ``base`` is a fixed
stand-in conversation (templates render a message independently of what came long before
it). When the model stopped on ``</tool_call>`` rather than its end-of-turn token, the
template's end of the assistant turn (``<|im_end|>\\n`` for ChatML) comes first, so the
delta continues the model's own ids exactly the way the template would have written them.
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

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)" + re.escape(TOOL_CALL_END), re.DOTALL)
_MARK = "\u2063VERL_ASSISTANT_TEXT\u2063"


@dataclass
class ToolCall:
    """One parsed call; ``error`` is set (and ``name`` may be empty) when it is malformed."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def _parse_one(body: str) -> ToolCall:
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError as exc:
        return ToolCall("", error=f"the tool call is not valid JSON ({exc.msg})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall("", error='a tool call must be {"name": ..., "arguments": {...}}')
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return ToolCall(obj["name"], error="the arguments string is not valid JSON")
    if not isinstance(args, dict):
        return ToolCall(obj["name"], error="the arguments of a tool call must be an object")
    return ToolCall(obj["name"], args)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every complete ``<tool_call>...</tool_call>`` block of ``text``, in order."""
    return [_parse_one(m.group(1)) for m in _BLOCK.finditer(text)]


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

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def delta_text(self, messages: list[dict[str, Any]], last_token: int | None) -> str:
        """The text appended after a model turn whose last id is ``last_token``: the rest of
        the turn's closer, then ``messages`` (tool results or a user turn), then the next
        generation prompt."""
        full = self._render([*self._with_assistant, *messages], add_generation_prompt=True)
        closer = self._closer_after.get(last_token, self.turn_closer)
        return closer + _suffix(full, self._assistant_text, "appended (tool or user) messages")

    def delta_ids(self, messages: list[dict[str, Any]], last_token: int | None) -> list[int]:
        """:meth:`delta_text` as token ids (no special tokens added)."""
        return self.encode(self.delta_text(messages, last_token))
