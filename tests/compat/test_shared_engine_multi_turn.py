"""A serving engine (``rollout.name=vllm``) with multi-turn rollouts on more than one actor
rank is refused at config validation, before any model loads, with the reason and what
works; one rank, or ``rollout.name=native`` on two, passes that check."""

from __future__ import annotations

import pytest

from verl.config import ConfigError, load_config

MULTI_TURN = [
    "actor_rollout_ref.rollout.multi_turn.enable=true",
    "actor_rollout_ref.rollout.multi_turn.tools=[{path: builtin, name: calculator}]",
    "trainer.backend=ray",
]


def _messages(overrides: list[str]) -> list[str]:
    try:
        load_config(overrides=overrides)
    except ConfigError as err:
        return [p.message for p in err.problems]
    return []


def _lock_step(msgs: list[str]) -> list[str]:
    return [m for m in msgs if "lock step" in m]


def test_vllm_multi_turn_on_two_actor_ranks_is_refused_with_what_works():
    msgs = _messages(
        ["actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=2", *MULTI_TURN]
    )
    (msg,) = _lock_step(msgs)
    assert msg.startswith(
        "actor_rollout_ref.rollout.name=vllm with actor_rollout_ref.rollout.multi_turn.enable"
        "=true on 2 actor ranks"
    )
    assert "use one actor rank" in msg and "actor_rollout_ref.rollout.name=native" in msg


@pytest.mark.parametrize(
    "overrides",
    [
        ["actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=1"],
        ["actor_rollout_ref.rollout.name=native", "trainer.n_gpus_per_node=2"],
    ],
    ids=["vllm-one-rank", "native-two-ranks"],
)
def test_one_rank_or_the_native_engine_passes(overrides):
    assert _lock_step(_messages([*overrides, *MULTI_TURN])) == []
