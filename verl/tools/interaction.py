"""Interactions: the environment's reply after a model turn that calls no tool.

An interaction is a function called by the agent loop when a model turn ends without a tool
call (the model's final answer, so far)::

    def interaction(messages, *, data_source, ground_truth, extra_info, num_replies) -> str | None

``messages`` is the whole conversation (the prompt's messages, every assistant turn, tool
result and earlier reply); ``num_replies`` counts the interaction's earlier replies in this
episode (0 on the first call), so a game of "one retry" needs no state. It returns the text
of a ``user`` turn to append (feedback; the model then writes another turn) or ``None`` to
end the episode. Its reply is rendered by the chat template as a delta, like tool results,
and has ``response_mask`` 0.

Configured like tools: ``actor_rollout_ref.rollout.multi_turn.interaction={path, name}``,
``path: builtin`` for :data:`BUILTIN_INTERACTIONS`. See ``docs/multiturn.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verl.rewards.scorers.arithmetic import compute_score
from verl.utils.file_import import load_callable

__all__ = ["BUILTIN_INTERACTIONS", "arithmetic_retry", "load_interaction"]

RETRY_MESSAGE = (
    "That answer is wrong. Call the calculator tool to compute it, then answer with just "
    "the number."
)


def arithmetic_retry(
    messages: list[dict[str, Any]],
    *,
    ground_truth: Any = None,
    num_replies: int = 0,
    **_: Any,
) -> str | None:
    """The arithmetic task's environment: a wrong final answer gets one retry.

    The last assistant turn is scored by the arithmetic reward's scorer
    (``verl.rewards.scorers.arithmetic``: its final number against ``ground_truth``).
    Right, already retried once, or no ground truth: the episode ends (``None``).
    """
    if ground_truth is None or num_replies >= 1:
        return None
    last = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    result = compute_score(last["content"] if last else "", ground_truth)
    return None if result["acc"] == 1.0 else RETRY_MESSAGE


BUILTIN_INTERACTIONS: dict[str, Callable[..., str | None]] = {
    "arithmetic_retry": arithmetic_retry,
}


def load_interaction(path: str, name: str) -> Callable[..., str | None]:
    """The interaction ``name`` of the Python file ``path`` (``builtin``: verl's own).

    Raises ``FileNotFoundError``, ``ImportError``, ``AttributeError`` or ``TypeError``
    naming the file (or the built-in names) and the config key to fix.
    """
    if path == "builtin":
        if name not in BUILTIN_INTERACTIONS:
            raise AttributeError(
                f"multi_turn.interaction.name={name!r}: no such built-in interaction; "
                f"built-in interactions: {sorted(BUILTIN_INTERACTIONS)}"
            )
        return BUILTIN_INTERACTIONS[name]
    _, fn = load_callable(
        path,
        name,
        "interaction file",
        "set multi_turn.interaction.path to an existing .py file, 'builtin', or null",
    )
    return fn
