"""The actor / rollout worker's multi-turn mode: the agent loop over its rollout engine.

With ``actor_rollout_ref.rollout.multi_turn.enable``, ``generate_sequences`` runs
:class:`verl.rollout.agent_loop.AgentLoop` over the worker's rollout engine (any backend)
with the configured tools and interaction; the output keeps the single-turn layout, with
``response_mask`` 0 on tool tokens, and adds the per-sample ``messages`` and tool counts
(``verl.rollout.agent_loop.TRAJECTORY_KEYS``). See ``docs/multiturn.md``.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

from verl.rollout import RolloutEngine
from verl.rollout.agent_loop import AgentLoop, EngineTurnGenerator
from verl.tools import load_tools
from verl.tools.interaction import load_interaction
from verl.workers.specs import RolloutSpec

logger = logging.getLogger(__name__)

__all__ = ["build_agent_loop"]


def build_agent_loop(
    spec: RolloutSpec, max_prompt_length: int, rollout: RolloutEngine, tokenizer: Any
) -> Any:
    """The agent loop of ``rollout.multi_turn`` over ``rollout`` (or, with
    ``rollout.agent``, the agent-program rollout: ``verl.rollout.agent_program``), or None
    when both are off."""
    if spec.agent.enable:
        from verl.rollout.agent_program import build_agent_program

        # build_agent_program reads these three settings by their config paths
        settings = SimpleNamespace(
            actor_rollout_ref=SimpleNamespace(
                rollout=SimpleNamespace(agent=spec.agent, multi_turn=spec.multi_turn)
            ),
            reward_model=SimpleNamespace(reward_manager=spec.reward_manager),
            data=SimpleNamespace(max_prompt_length=max_prompt_length),
        )
        return build_agent_program(settings, rollout, tokenizer)
    multi_turn = spec.multi_turn
    if not multi_turn.enable:
        return None
    tools = load_tools(multi_turn.tools)
    if not tools:
        logger.warning(
            "actor_rollout_ref.rollout.multi_turn.enable=true with no tools: every "
            "response is one turn; add tools, e.g. [{path: builtin, name: calculator}]"
        )
    interaction = None
    if multi_turn.interaction.path is not None:
        interaction = load_interaction(multi_turn.interaction.path, multi_turn.interaction.name)
    return AgentLoop(
        EngineTurnGenerator(rollout),
        tokenizer,
        tools,
        max_turns=multi_turn.max_turns,
        max_tool_response_tokens=multi_turn.max_tool_response_tokens,
        tool_timeout=multi_turn.tool_timeout,
        max_parallel_tool_calls=multi_turn.max_parallel_tool_calls,
        interaction=interaction,
    )
