"""The native engine's lock-step batch: one prefill, then every row decoded until the last stops.

:func:`generate_lockstep` runs one batch (a wave) of prompts for
:class:`verl.rollout.native.NativeRollout`: the prompts are prefilled together into a
:class:`~verl.rollout.kv_cache.PreallocatedKVCache` that fans each prompt out to its ``n``
rows, then one token per running row is decoded per step; rows that stop are compacted away
once they make up ``engine.compaction_threshold`` of the running rows (never with the static
cache of ``compile_decode``, whose shapes must not change).

Positions are ``(B, P)`` for text prompts or ``(B, P, 4)`` for image prompts (row 0 of the
last axis the text positions, 1-3 the model's multimodal rope index,
:mod:`verl.rollout.images`). Either way a decode step's position is the last prompt
column's plus the tokens fed since, on every axis: for the rope axes that is the text
position plus the row's rope delta, as transformers' ``generate`` continues them. ``images``
(:class:`~verl.rollout.images.PromptImages` of these prompts) go to the prefill forward only:
the vision tower runs once per prompt, not once per sample or step.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import torch

from verl.rollout.kv_cache import PreallocatedKVCache

if TYPE_CHECKING:
    from verl.rollout.base import SamplingParams
    from verl.rollout.images import PromptImages
    from verl.rollout.native import NativeRollout
    from verl.rollout.stopping import StopStringChecker

__all__ = ["STATIC_LEN_STEP", "generate_lockstep"]

# compile_decode: the static cache width is rounded up to a multiple of this many columns.
STATIC_LEN_STEP = 32


def generate_lockstep(
    engine: NativeRollout,
    input_ids: torch.Tensor,
    key_real: torch.Tensor,
    position_ids: torch.Tensor,
    params: SamplingParams,
    *,
    first_row: int,
    seed: int | None,
    stop_ids: torch.Tensor | None,
    checker: StopStringChecker,
    images: PromptImages | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float]]:
    """One lock-step batch: ``input_ids`` / ``key_real`` (B, P) and ``position_ids`` (B, P)
    or (B, P, 4) of its prompts, left-padded, on the model's device. ``first_row``: the
    output row of its first sample (it keys the sampling). Returns ``(responses, log_probs,
    lengths, stats)`` of its ``B * n`` rows: (B*n, R) long with garbage past ``lengths``,
    (B*n, R) float32, (B*n,) and the batch's ``prompt_len``, ``decode_steps``,
    ``decode_row_steps``, ``compactions`` and ``prefill_s``."""
    t_start = time.perf_counter()
    device = input_ids.device
    dtype = next(engine.module.parameters()).dtype
    n, max_new = params.n, params.max_new_tokens
    batch = input_ids.shape[0]
    rows = batch * n

    # Padding columns shared by every row cost compute and change nothing.
    first = int(key_real.any(dim=0).int().argmax())
    key_real = key_real[:, first:]
    ids = input_ids[:, first:]
    pos = position_ids[:, first:]
    prompt_len = ids.shape[1]
    max_len = prompt_len + max_new - 1  # the last sampled token is never fed back

    static = engine.compile_decode
    if static:
        # One compiled graph per (rows, cache width): round the width up so batches
        # whose prompts differ by a few tokens share it.
        max_len = -(-max_len // STATIC_LEN_STEP) * STATIC_LEN_STEP
    kv_dtype, kv_round = engine._cache_precision(device)
    cache = PreallocatedKVCache(
        engine._num_layers,
        rows,
        max_len,
        repeats=n,
        static=static,
        dtype=kv_dtype,
        round_to=kv_round,
    )
    # kv_real: columns a query may attend to. Eager decode hands the attention only the
    # filled prefix; a static cache hands it every column, unwritten ones masked.
    kv_real = torch.full((rows, max_len), not static, dtype=torch.bool, device=device)
    kv_real[:, :prompt_len] = key_real.repeat_interleave(n, dim=0)
    logits = engine._forward(
        ids,
        engine._prefill_mask(key_real, dtype),
        pos,
        cache,
        inputs=images.model_inputs() if images is not None else None,
    )
    if n > 1:
        logits = logits.repeat_interleave(n, dim=0)
    next_pos = pos[:, -1].repeat_interleave(n, dim=0) + 1
    t_prefill = time.perf_counter()

    responses = torch.empty(rows, max_new, dtype=torch.long, device=device)
    log_probs = torch.zeros(rows, max_new, dtype=torch.float32, device=device)
    lengths = torch.full((rows,), max_new, dtype=torch.long, device=device)
    active = torch.arange(rows, device=device)  # wave row of each running row
    alive = torch.ones(rows, dtype=torch.bool, device=device)
    compactions = 0
    row_steps = 0
    for step in range(max_new):
        tokens, chosen = engine._sample(logits, first_row + active, step, params, seed)
        responses[active, step] = tokens
        log_probs[active, step] = chosen
        done = torch.isin(tokens, stop_ids) if stop_ids is not None else torch.zeros_like(alive)
        if checker:
            running = alive.nonzero().flatten()
            start = max(0, step + 1 - checker.window)
            tails = responses[active[running], start : step + 1].tolist()
            hits = torch.tensor(checker.hits(tails), dtype=torch.bool, device=device)
            done[running] |= hits
        done &= alive
        if bool(done.any()):
            lengths[active[done]] = step + 1
            alive &= ~done
        if step == max_new - 1 or not bool(alive.any()):
            break
        running_rows = int(alive.sum())
        finished_rows = active.numel() - running_rows
        threshold = max(1, math.ceil(engine.compaction_threshold * active.numel()))
        if engine.compaction and not static and finished_rows >= threshold:
            keep = alive.nonzero().flatten()
            cache.select_rows(keep)
            kv_real, next_pos, tokens = kv_real[keep], next_pos[keep], tokens[keep]
            active, alive = active[keep], alive[keep]
            compactions += 1
        row_steps += active.numel()
        length = cache.length + 1
        if static:
            kv_real[:, length - 1] = True
            logits = engine._decode_compiled()(
                tokens.unsqueeze(1),
                engine._decode_mask(kv_real, max_len, dtype),
                next_pos.unsqueeze(1),
                cache,
                decode=True,
            )
            cache.advance(1)
        else:
            logits = engine._forward(
                tokens.unsqueeze(1),
                engine._decode_mask(kv_real, length, dtype),
                next_pos.unsqueeze(1),
                cache,
                decode=True,
            )
        next_pos += 1

    return (
        responses,
        log_probs,
        lengths,
        {
            "prompt_len": float(prompt_len),
            "decode_steps": float(step),
            "decode_row_steps": float(row_steps),
            "compactions": float(compactions),
            "prefill_s": t_prefill - t_start,
        },
    )
