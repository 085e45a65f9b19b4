"""Upstream verl's tool YAML (``multi_turn.tool_config_path``) read as native tools.

Upstream lists its tools in a YAML file::

    tools:
      - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
        config: {type: native}
        tool_schema:
          type: function
          function: {name: calc_gsm8k_reward, description: ..., parameters: {...}}

``actor_rollout_ref.rollout.multi_turn.tool_config_path=FILE`` becomes
``multi_turn.tools=[{path: FILE, name: <each tool_schema's function name>}]``
(``verl.compat.upstream``); :func:`load_upstream_tool` builds each entry's
:class:`~verl.tools.base.Tool`, whose schema is the entry's ``tool_schema``, when the
tools load: at start-up (the prompts list the tools), before any model loads, so a tool
that cannot run here stops the run there. What ``class_name`` names decides what runs:

- upstream's built-in tools with a meaning here run natively:
  ``verl.tools.gsm8k_tool.Gsm8kTool`` scores the ``answer`` argument with this project's
  GSM8K scorer against the row's ``ground_truth`` (its ``create_kwargs``, else the row's
  own) and answers ``Current parsed answer='...' reward=...`` as upstream's does;
  ``verl.tools.sandbox_fusion_tools.SandboxFusionTool`` (the code interpreter) runs the
  ``code`` argument in the built-in ``python`` tool's local sandbox
  (:mod:`verl.tools.python_executor`; ``config.default_timeout`` and
  ``config.memory_limit_mb`` bound it, no Sandbox Fusion server is called);
- upstream's search, MCP, geo3k and image tools are refused with the reason (they need a
  retrieval or MCP server, a scorer or multi-modal rollouts this project does not have);
- any other class (the user's own, importable from their code: ``PYTHONPATH``) is called
  through an adapter with upstream's ``BaseTool`` interface: ``cls(config, tool_schema)``,
  then per call, as upstream's agent loop does, ``create(create_kwargs=<the row's
  extra_info.tools_kwargs[name].create_kwargs>)`` -> ``instance_id``,
  ``execute(instance_id, parameters)`` -> ``(response, reward, metrics)`` and
  ``release(instance_id)``. The methods may be ``async`` (upstream's are) or plain.
  Upstream's ``verl.tools.base_tool.BaseTool`` and ``verl.tools.schemas`` import paths
  resolve here (:class:`BaseTool`, :class:`ToolResponse`, :class:`OpenAIFunctionToolSchema`),
  so such a class imports unchanged.

**Tool rewards are not used.** Upstream keeps ``execute``'s step reward in the rollout's
``tool_rewards`` extra field, which only a custom reward manager reads; here the response
is scored by its data source's scorer (or ``custom_reward_function``) alone, so a non-zero
tool reward is dropped, with one WARNING per tool saying so. ``calc_reward`` is called
only by the tool itself (as upstream's agent loop does). A response with images or video
is an error for the model (multi-modal rollouts are not implemented).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from uuid import uuid4

from verl.tools.base import Tool, time_left
from verl.tools.call_context import current_row

__all__ = [
    "BaseTool",
    "OpenAIFunctionToolSchema",
    "ToolResponse",
    "UpstreamToolError",
    "is_tool_config_file",
    "load_upstream_tool",
    "read_tool_config",
]

logger = logging.getLogger(__name__)

GSM8K_TOOL = "verl.tools.gsm8k_tool.Gsm8kTool"
SANDBOX_TOOL = "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
_NATIVE_MEANING = {
    GSM8K_TOOL: "this project's GSM8K scorer (flexible) on the answer",
    SANDBOX_TOOL: "the built-in python tool's local sandbox",
}
_SERVER = (
    "it queries a {what} server that a rollout here does not reach; write a tool function "
    "that calls your service (multi_turn.tools=[{{path: my_tools.py, name: search}}], "
    "docs/multiturn.md)"
)
REFUSED_CLASSES = {
    "verl.tools.search_tool.SearchTool": _SERVER.format(
        what="retrieval (config.retrieval_service_url)"
    ),
    "verl.tools.mcp_search_tool.MCPSearchTool": _SERVER.format(what="MCP"),
    "verl.tools.mcp_base_tool.MCPBaseTool": _SERVER.format(what="MCP"),
    "verl.tools.geo3k_tool.Geo3kTool": "it scores geometry3k answers, which no scorer here "
    "reads, on image prompts (multi-modal rollouts are not implemented)",
    "verl.tools.image_zoom_in_tool.ImageZoomInTool": "it returns images, and multi-modal "
    "rollouts are not implemented",
}


class UpstreamToolError(ValueError):
    """The tool YAML is malformed, or names a tool that cannot run here (with why)."""


# ---------------------------------------------------------------- upstream's interface
class _Attrs:
    """A mapping read by attribute (``schema.function.name``), as upstream's pydantic
    models are; :meth:`model_dump` gives the mapping back."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)

    def __getattr__(self, key: str) -> Any:
        try:
            value = self.__dict__["_data"][key]
        except KeyError:
            raise AttributeError(key) from None
        return _Attrs(value) if isinstance(value, Mapping) else value

    def model_dump(self, **_: Any) -> dict[str, Any]:
        return dict(self._data)


class OpenAIFunctionToolSchema(_Attrs):
    """Upstream's tool schema: ``{"type": "function", "function": {name, description,
    parameters}}``, read by attribute."""

    @classmethod
    def model_validate(cls, data: Mapping[str, Any]) -> OpenAIFunctionToolSchema:
        return cls(data)


class ToolResponse:
    """What upstream's ``execute`` returns as its first item: ``text`` (images and video
    are not supported here)."""

    def __init__(
        self, text: str | None = None, image: list | None = None, video: list | None = None
    ) -> None:
        self.text, self.image, self.video = text, image, video


class BaseTool:
    """Upstream's ``BaseTool`` with its default methods, for user classes written against it."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None) -> None:
        self.config = config
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        if self.tool_schema is None:
            raise UpstreamToolError(f"{type(self).__name__}: no tool schema")
        self.name = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema | None:
        return getattr(self, "tool_schema", None)

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
        return (instance_id or str(uuid4())), ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict]:
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        return None


# ---------------------------------------------------------------- the YAML
def is_tool_config_file(path: str) -> bool:
    """Whether a ``multi_turn.tools[].path`` names upstream's tool YAML."""
    return str(path).endswith((".yaml", ".yml"))


def read_tool_config(path: str | Path) -> list[dict[str, Any]]:
    """The entries of upstream's tool YAML: ``{class_name, config, tool_schema}`` each,
    ``tool_schema`` checked to be an OpenAI function schema with a name.

    Raises:
        FileNotFoundError: no such file.
        UpstreamToolError: the file is not upstream's format (naming the entry and field).
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tool config {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise UpstreamToolError(f"tool config {path}: not valid YAML: {exc}") from exc
    tools = data.get("tools") if isinstance(data, Mapping) else None
    if not isinstance(tools, list) or not tools:
        raise UpstreamToolError(
            f"tool config {path}: expected upstream's format, a top-level 'tools:' list of "
            "{class_name, config, tool_schema}"
        )
    entries, names = [], set()
    for i, entry in enumerate(tools):
        where = f"tool config {path}, tools[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("class_name"), str):
            raise UpstreamToolError(f"{where}: needs class_name (a Python class path)")
        schema = entry.get("tool_schema")
        function = schema.get("function") if isinstance(schema, Mapping) else None
        if (
            not isinstance(function, Mapping)
            or schema.get("type") != "function"
            or not isinstance(function.get("name"), str)
        ):
            raise UpstreamToolError(
                f"{where} ({entry['class_name']}): tool_schema must be {{type: function, "
                "function: {name, description, parameters}}; a tool whose class makes its "
                "own schema is not read here"
            )
        if function["name"] in names:
            raise UpstreamToolError(f"{where}: a second tool named {function['name']!r}")
        names.add(function["name"])
        config = entry.get("config") or {}
        if not isinstance(config, Mapping):
            raise UpstreamToolError(f"{where}: config must be a mapping")
        entries.append(
            {"class_name": entry["class_name"], "config": dict(config), "tool_schema": schema}
        )
    return entries


def _refusal(entry: Mapping[str, Any]) -> str | None:
    """Why ``entry``'s tool cannot run here, or None."""
    cls = entry["class_name"]
    if str(entry["config"].get("type", "native")).lower() == "mcp":
        return _SERVER.format(what="MCP")
    if cls in REFUSED_CLASSES:
        return REFUSED_CLASSES[cls]
    if cls.startswith("verl.tools.") and cls not in _NATIVE_MEANING:
        return "it is one of upstream's built-in tools, which this project does not have"
    return None


def _import_class(class_path: str, name: str) -> type:
    module_name, _, attr = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UpstreamToolError(
            f"tool {name!r} ({class_path}): the class cannot be imported ({exc}); put its "
            "module on PYTHONPATH (the driver's and the workers')"
        ) from exc
    if not isinstance(cls, type) or not callable(getattr(cls, "execute", None)):
        raise UpstreamToolError(
            f"tool {name!r} ({class_path}): not a tool class with upstream's BaseTool "
            "interface (create, execute, release)"
        )
    return cls


# ---------------------------------------------------------------- running the tools
def load_upstream_tool(path: str | Path, name: str) -> Tool:
    """The :class:`~verl.tools.base.Tool` of the tool ``name`` in upstream's tool YAML
    ``path`` (see the module docstring for what runs)."""
    entries = {e["tool_schema"]["function"]["name"]: e for e in read_tool_config(path)}
    if name not in entries:
        raise AttributeError(f"tool config {path} has no tool {name!r}; it has {sorted(entries)}")
    entry = entries[name]
    why = _refusal(entry)
    if why is not None:
        raise UpstreamToolError(f"tool {name!r} ({entry['class_name']}): {why}")
    schema = _plain(entry["tool_schema"])
    if entry["class_name"] == GSM8K_TOOL:
        return Tool(name=name, schema=schema, fn=_gsm8k_fn(name))
    if entry["class_name"] == SANDBOX_TOOL:
        return Tool(name=name, schema=schema, fn=_sandbox_fn(entry["config"]))
    cls = _import_class(entry["class_name"], name)
    instance = cls(config=entry["config"], tool_schema=OpenAIFunctionToolSchema(schema))
    return Tool(name=name, schema=schema, fn=_AdaptedTool(name, instance))


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _create_kwargs(name: str) -> dict[str, Any]:
    """``extra_info.tools_kwargs[name].create_kwargs`` of the row being rolled out."""
    extra = current_row().get("extra_info")
    tools_kwargs = extra.get("tools_kwargs") if isinstance(extra, Mapping) else None
    mine = tools_kwargs.get(name) if isinstance(tools_kwargs, Mapping) else None
    create = mine.get("create_kwargs") if isinstance(mine, Mapping) else None
    return dict(create) if isinstance(create, Mapping) else {}


def _gsm8k_fn(name: str):
    from verl.rewards.scorers import gsm8k

    def calc_gsm8k_reward(answer: Any = "", **_: Any) -> str:
        answer = answer if isinstance(answer, str) else str(answer)
        truth = _create_kwargs(name).get("ground_truth")
        if truth is None:
            truth = current_row().get("ground_truth")
        response = answer if answer.startswith("#### ") else "#### " + answer
        reward = float(gsm8k.compute_score(response, truth, method="flexible")["score"])
        return f"Current parsed {answer=} {reward=}"

    return calc_gsm8k_reward


def _sandbox_fn(config: Mapping[str, Any]):
    from verl.tools.python_executor import python_tool

    native = python_tool(
        timeout_s=float(config.get("default_timeout") or 5.0),
        memory_mb=int(config.get("memory_limit_mb") or 512),
    )

    def code_interpreter(code: Any = None, language: str = "python", **_: Any) -> str:
        if str(language).lower() not in ("python", "python3"):
            raise ValueError(f"language={language!r}: only python runs here")
        return native(code=code)

    return code_interpreter


def _wait(value: Any) -> Any:
    """``value``, awaited when it is awaitable (in a fresh event loop of this thread,
    bounded by the call's deadline)."""
    if not inspect.isawaitable(value):
        return value

    async def bounded() -> Any:
        left = time_left()
        return await asyncio.wait_for(value, None if left is None else max(left, 0.0))

    return asyncio.run(bounded())


class _AdaptedTool:
    """A user class with upstream's ``BaseTool`` interface as a native tool function:
    per call ``create`` (with the row's ``create_kwargs``), ``execute``, ``release``."""

    def __init__(self, name: str, instance: Any) -> None:
        self.name, self.instance = name, instance
        self._warned_reward = False

    def __call__(self, **parameters: Any) -> str:
        created = _wait(self.instance.create(create_kwargs=_create_kwargs(self.name)))
        instance_id = created[0] if isinstance(created, tuple) else created
        try:
            result = _wait(self.instance.execute(instance_id, parameters))
        finally:
            _wait(self.instance.release(instance_id))
        response, reward = (result[0], result[1]) if isinstance(result, tuple) else (result, 0)
        if reward and not self._warned_reward:
            self._warned_reward = True
            logger.warning(
                "tool %r returned a step reward (%s): tool rewards are not added to the "
                "score here (upstream keeps them in an extra field only a custom reward "
                "manager reads); the data source's scorer or custom_reward_function scores "
                "the response",
                self.name,
                reward,
            )
        if isinstance(response, str):
            return response
        if getattr(response, "image", None) or getattr(response, "video", None):
            raise ValueError("the tool returned images or video: multi-modal is not supported")
        text = getattr(response, "text", None)
        if text is None:
            text = response.get("text") if isinstance(response, Mapping) else None
        return "" if text is None else str(text)
