"""When a response ends: eos / pad id resolution and stop-string matching.

Stop strings are matched on decoded text, but decoding a whole response every step is
O(length) per step. ``StopStringChecker`` decodes only the last ``window`` tokens of each
row: a stop string of ``c`` characters spans at most ``c`` tokens when every token decodes
to at least one character, and the default window of ``2 * c + 2`` tokens leaves room for
byte-level tokens that hold part of a character.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = ["StopStringChecker", "resolve_eos_token_ids", "resolve_pad_token_id"]


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        value = value.flatten().tolist()
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def resolve_eos_token_ids(tokenizer: Any, module: torch.nn.Module | None) -> list[int]:
    """All eos ids known for this model: generation config, model config, then tokenizer.

    Chat models often list several (e.g. ``<|im_end|>`` and ``<|endoftext|>``) in their
    generation config; the union keeps every one of them a stop token. Order is preserved.
    """
    ids: list[int] = []
    gen_cfg = getattr(module, "generation_config", None)
    cfg = getattr(module, "config", None)
    for source in (
        getattr(gen_cfg, "eos_token_id", None),
        getattr(cfg, "eos_token_id", None),
        getattr(tokenizer, "eos_token_id", None),
    ):
        for i in _as_id_list(source):
            if i not in ids:
                ids.append(i)
    return ids


def resolve_pad_token_id(
    tokenizer: Any, module: torch.nn.Module | None, eos_token_ids: Sequence[int]
) -> int:
    """The id that fills responses after their end: tokenizer pad, config pad, else eos."""
    gen_cfg = getattr(module, "generation_config", None)
    cfg = getattr(module, "config", None)
    for source in (
        getattr(tokenizer, "pad_token_id", None),
        getattr(gen_cfg, "pad_token_id", None),
        getattr(cfg, "pad_token_id", None),
    ):
        ids = _as_id_list(source)
        if ids:
            return ids[0]
    if eos_token_ids:
        return int(eos_token_ids[0])
    raise ValueError(
        "no pad token id: the tokenizer, the model config and the eos ids are all unset; "
        "pass pad_token_id= to the rollout engine"
    )


class StopStringChecker:
    """Detects stop strings in the tail of generated token sequences."""

    def __init__(self, tokenizer: Any, stop_strings: Sequence[str], window: int | None = None):
        self.stop_strings = list(stop_strings)
        if self.stop_strings and tokenizer is None:
            raise ValueError(
                f"stop_strings={self.stop_strings!r} need a tokenizer; build the rollout "
                "engine with tokenizer=..."
            )
        self.tokenizer = tokenizer
        longest = max((len(s) for s in self.stop_strings), default=0)
        self.window = int(window) if window is not None else 2 * longest + 2
        if self.window < 1:
            raise ValueError(f"stop string window={self.window} must be >= 1 token")

    def __bool__(self) -> bool:
        return bool(self.stop_strings)

    def hits(self, tails: Sequence[Sequence[int]]) -> list[bool]:
        """For each token list (the last ``window`` tokens of a row), whether it holds a stop."""
        if not tails:
            return []
        texts = self.tokenizer.batch_decode(
            [list(t) for t in tails], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        return [any(s in text for s in self.stop_strings) for text in texts]

    def first_stops(self, responses: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Post-hoc: the length of each row cut after its first stop string.

        ``responses`` (rows, R) ids, ``lengths`` (rows,) valid lengths before stop strings.
        Returns new lengths (rows,), ``<= lengths``. Uses the same tail windows as the
        incremental check, so both backends end a response at the same token.
        """
        out = lengths.clone()
        if not self.stop_strings:
            return out
        rows = responses.tolist()
        limits = lengths.tolist()
        pending = list(range(len(rows)))
        for t in range(responses.shape[1]):
            pending = [r for r in pending if t < limits[r]]
            if not pending:
                break
            start = max(0, t + 1 - self.window)
            hit = self.hits([rows[r][start : t + 1] for r in pending])
            for r, h in zip(pending, hit):
                if h:
                    out[r] = t + 1
            pending = [r for r, h in zip(pending, hit) if not h]
        return out
