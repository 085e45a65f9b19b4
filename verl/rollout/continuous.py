"""Continuous batching for the native engine: a fixed number of slots, refilled as rows end.

The lock-step loop (:func:`verl.rollout.native_lockstep.generate_lockstep`) decodes a batch
until its longest row stops; with more rows than the KV cache has slots (``max_num_seqs``)
every wave then waits for its slowest row. Here the ``S`` slots of one
:class:`~verl.rollout.kv_cache.SlotKVCache` are kept busy instead::

    loop:
        admit   while >= n slots are free and prompts wait: prefill the next prompts
                (together, into a PreallocatedKVCache), copy their keys / values into free
                slots (n samples each) and sample their first token
        decode  one forward over the slots: row i feeds its last token at its own position,
                writes its key / value at its own column and attends to its own columns
                (a (S, 1, 1, width) boolean mask per row), so rows at different positions
                decode in one step
        sample  the running rows; a row that stops frees its slot

Once no prompt waits, finished slots are compacted away (as in the lock-step loop).

Rows stay independent: each row's mask admits only its own prompt and generated columns
(columns of an earlier occupant and other padding are masked; every buffer starts zeroed,
so a masked value is finite), positions are per row, and the sampling of a sample depends
only on (seed, its output row, its token index)
(:func:`~verl.rollout.sampling.row_uniforms`). So a sample is the same whichever slot and
step it ran in: greedy and seeded outputs equal the lock-step engine's (up to the last bits
of float sums over differently laid out columns, which can flip an exact tie only).

Only for models whose attention takes a ready 4-D mask (``sdpa``, ``eager``, no sliding
windows) and eager decoding; the engine uses lock-step waves otherwise. Image prompts
(:mod:`verl.rollout.images`): each admission's prefill gets its prompts' images, and a slot
keeps its row's four position axes (text and rope), each advanced by one per step.

**Groups out as they finish.** A prompt's group (its ``n`` samples) is complete when its
last row stops, usually long before the call's slowest row. ``on_group(prompt)`` is called
then, on the generating thread, so a caller can hand the group on while the rest of the call
decodes. :func:`stream_groups` installs a sink for every native ``generate`` run inside it
(:meth:`verl.rollout.native.NativeRollout.generate` assembles the group's output and calls
the sink): the streaming rollout (``verl/trainer/rl/streaming.py``) pushes each group into its
buffer that way. The samples do not change (per-sample seeding): only when they are seen. The
rollout copy's vLLM engine reports to the same sink as vLLM finishes each request
(``verl.rollout.vllm_stream``).

**New weights mid-call** (:mod:`verl.rollout.partial`). With a ``mailbox``, the loop polls it
before each admission / decode step (no forward in progress) and, when new weights were
posted, loads them into the module: the rows in flight continue over their caches
(``continue``) or have prompt + generated prefix prefilled again under the new weights
(``resume``); prompts admitted later are prefilled with the new weights. Each sampled token
records the version in force (``versions``).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from verl.rollout.kv_cache import PreallocatedKVCache, SlotKVCache

if TYPE_CHECKING:
    from verl.rollout.base import SamplingParams
    from verl.rollout.images import PromptImages
    from verl.rollout.native import NativeRollout
    from verl.rollout.partial import WeightMailbox
    from verl.rollout.stopping import StopStringChecker

__all__ = ["GroupSink", "current_group_sink", "generate_continuous", "stream_groups"]

#: ``sink(prompt, group, params)``: ``prompt`` the group's prompt index in the call,
#: ``group`` its ``n`` rows in the layout of ``verl.rollout.base`` (on the engine's device),
#: ``params`` the call's :class:`~verl.rollout.base.SamplingParams`.
GroupSink = Callable[[int, Any, "SamplingParams"], None]

_SINK: contextvars.ContextVar[GroupSink | None] = contextvars.ContextVar(
    "verl_rollout_group_sink", default=None
)


@contextlib.contextmanager
def stream_groups(sink: GroupSink) -> Iterator[None]:
    """Within the block (this thread / context), every native ``generate`` call reports each
    prompt's group to ``sink`` as soon as its ``n`` samples have stopped (module docstring).
    An exception raised by ``sink`` ends the generation call with it."""
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)


def current_group_sink() -> GroupSink | None:
    """The sink :func:`stream_groups` installed here, or None."""
    return _SINK.get()


def generate_continuous(
    engine: NativeRollout,
    input_ids: torch.Tensor,
    key_real: torch.Tensor,
    position_ids: torch.Tensor,
    params: SamplingParams,
    *,
    slots: int,
    seed: int | None,
    stop_ids: torch.Tensor | None,
    checker: StopStringChecker,
    on_group: Callable[..., None] | None = None,
    mailbox: WeightMailbox | None = None,
    images: PromptImages | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float], torch.Tensor | None]:
    """Generate ``params.n`` samples for each of the ``B`` prompts (``input_ids`` /
    ``key_real`` / ``position_ids`` (B, P), left-padded, on the model's device) through
    ``slots`` KV-cache rows (``slots >= n``). ``on_group(prompt, responses, log_probs,
    lengths[, versions])``: called as soon as the ``n`` rows of prompt ``prompt`` have all
    stopped, with their final rows of the outputs below ((n, R), (n, R), (n,), (n, R);
    ``versions`` only with a ``mailbox``). ``mailbox``: polled between steps (module
    docstring); its ``held`` version tags the tokens until a swap. ``images``: the prompts'
    images (:class:`~verl.rollout.images.PromptImages`; ``position_ids`` then (B, P, 4),
    the text and rope axes): each admission's prefill takes its prompts' share; not with a
    ``mailbox`` (a resume's prefill again would have no images).

    Returns ``responses`` (B*n, R) long (garbage past ``lengths``), ``log_probs`` (B*n, R)
    float32, ``lengths`` (B*n,), stats (``prefill_s``, ``decode_steps``,
    ``decode_row_steps``, ``admissions``, ``compactions``, ``prompt_len``; with a mailbox
    ``weight_swaps``, ``reprefill_rows``, ``reprefill_tokens``, ``reprefill_s``) and
    ``versions`` (B*n, R) int64, the weights' version that sampled each token (None
    without a mailbox; garbage past ``lengths``).
    """
    device = input_ids.device
    dtype = next(engine.module.parameters()).dtype
    n, max_new = params.n, params.max_new_tokens
    batch, width_in = input_ids.shape
    total = batch * n
    # Every admitted group is padded to its own longest prompt (<= width_in).
    max_len = width_in + max_new - 1
    kv_dtype, kv_round = engine._cache_precision(device)
    cache = SlotKVCache(engine._num_layers, slots, max_len, dtype=kv_dtype, round_to=kv_round)

    responses = torch.empty(total, max_new, dtype=torch.long, device=device)
    log_probs = torch.zeros(total, max_new, dtype=torch.float32, device=device)
    lengths = torch.full((total,), max_new, dtype=torch.long, device=device)
    # per slot: its output row (-1 = free), tokens generated, next column, next position,
    # the token to feed, and the columns it may attend to
    slot_row = torch.full((slots,), -1, dtype=torch.long, device=device)
    slot_step = torch.zeros(slots, dtype=torch.long, device=device)
    slot_col = torch.zeros(slots, dtype=torch.long, device=device)
    pos_axes = position_ids.shape[2:]  # () for text, (4,) for image prompts
    slot_pos = torch.zeros(slots, *pos_axes, dtype=torch.long, device=device)
    slot_token = torch.full((slots,), engine.pad_token_id, dtype=torch.long, device=device)
    kv_real = torch.zeros(slots, max_len, dtype=torch.bool, device=device)

    # rows still decoding per prompt (host side: read only when a row stops)
    unfinished = [n] * batch
    stats = {"prefill_s": 0.0, "decode_steps": 0.0, "decode_row_steps": 0.0}
    stats |= {"admissions": 0.0, "compactions": 0.0, "prompt_len": float(width_in)}
    next_prompt = 0
    versions = version = col_ids = col_pos = None
    if mailbox is not None:
        version = int(mailbox.held)
        versions = torch.full((total, max_new), -1, dtype=torch.long, device=device)
        stats |= {"weight_swaps": 0.0, "reprefill_rows": 0.0, "reprefill_tokens": 0.0}
        stats["reprefill_s"] = 0.0
        if mailbox.mode == "resume":  # each cache column's token and position, to prefill again
            col_ids = torch.zeros(slots, max_len, dtype=torch.long, device=device)
            col_pos = torch.zeros(slots, max_len, *pos_axes, dtype=torch.long, device=device)

    def record(slot_idx: torch.Tensor, logits: torch.Tensor) -> None:
        """Sample the rows in ``slot_idx`` from ``logits`` (len, vocab); free the stopped."""
        rows, steps = slot_row[slot_idx], slot_step[slot_idx]
        tokens, chosen = engine._sample(logits, rows, steps, params, seed)
        responses[rows, steps] = tokens
        log_probs[rows, steps] = chosen
        if versions is not None:
            versions[rows, steps] = version
        done = steps + 1 >= max_new
        if stop_ids is not None:
            done |= torch.isin(tokens, stop_ids)
        if checker:
            tails = []
            for row, step in zip(rows.tolist(), steps.tolist()):
                start = max(0, step + 1 - checker.window)
                tails.append(responses[row, start : step + 1].tolist())
            done |= torch.tensor(checker.hits(tails), dtype=torch.bool, device=device)
        lengths[rows[done]] = steps[done] + 1
        slot_token[slot_idx] = tokens
        slot_step[slot_idx] = steps + 1
        freed = slot_idx[done]
        slot_row[freed] = -1
        slot_col[freed] = 0
        if on_group is not None and bool(done.any()):
            for row in rows[done].tolist():
                unfinished[row // n] -= 1
                if unfinished[row // n] == 0:
                    rows_of = slice(row // n * n, row // n * n + n)
                    outs = (responses[rows_of], log_probs[rows_of], lengths[rows_of])
                    if versions is not None:
                        outs += (versions[rows_of],)
                    on_group(row // n, *outs)

    def admit() -> None:
        """Fill free slots with whole prompts (n samples each) and sample their first
        token; repeats while a prompt's rows all stop at once and slots free up again."""
        nonlocal next_prompt
        while next_prompt < batch:
            free = (slot_row < 0).nonzero().flatten()
            count = min(int(free.numel()) // n, batch - next_prompt)
            if count == 0:
                return
            t0 = time.perf_counter()
            first, last = next_prompt, next_prompt + count
            real = key_real[first:last]
            lead = int(real.any(dim=0).int().argmax())  # columns padding in all of them
            real = real[:, lead:]
            ids = input_ids[first:last, lead:]
            pos = position_ids[first:last, lead:]
            plen = ids.shape[1]
            prefill = PreallocatedKVCache(
                engine._num_layers, count * n, plen, repeats=n, dtype=kv_dtype, round_to=kv_round
            )
            logits = engine._forward(
                ids,
                engine._prefill_mask(real, dtype),
                pos,
                prefill,
                inputs=images.rows(first, last).model_inputs() if images is not None else None,
            )
            target = free[: count * n]
            cache.insert(target, prefill, plen)
            if col_ids is not None:
                col_ids[target, :plen] = ids.repeat_interleave(n, dim=0)
                col_pos[target, :plen] = pos.repeat_interleave(n, dim=0)
            kv_real[target] = False
            kv_real[target, :plen] = real.repeat_interleave(n, dim=0)
            slot_row[target] = torch.arange(first * n, last * n, device=device)
            slot_step[target] = 0
            slot_col[target] = plen
            slot_pos[target] = pos[:, -1].repeat_interleave(n, dim=0) + 1
            next_prompt = last
            stats["admissions"] += 1
            stats["prefill_s"] += time.perf_counter() - t0
            record(target, logits.repeat_interleave(n, dim=0) if n > 1 else logits)

    def reprefill() -> None:
        """resume: the running rows' cache columns written again by the new weights (one
        forward over their prompt + fed tokens, right-padded to the longest)."""
        idx = (slot_row >= 0).nonzero().flatten()
        if idx.numel() == 0:
            return
        t0 = time.perf_counter()
        width = int(slot_col[idx].max())
        real = kv_real[idx, :width]
        prefill = PreallocatedKVCache(
            engine._num_layers, int(idx.numel()), width, dtype=kv_dtype, round_to=kv_round
        )
        engine._forward(
            col_ids[idx, :width], engine._prefill_mask(real, dtype), col_pos[idx, :width], prefill
        )
        cache.insert(idx, prefill, width)
        stats["reprefill_rows"] += float(idx.numel())
        stats["reprefill_tokens"] += float(real.sum())
        stats["reprefill_s"] += time.perf_counter() - t0

    while True:
        if mailbox is not None:
            swapped = mailbox.poll(engine.module)
            if swapped is not None:
                version = swapped
                stats["weight_swaps"] += 1
                if col_ids is not None:
                    reprefill()
        admit()
        running = slot_row >= 0
        if not bool(running.any()):
            break
        free_count = slots - int(running.sum())
        if next_prompt >= batch and free_count:
            threshold = max(1, math.ceil(engine.compaction_threshold * slots))
            if engine.compaction and free_count >= threshold:
                keep = running.nonzero().flatten()
                width = int(slot_col[keep].max()) + 1
                cache.select_rows(keep, min(width, max_len))
                slot_row, slot_step, slot_col = slot_row[keep], slot_step[keep], slot_col[keep]
                slot_pos, slot_token = slot_pos[keep], slot_token[keep]
                kv_real = kv_real[keep]
                if col_ids is not None:
                    col_ids, col_pos = col_ids[keep], col_pos[keep]
                slots = int(keep.numel())
                running = slot_row >= 0
                stats["compactions"] += 1
        # Free slots decode a pad token at column 0 (never fully masked, never read).
        rows_ix = torch.arange(slots, device=device)
        kv_real[rows_ix, slot_col] = True
        if col_ids is not None:
            col_ids[rows_ix, slot_col] = slot_token
            col_pos[rows_ix, slot_col] = slot_pos
        width = int(slot_col.max()) + 1
        cache.begin_step(slot_col, width)
        logits = engine._forward(
            slot_token.unsqueeze(1),
            engine._decode_mask(kv_real, width, dtype),
            slot_pos.unsqueeze(1),
            cache,
            decode=True,
        )
        stats["decode_steps"] += 1
        stats["decode_row_steps"] += float(slots)
        kv_real[~running, 0] = False
        slot_col = torch.where(running, slot_col + 1, slot_col)
        slot_pos = slot_pos + 1
        idx = running.nonzero().flatten()
        record(idx, logits[idx])
    return responses, log_probs, lengths, stats, versions
