"""Tools the model can call in a multi-turn rollout: a Python function plus its JSON schema.

A tool is a :class:`Tool`: a ``name``, an OpenAI function-calling ``schema``
(``{"type": "function", "function": {"name", "description", "parameters"}}``) and a
function called with the call's ``arguments`` as keyword arguments, returning text.

:func:`tool_from_function` builds one from a plain function: the schema is the function's
``schema`` attribute when it has one, else it is derived from its type hints and its
Google-style docstring (``transformers.utils.get_json_schema``).
:func:`verl.tools.loader.load_tool` does the same for ``name`` in a Python file
(``multi_turn.tools: [{path, name}]`` in the config), importing the file as a fresh
module, like custom reward functions, or for an import path ``path: module:qualname``.

The agent loop (``verl.rollout.agent_loop``) runs tools with a timeout and turns anything
that goes wrong (an exception, ``SystemExit`` and ``KeyboardInterrupt`` included, a
timeout, a result that is not text) into an error message for the model; tools need not
guard themselves. A tool that starts a process or waits on something should stop by
:func:`time_left` (the seconds until its call's deadline): a thread cannot be killed, so a
call that never returns holds one of the loop's tool threads for good (the built-in
``python`` tool bounds its sandbox by it).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Tool", "call_deadline", "time_left", "tool_from_function"]

_CALL = threading.local()


def time_left() -> float | None:
    """Seconds until the deadline of the tool call running in this thread (may be <= 0),
    or None outside a call the agent loop made."""
    deadline = getattr(_CALL, "deadline", None)
    return None if deadline is None else deadline - time.monotonic()


@contextlib.contextmanager
def call_deadline(deadline: float) -> Iterator[None]:
    """Within the block, :func:`time_left` counts down to ``deadline`` (``time.monotonic``)."""
    before = getattr(_CALL, "deadline", None)
    _CALL.deadline = deadline
    try:
        yield
    finally:
        _CALL.deadline = before


@dataclass(frozen=True)
class Tool:
    """A callable tool: ``fn(**arguments) -> str`` described by ``schema``."""

    name: str
    schema: dict[str, Any]
    fn: Callable[..., Any]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"tool name={self.name!r} must be a non-empty string")
        function = self.schema.get("function") if isinstance(self.schema, dict) else None
        if self.schema.get("type") != "function" or not isinstance(function, dict):
            raise ValueError(
                f"tool {self.name!r}: schema must be {{'type': 'function', 'function': "
                f"{{'name', 'description', 'parameters'}}}} (OpenAI style), got {self.schema!r}"
            )
        if function.get("name") != self.name:
            raise ValueError(
                f"tool {self.name!r}: schema names the function {function.get('name')!r}; "
                "the two names must agree (the model calls the schema's name)"
            )

    def __call__(self, **arguments: Any) -> Any:
        return self.fn(**arguments)


def tool_from_function(fn: Callable[..., Any], name: str | None = None) -> Tool:
    """A :class:`Tool` of ``fn``; ``name`` defaults to ``fn.__name__``.

    The schema is ``fn.schema`` when set (an OpenAI function schema, dict), else derived
    from the type hints and docstring; a function whose docstring does not describe every
    argument raises ``ValueError`` naming the function and the fix.
    """
    schema = getattr(fn, "schema", None)
    if schema is None:
        from transformers.utils import get_json_schema

        try:
            schema = get_json_schema(fn)
        except Exception as exc:  # transformers raises its own DocstringParsingException
            raise ValueError(
                f"cannot derive a JSON schema for tool {getattr(fn, '__name__', fn)!r}: {exc}. "
                "Give every argument a type hint and an 'Args:' docstring line, or set "
                "fn.schema to an OpenAI function schema"
            ) from exc
        schema["function"].pop("return", None)
    name = name or schema.get("function", {}).get("name") or fn.__name__
    return Tool(name=name, schema=schema, fn=fn)
