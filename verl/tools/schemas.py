"""Upstream verl's import path of the tool schema and response types; see
:mod:`verl.tools.upstream_adapter`."""

from verl.tools.upstream_adapter import OpenAIFunctionToolSchema, ToolResponse

__all__ = ["OpenAIFunctionToolSchema", "ToolResponse"]
