"""Tools for multi-turn rollouts: :class:`Tool`, loading from files, and the built-ins.

Built-in tools (``multi_turn.tools: [{path: builtin, name: calculator}]``): ``calculator``
(exact arithmetic, :mod:`verl.tools.calculator`) and ``python`` (sandboxed code,
:mod:`verl.tools.python_executor`). Upstream verl's tool YAML (``path: tools.yaml``) is read by
:mod:`verl.tools.upstream_adapter`. See ``docs/multiturn.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from verl.tools.base import Tool, load_tool, tool_from_function
from verl.tools.calculator import calculator_tool


def _python_tool() -> Tool:
    from verl.tools.python_executor import python_tool

    return python_tool()


BUILTIN_TOOLS: dict[str, Callable[[], Tool]] = {
    "calculator": calculator_tool,
    "python": _python_tool,
}


def load_tools(specs: Iterable[Any]) -> list[Tool]:
    """The tools of ``multi_turn.tools`` (items with ``path`` and ``name``), in order; a
    ``path`` ending in ``.yaml`` is upstream verl's tool config
    (:mod:`verl.tools.upstream_adapter`)."""
    from verl.tools.upstream_adapter import is_tool_config_file, load_upstream_tool

    return [
        load_upstream_tool(spec.path, spec.name)
        if is_tool_config_file(spec.path)
        else load_tool(spec.path, spec.name)
        for spec in specs
    ]


def tool_schemas(specs: Iterable[Any]) -> list[dict[str, Any]]:
    """The OpenAI function schemas of ``multi_turn.tools``, for the prompts' chat template."""
    return [tool.schema for tool in load_tools(specs)]


__all__ = ["BUILTIN_TOOLS", "Tool", "load_tool", "load_tools", "tool_from_function", "tool_schemas"]
