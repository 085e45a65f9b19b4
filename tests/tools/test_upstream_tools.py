"""Upstream verl's tool YAML (``multi_turn.tool_config_path``): its built-in GSM8K tool maps
onto this project's scorer, a user class with upstream's ``BaseTool`` interface runs through
the adapter and gets its row's ``extra_info.tools_kwargs[name].create_kwargs``, and tools
that cannot run here are refused with the reason.

The agent loop is the real one over the tiny tokenizer; the model's turns are scripted (a
random tiny model writes no tool calls), as in tests/rollout/test_agent_loop.py.
"""

from __future__ import annotations

import json
import logging
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

from verl.config import ConfigError, load_config
from verl.models.tiny import build_tiny_tokenizer
from verl.protocol import DataProto
from verl.rollout import SamplingParams
from verl.rollout.agent_loop import AgentLoop, TurnOutput
from verl.tools import load_tools, tool_schemas
from verl.tools.upstream_adapter import UpstreamToolError

TOOL_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
GSM8K_YAML = {  # upstream's examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml
    "tools": [
        {
            "class_name": "verl.tools.gsm8k_tool.Gsm8kTool",
            "config": {"type": "native"},
            "tool_schema": {
                "type": "function",
                "function": {
                    "name": "calc_gsm8k_reward",
                    "description": "A tool for calculating the reward of gsm8k.",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "answer": {"type": "string", "description": "The model's answer"}
                        },
                        "required": ["answer"],
                    },
                },
            },
        }
    ]
}

USER_TOOL = """
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

CREATED, RELEASED = [], []


class LookupTool(BaseTool):
    def __init__(self, config, tool_schema):
        super().__init__(config, tool_schema)
        self.state = {}

    async def create(self, instance_id=None, **kwargs):
        instance_id = f"i{len(CREATED)}"
        CREATED.append(kwargs)
        self.state[instance_id] = kwargs["create_kwargs"]
        return instance_id, ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        secret = self.state[instance_id].get("secret")
        text = f"{self.config['prefix']}{secret}:{parameters['key']}"
        return ToolResponse(text=text), 0.5, {}

    async def release(self, instance_id, **kwargs):
        RELEASED.append(instance_id)
        del self.state[instance_id]
"""


def _call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class _Script:
    """Each sample's first turn is ``first[i]`` (a tool call), its second ends the sample."""

    def __init__(self, tokenizer, prompts: list[list[int]], first: list[str]):
        self.tokenizer, self.prompts, self.first = tokenizer, prompts, first
        self.turns = [0] * len(prompts)
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate_turns(self, contexts, budgets, params):
        outs = []
        for context in contexts:
            (i,) = [i for i, p in enumerate(self.prompts) if context[: len(p)] == p]
            text = self.first[i] if self.turns[i] == 0 else "done"
            self.turns[i] += 1
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if self.turns[i] > 1:
                ids.append(self.eos)
            outs.append(TurnOutput(ids, [-0.1] * len(ids)))
        return outs


def _rollout(tools, calls: list[str], extra_infos: list[dict], ground_truths: list[str]):
    tokenizer = build_tiny_tokenizer()
    tokenizer.padding_side = "left"
    texts = [f"question {i}" for i in range(len(calls))]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    batch = DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
        },
        non_tensors={
            "extra_info": np.array(extra_infos, dtype=object),
            "ground_truth": np.array(ground_truths, dtype=object),
            "data_source": np.array(["gsm8k"] * len(calls), dtype=object),
        },
    )
    prompts = [r[m.bool()].tolist() for r, m in zip(enc["input_ids"], mask)]
    loop = AgentLoop(_Script(tokenizer, prompts, calls), tokenizer, tools, tool_timeout=30)
    out = loop.run(batch, SamplingParams(n=1, max_new_tokens=400, do_sample=False))
    results = [
        [m["content"] for m in out.non_tensor_batch["messages"][row] if m["role"] == "tool"]
        for row in range(len(calls))
    ]
    assert list(out.non_tensor_batch["num_tool_errors"]) == [0] * len(calls), results
    return results


@pytest.fixture
def gsm8k_yaml(tmp_path) -> Path:
    path = tmp_path / "gsm8k_tool_config.yaml"
    path.write_text(yaml.safe_dump(GSM8K_YAML))
    return path


def test_upstream_gsm8k_tool_yaml_runs_the_native_scorer_in_a_rollout(gsm8k_yaml):
    cfg = load_config(
        overrides=[f"{TOOL_KEY}={gsm8k_yaml}", "actor_rollout_ref.rollout.multi_turn.enable=true"]
    )
    specs = cfg.actor_rollout_ref.rollout.multi_turn.tools
    assert [(s.path, s.name) for s in specs] == [(str(gsm8k_yaml), "calc_gsm8k_reward")]
    assert tool_schemas(specs) == [GSM8K_YAML["tools"][0]["tool_schema"]]  # the prompts' list

    per_row = {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}
    results = _rollout(
        load_tools(specs),
        [_call("calc_gsm8k_reward", answer="72"), _call("calc_gsm8k_reward", answer="5")],
        [{"tools_kwargs": per_row}, {}],  # the second row: its own ground_truth column
        ["1", "6"],
    )
    assert results == [
        ["Current parsed answer='72' reward=1.0"],  # create_kwargs' ground truth, not "1"
        ["Current parsed answer='5' reward=0.0"],
    ]


def test_a_user_class_gets_its_rows_create_kwargs_through_the_adapter(
    tmp_path, monkeypatch, caplog
):
    (tmp_path / "my_tools.py").write_text(textwrap.dedent(USER_TOOL))
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "tools.yaml"
    schema = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a key up",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
            },
        },
    }
    entry = {"class_name": "my_tools.LookupTool", "config": {"type": "native", "prefix": "="}}
    path.write_text(yaml.safe_dump({"tools": [{**entry, "tool_schema": schema}]}))
    cfg = load_config(
        overrides=[f"{TOOL_KEY}={path}", "actor_rollout_ref.rollout.multi_turn.enable=true"]
    )
    tools = load_tools(cfg.actor_rollout_ref.rollout.multi_turn.tools)
    rows = [
        {"tools_kwargs": {"lookup": {"create_kwargs": {"secret": "alpha"}}}},
        {"tools_kwargs": {"lookup": {"create_kwargs": {"secret": "beta"}}}},
        {"tools_kwargs": {"other_tool": {"create_kwargs": {"secret": "no"}}}},
    ]
    with caplog.at_level(logging.WARNING, logger="verl.tools.upstream_adapter"):
        results = _rollout(tools, [_call("lookup", key=k) for k in "xyz"], rows, ["", "", ""])
    assert results == [["=alpha:x"], ["=beta:y"], ["=None:z"]]
    import my_tools

    assert sorted(c["create_kwargs"].get("secret", "-") for c in my_tools.CREATED) == [
        "-",
        "alpha",
        "beta",
    ]
    assert len(my_tools.RELEASED) == 3  # released after each call, as upstream's loop does
    warned = [r.getMessage() for r in caplog.records if "step reward" in r.getMessage()]
    assert len(warned) == 1 and "not added to the score" in warned[0]


@pytest.mark.parametrize(
    ("class_name", "config", "why"),
    [
        ("verl.tools.search_tool.SearchTool", {"type": "native"}, "retrieval"),
        ("verl.tools.mcp_search_tool.MCPSearchTool", {"type": "mcp"}, "MCP server"),
        ("verl.tools.image_zoom_in_tool.ImageZoomInTool", {"type": "native"}, "multi-modal"),
        ("verl.tools.some_new_tool.NewTool", {"type": "native"}, "upstream's built-in"),
        ("no_such_module.Tool", {"type": "native"}, "cannot be imported"),
    ],
)
def test_tools_that_cannot_run_here_are_refused_with_the_reason(tmp_path, class_name, config, why):
    path = tmp_path / "tools.yaml"
    entry = {**GSM8K_YAML["tools"][0], "class_name": class_name, "config": config}
    path.write_text(yaml.safe_dump({"tools": [entry]}))
    cfg = load_config(overrides=[f"{TOOL_KEY}={path}"])
    specs = cfg.actor_rollout_ref.rollout.multi_turn.tools
    with pytest.raises(UpstreamToolError) as err:
        tool_schemas(specs)  # what the trainer's start-up calls, before any model loads
    msg = str(err.value)
    assert msg.startswith(f"tool 'calc_gsm8k_reward' ({class_name}): ") and why in msg, msg


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "no such file"),
        ("tools: {a: 1}", "not upstream's format"),
        ("tools:\n  - class_name: x.Y\n    config: {}\n", "not upstream's format"),
    ],
)
def test_a_missing_or_malformed_tool_yaml_is_refused_at_config(tmp_path, content, why):
    path = tmp_path / "tools.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"{TOOL_KEY}={path}"])
    assert TOOL_KEY in str(err.value) and why in str(err.value), str(err.value)


def test_the_code_interpreter_runs_in_the_local_sandbox(tmp_path):
    path = tmp_path / "sandbox.yaml"
    schema = {
        "type": "function",
        "function": {
            "name": "code_interpreter",
            "description": "A tool for executing code.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The code"}},
                "required": ["code"],
            },
        },
    }
    entry = {
        "class_name": "verl.tools.sandbox_fusion_tools.SandboxFusionTool",
        "config": {"sandbox_fusion_url": "https://unreachable.invalid/run_code", "type": "native"},
        "tool_schema": schema,
    }
    path.write_text(yaml.safe_dump({"tools": [entry]}))
    cfg = load_config(overrides=[f"{TOOL_KEY}={path}"])
    (tool,) = load_tools(cfg.actor_rollout_ref.rollout.multi_turn.tools)
    assert tool.name == "code_interpreter" and tool.schema == schema
    assert tool(code="print(6 * 7)") == "42"
