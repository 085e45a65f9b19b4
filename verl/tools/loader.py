"""Loading the tools of ``multi_turn.tools``: the built-ins, Python files, import paths and
upstream verl's tool YAML.

Contract: :func:`load_tool` turns one ``{path, name}`` item into a :class:`~verl.tools.base.Tool`
(``path: builtin`` for :data:`BUILTIN_TOOLS`, ``module:qualname``, or ``file.py``);
:func:`load_tools` does it for every item in order, reading ``path: tools.yaml`` items with
:mod:`verl.tools.upstream_adapter`; :func:`tool_schemas` gives their OpenAI function schemas
(what the prompts' chat template lists). Errors name the file, module or tool and the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from verl.tools.base import Tool, tool_from_function
from verl.tools.calculator import calculator_tool
from verl.utils.file_import import load_callable
from verl.utils.import_path import is_import_path, resolve_import_path

__all__ = ["BUILTIN_TOOLS", "load_tool", "load_tools", "tool_schemas"]


def _python_tool() -> Tool:
    from verl.tools.python_executor import python_tool

    return python_tool()


BUILTIN_TOOLS: dict[str, Callable[[], Tool]] = {
    "calculator": calculator_tool,
    "python": _python_tool,
}


def load_tool(path: str, name: str) -> Tool:
    """The tool ``name`` of the Python file ``path`` (a function, or a ready :class:`Tool`).

    ``path`` may be ``builtin`` for the tools shipped with verl (``calculator``,
    ``python``), or an import path ``module:qualname`` (what
    ``ToolConfig.from_function`` writes for a function given in Python); ``name`` is then
    the tool's name. Raises ``FileNotFoundError``, ``ImportError`` or ``AttributeError``
    naming the file or module and what it defines.
    """
    if path == "builtin":
        if name not in BUILTIN_TOOLS:
            raise AttributeError(
                f"no built-in tool {name!r}; built-in tools: {sorted(BUILTIN_TOOLS)}"
            )
        return BUILTIN_TOOLS[name]()
    if is_import_path(path):
        obj = resolve_import_path(path)
        if not callable(obj):
            raise TypeError(f"tool {path!r} is a {type(obj).__name__}, not a callable")
        return obj if isinstance(obj, Tool) else tool_from_function(obj, name)
    _, obj = load_callable(
        path, name, "tool file", "set multi_turn.tools[].path to an existing .py file, or 'builtin'"
    )
    return obj if isinstance(obj, Tool) else tool_from_function(obj, name)


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
