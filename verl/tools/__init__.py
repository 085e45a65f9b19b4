"""Tools for multi-turn rollouts: :class:`Tool`, loading from files, and the built-ins.

Built-in tools (``multi_turn.tools: [{path: builtin, name: calculator}]``): ``calculator``
(exact arithmetic, :mod:`verl.tools.calculator`) and ``python`` (sandboxed code,
:mod:`verl.tools.python_executor`). Loading is :mod:`verl.tools.loader`; upstream verl's
tool YAML (``path: tools.yaml``) is read by :mod:`verl.tools.upstream_adapter`. See
``docs/multiturn.md``. Modules of this package import from the defining module, never
from this ``__init__``.
"""

from __future__ import annotations

from verl.tools.base import Tool, tool_from_function
from verl.tools.loader import BUILTIN_TOOLS, load_tool, load_tools, tool_schemas

__all__ = ["BUILTIN_TOOLS", "Tool", "load_tool", "load_tools", "tool_from_function", "tool_schemas"]
