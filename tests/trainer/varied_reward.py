"""A reward for tiny-model equivalence tests: the random model never answers the built-in
arithmetic, so its default reward is 0 everywhere, every GRPO advantage is 0 and an update
changes nothing; two runs then agree whatever each of them did. This one differs within a
group, so the updates have a gradient and a comparison of weights or losses means something.
"""

from __future__ import annotations

from typing import Any

from verl.rewards.placement import place_on_last_token


def even_token_reward(batch: Any) -> tuple[Any, dict, dict]:
    """Score = the fraction of even token ids among a response's valid tokens, on its last
    valid token (a ``reward_fn`` of :class:`~verl.trainer.rl.trainer.RLTrainer`)."""
    responses, mask = batch.batch["responses"], batch.batch["response_mask"]
    score = ((responses % 2 == 0) & mask.bool()).sum(-1).float() / mask.sum(-1).clamp(min=1)
    return place_on_last_token(score, mask), {}, {}


def assert_updates_moved(history: list[dict]) -> None:
    """Every step of a run applied a non-zero gradient (the comparison is not of no-ops)."""
    norms = [m["actor/grad_norm"] for m in history]
    assert all(n > 0 for n in norms), norms
