"""Model turns of the agent loop: what a backend returns per turn, and the versions of them.

Contract:

- :class:`TurnGenerator` is what the agent loop (:mod:`verl.rollout.agent_loop`) needs from a
  backend: a context of ids in, the turn's new ids, their log-probs and, when the engine
  records them, the policy version of each (:class:`TurnOutput`) out.
- :class:`EngineTurnGenerator` adapts any :class:`~verl.rollout.base.RolloutEngine`; inside
  :func:`verl.rollout.partial.weight_mailbox` the native engine's output carries
  ``rollout_token_versions`` and each turn keeps its tokens' versions (a weight swap that
  lands mid-turn shows there, as in a single-turn call).
- :func:`trajectory_versions` lays the turns' versions out as the trajectory's
  ``rollout_token_versions`` (rows, R) int64: a model token has the version that sampled
  it; a tool / interaction / template token (``response_mask`` 0) and every position past
  the response has -1, as the single-turn output has past its response (the per-token
  versions are read where ``>= 0`` only: a sample's version is its oldest model token's).
  The loss needs nothing more: the truncated importance weights read ``rollout_log_probs``
  per token, each the probability its token was drawn with, whatever its version.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from verl.rollout.base import RolloutEngine, SamplingParams
from verl.rollout.partial import TOKEN_VERSIONS
from verl.rollout.tool_calls import TOOL_CALL_END

__all__ = [
    "EngineTurnGenerator",
    "TurnGenerator",
    "TurnOutput",
    "extend_versions",
    "trajectory_versions",
]


@dataclass
class TurnOutput:
    """One model turn: the new ids (stop token included), each one's log-prob and, when
    the engine records them (partial rollouts), each one's policy version (else None)."""

    ids: list[int]
    log_probs: list[float]
    versions: list[int] | None = None


class TurnGenerator(Protocol):
    """What the agent loop needs from a rollout backend."""

    def generate_turns(
        self, contexts: list[list[int]], budgets: list[int], params: SamplingParams
    ) -> list[TurnOutput]:
        """Continue each context (unpadded ids) by at most its budget of new tokens,
        stopping at an eos id, a stop string of ``params`` or ``</tool_call>``."""


class EngineTurnGenerator:
    """A :class:`TurnGenerator` over any :class:`RolloutEngine` (``native``, ``hf`` ...).

    Each call is one batched ``engine.generate`` of the left-padded contexts with ``n=1``,
    ``max_new_tokens`` the largest budget and ``</tool_call>`` added to the stop strings;
    a row is then cut to its own budget (as if it had been stopped there). The turns carry
    the output's ``rollout_token_versions`` when it has them.
    """

    def __init__(self, engine: RolloutEngine, stop_strings: Sequence[str] = (TOOL_CALL_END,)):
        self.engine = engine
        self.stop_strings = list(stop_strings)

    def generate_turns(
        self, contexts: list[list[int]], budgets: list[int], params: SamplingParams
    ) -> list[TurnOutput]:
        from verl.protocol import DataProto

        width = max(len(c) for c in contexts)
        ids = torch.full((len(contexts), width), self.engine.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(contexts), width), dtype=torch.long)
        for row, context in enumerate(contexts):
            ids[row, width - len(context) :] = torch.tensor(context, dtype=torch.long)
            mask[row, width - len(context) :] = 1
        position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
        stops = list(params.stop_strings) + [
            s for s in self.stop_strings if s not in params.stop_strings
        ]
        turn_params = dataclasses.replace(
            params, n=1, max_new_tokens=max(budgets), stop_strings=stops
        )
        batch = DataProto.from_dict(
            tensors={"input_ids": ids, "attention_mask": mask, "position_ids": position_ids}
        )
        out = self.engine.generate(batch, turn_params).to("cpu")
        lengths = out.batch["response_mask"].sum(-1).tolist()
        responses = out.batch["responses"].tolist()
        log_probs = out.batch["rollout_log_probs"].tolist()
        versions = out.batch[TOKEN_VERSIONS].tolist() if TOKEN_VERSIONS in out.batch else None
        return [
            TurnOutput(
                responses[r][: min(n, b)],
                log_probs[r][: min(n, b)],
                None if versions is None else versions[r][: min(n, b)],
            )
            for r, (n, b) in enumerate(zip(lengths, budgets))
        ]


def trajectory_versions(samples: Sequence[Any], width: int) -> torch.Tensor | None:
    """``rollout_token_versions`` (rows, ``width``) int64 of the agent loop's samples (each
    with ``versions``: one entry per response id, -1 on the ids the model did not sample),
    -1 past each response; None when a model turn came without versions (no partial
    rollout: the call's version stands for every token)."""
    if any(s.versions is None for s in samples):
        return None
    out = torch.full((len(samples), width), -1, dtype=torch.long)
    for row, sample in enumerate(samples):
        out[row, : len(sample.versions)] = torch.tensor(sample.versions, dtype=torch.long)
    return out


def extend_versions(
    versions: list[int] | None, count: int, model: bool, turn: list[int] | None
) -> list[int] | None:
    """A sample's versions after appending ``count`` ids: the turn's ``turn`` versions for
    model ids (None for good once a model turn has none), -1 for the others."""
    if versions is None:
        return None
    if not model:
        return versions + [-1] * count
    if turn is None:
        return None
    if len(turn) != count:
        raise RuntimeError(f"turn has {count} ids but {len(turn)} versions")
    return versions + [int(v) for v in turn]
