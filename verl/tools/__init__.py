"""Tools for multi-turn rollouts: :class:`Tool`, loading from files, and the built-ins.

Built-in tools (``multi_turn.tools: [{path: builtin, name: calculator}]``): ``calculator``
(exact arithmetic, :mod:`verl.tools.calculator`) and ``python`` (sandboxed code,
:mod:`verl.tools.python_executor`). See ``docs/multiturn.md``.
"""

from __future__ import annotations

from collections.abc import Callable

from verl.tools.base import Tool, load_tool, tool_from_function
from verl.tools.calculator import calculator_tool


def _python_tool() -> Tool:
    from verl.tools.python_executor import python_tool

    return python_tool()


BUILTIN_TOOLS: dict[str, Callable[[], Tool]] = {
    "calculator": calculator_tool,
    "python": _python_tool,
}

__all__ = ["BUILTIN_TOOLS", "Tool", "load_tool", "tool_from_function"]
