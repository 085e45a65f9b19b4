"""The actor / rollout worker's multi-turn mode: the agent loop over its rollout engine.

With ``actor_rollout_ref.rollout.multi_turn.enable``, ``generate_sequences`` runs
:class:`verl.rollout.agent_loop.AgentLoop` over the worker's rollout engine (any backend)
with the configured tools and interaction; the output keeps the single-turn layout, with
``response_mask`` 0 on tool tokens, and adds the per-sample ``messages`` and tool counts
(``verl.rollout.agent_loop.TRAJECTORY_KEYS``). See ``docs/multiturn.md``.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.config import TrainerConfig
from verl.rollout import RolloutEngine
from verl.rollout.agent_loop import AgentLoop, EngineTurnGenerator
from verl.tools import load_tools
from verl.tools.interaction import load_interaction

logger = logging.getLogger(__name__)

__all__ = ["build_agent_loop"]


def build_agent_loop(config: TrainerConfig, rollout: RolloutEngine, tokenizer: Any) -> Any:
    """The agent loop of ``rollout.multi_turn`` over ``rollout`` (or, with
    ``rollout.agent``, the agent-program rollout: ``verl.rollout.agent_program``), or None
    when both are off."""
    if config.actor_rollout_ref.rollout.agent.enable:
        from verl.rollout.agent_program import build_agent_program

        return build_agent_program(config, rollout, tokenizer)
    mt_cfg = config.actor_rollout_ref.rollout.multi_turn
    if not mt_cfg.enable:
        return None
    tools = load_tools(mt_cfg.tools)
    if not tools:
        logger.warning(
            "actor_rollout_ref.rollout.multi_turn.enable=true with no tools: every "
            "response is one turn; add tools, e.g. [{path: builtin, name: calculator}]"
        )
    interaction = None
    if mt_cfg.interaction.path is not None:
        interaction = load_interaction(mt_cfg.interaction.path, mt_cfg.interaction.name)
    return AgentLoop(
        EngineTurnGenerator(rollout),
        tokenizer,
        tools,
        max_turns=mt_cfg.max_turns,
        max_tool_response_tokens=mt_cfg.max_tool_response_tokens,
        tool_timeout=mt_cfg.tool_timeout,
        max_parallel_tool_calls=mt_cfg.max_parallel_tool_calls,
        interaction=interaction,
    )
