"""Upstream verl's import path of ``BaseTool``, so a tool class written against upstream
imports unchanged; see :mod:`verl.tools.upstream_adapter`."""

from verl.tools.upstream_adapter import BaseTool, OpenAIFunctionToolSchema, ToolResponse

__all__ = ["BaseTool", "OpenAIFunctionToolSchema", "ToolResponse"]
