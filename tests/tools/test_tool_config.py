"""A multi-turn config with tools is written as YAML (``verl config``, ``--print-config``,
every checkpoint's config) and reads back equal; a tool given as a Python function is
written as its import path, or refused by validation when it has none.

The resume of a multi-turn run from such a checkpoint, killed at seeded points, is
tests/trainer/test_chaos.py's multi-turn variant.
"""

from __future__ import annotations

import pytest
import yaml

from verl import cli
from verl.config import ConfigError, TrainerConfig, from_dict, load_config, to_dict, to_yaml
from verl.config.load import load_yaml_text
from verl.config.schema_rollout import MultiTurnConfig, ToolConfig
from verl.tools import load_tool
from verl.tools.calculator import calculate, calculator_tool
from verl.tools.interaction import arithmetic_retry
from verl.trainer import main_ppo

MT = "actor_rollout_ref.rollout.multi_turn"
TOOLS = [
    f"{MT}.enable=true",
    f"{MT}.tools=[{{path: builtin, name: calculator}}, {{path: builtin, name: python}}]",
    f"{MT}.max_parallel_tool_calls=3",
]

CALCULATOR_TOOL = calculator_tool()  # a module-level Tool: importable as this module's name


def word_count(text: str) -> str:
    """Count the words of a text.

    Args:
        text: any text
    """
    return str(len(text.split()))


def _tools_of(printed: str) -> list[dict]:
    return load_yaml_text(printed)["actor_rollout_ref"]["rollout"]["multi_turn"]["tools"]


@pytest.mark.parametrize(
    "command",
    [
        lambda: cli.main(["config", *TOOLS]),
        lambda: main_ppo.main(["--print-config", *TOOLS]),
    ],
    ids=["verl config", "--print-config"],
)
def test_config_commands_print_a_multi_turn_tool_config(command, capsys):
    assert command() == 0
    printed = capsys.readouterr().out
    assert _tools_of(printed) == [
        {"path": "builtin", "name": "calculator"},
        {"path": "builtin", "name": "python"},
    ]
    # what is printed (and saved into checkpoints) loads back to the same config
    assert from_dict(load_yaml_text(printed)) == load_config(overrides=TOOLS)


def test_to_yaml_writes_every_nested_section_and_reads_back():
    cfg = load_config(overrides=TOOLS)
    text = to_yaml(cfg)
    yaml.safe_load(text)  # plain YAML, no Python tags
    assert from_dict(load_yaml_text(text)) == cfg
    assert load_yaml_text(text) == to_dict(cfg)


def test_a_function_tool_is_written_as_its_import_path_and_loads_back():
    mt = MultiTurnConfig(enable=True, tools=[word_count, CALCULATOR_TOOL, ToolConfig()])
    assert mt.tools[0] == ToolConfig(path=f"{__name__}:word_count", name="word_count")
    assert mt.tools[1] == ToolConfig(path=f"{__name__}:CALCULATOR_TOOL", name="calculator")
    assert ToolConfig.from_function(calculate, name="calc") == ToolConfig(
        path="verl.tools.calculator:calculate", name="calc"
    )
    cfg = TrainerConfig()
    cfg.actor_rollout_ref.rollout.multi_turn = mt
    cfg.validate()
    assert _tools_of(to_yaml(cfg))[:2] == [
        {"path": f"{__name__}:word_count", "name": "word_count"},
        {"path": f"{__name__}:CALCULATOR_TOOL", "name": "calculator"},
    ]
    tool = load_tool(mt.tools[0].path, mt.tools[0].name)
    assert tool.name == "word_count" and tool(text="a b c") == "3"
    assert load_tool(mt.tools[1].path, mt.tools[1].name) is CALCULATOR_TOOL


def test_a_function_without_an_import_path_is_refused_by_validation():
    def local_tool(x: int) -> str:
        """A tool defined inside a function.

        Args:
            x: a number
        """
        return str(x)

    with pytest.raises(ValueError, match="cannot be written into the run's config"):
        ToolConfig.from_function(local_tool)
    cfg = TrainerConfig()
    cfg.actor_rollout_ref.rollout.multi_turn = MultiTurnConfig(enable=True, tools=[local_tool])
    with pytest.raises(ConfigError) as err:
        cfg.validate()
    message = str(err.value)
    assert f"{MT}.tools[0]=" in message and "is a lambda or is defined inside a function" in message
    assert "path: file.py, name: local_tool" in message
    # a value put into the tree past validation is refused when written, naming its key
    cfg.actor_rollout_ref.model.override_config = {"hook": lambda: None}
    cfg.actor_rollout_ref.rollout.multi_turn = MultiTurnConfig()
    with pytest.raises(
        ConfigError, match=r"actor_rollout_ref\.model\.override_config cannot be written"
    ):
        to_yaml(cfg)


def test_an_importable_callable_anywhere_in_the_tree_is_written_as_its_path():
    cfg = TrainerConfig()
    cfg.actor_rollout_ref.model.override_config = {"hook": arithmetic_retry}
    tree = load_yaml_text(to_yaml(cfg))
    assert tree["actor_rollout_ref"]["model"]["override_config"] == {
        "hook": "verl.tools.interaction:arithmetic_retry"
    }
