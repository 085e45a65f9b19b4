"""The continuous loop's state: ``S`` KV-cache slots shared by the prompt batches of one or
more generation calls (:mod:`verl.rollout.continuous` describes the loop and its contract).

A :class:`ContinuousSession` holds the slots and the :class:`Segment` of every prompt batch
admitted into them: a segment is one ``generate`` call's batch, with its own sampling seed,
output buffers, group callback and prompt cursor. Slot ``i`` runs output row
``slot_row[i]`` of segment ``slot_seg[i]``; a row samples with its segment's seed, its row
within its segment and its own token index (:func:`~verl.rollout.sampling.row_uniforms`),
so it draws what its own call would draw alone.

:meth:`ContinuousSession.run` decodes until one segment (the calling ``generate``'s) has
finished every row; the rows of other segments still in flight stay in their slots, and the
session waits (suspended, on the engine) for the call that owns them. When every admitted
prompt has a slot and ``n`` or more slots are free, ``more`` is asked for another batch
(the next queued call's, :class:`~verl.rollout.continuous.PromptFeed`): its segment joins the
running loop, and its rows start while the current call's long tail decodes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

import torch

from verl.rollout.kv_cache import PreallocatedKVCache, SlotKVCache

if TYPE_CHECKING:
    from verl.rollout.base import SamplingParams
    from verl.rollout.images import PromptImages
    from verl.rollout.native import NativeRollout
    from verl.rollout.partial import WeightMailbox
    from verl.rollout.stopping import StopStringChecker

__all__ = ["ContinuousSession", "Segment"]


class Segment:
    """One call's prompt batch in a session: ``input_ids`` / ``key_real`` /
    ``position_ids`` (B, P[, 4]) left-padded on the engine's device, its ``params`` and
    ``seed`` (None: greedy); ``on_group(prompt, responses, log_probs, lengths[, versions])``
    as in :func:`~verl.rollout.continuous.generate_continuous`; ``key`` names the call
    that owns it. Outputs: ``responses`` / ``log_probs`` / ``versions`` (B*n, R),
    ``lengths`` (B*n,)."""

    def __init__(
        self,
        key: Hashable,
        input_ids: torch.Tensor,
        key_real: torch.Tensor,
        position_ids: torch.Tensor,
        params: SamplingParams,
        seed: int | None,
        *,
        on_group: Callable[..., None] | None = None,
        images: PromptImages | None = None,
        with_versions: bool = False,
    ) -> None:
        self.key = key
        self.input_ids, self.key_real, self.position_ids = input_ids, key_real, position_ids
        self.params, self.seed = params, seed
        self.on_group, self.images = on_group, images
        self.batch = int(input_ids.shape[0])
        n, max_new, device = params.n, params.max_new_tokens, input_ids.device
        total = self.batch * n
        self.responses = torch.empty(total, max_new, dtype=torch.long, device=device)
        self.log_probs = torch.zeros(total, max_new, dtype=torch.float32, device=device)
        self.lengths = torch.full((total,), max_new, dtype=torch.long, device=device)
        self.versions = (
            torch.full((total, max_new), -1, dtype=torch.long, device=device)
            if with_versions
            else None
        )
        self.unfinished = [n] * self.batch  # rows still decoding per prompt
        self.open_prompts = self.batch  # prompts with a row still decoding
        self.next_prompt = 0  # the first prompt not admitted yet

    @property
    def done(self) -> bool:
        return self.open_prompts == 0

    def matches(
        self,
        input_ids: torch.Tensor,
        key_real: torch.Tensor,
        position_ids: torch.Tensor,
        params: SamplingParams,
        seed: int | None,
    ) -> bool:
        """Whether a call with these prompts and sampling is this segment's."""
        return (
            self.params == params
            and self.seed == seed
            and self.input_ids.shape == input_ids.shape
            and torch.equal(self.input_ids, input_ids)
            and torch.equal(self.key_real, key_real)
            and self.position_ids.shape == position_ids.shape
            and torch.equal(self.position_ids, position_ids)
        )


class ContinuousSession:
    """``slots`` KV-cache rows for prompts of at most ``prompt_width`` tokens and
    ``params.max_new_tokens`` new ones, with the sampling ``params`` (but the seed) every
    segment shares (module docstring). ``mailbox``: partial rollouts
    (:mod:`verl.rollout.partial`), polled before each admission / decode step."""

    def __init__(
        self,
        engine: NativeRollout,
        *,
        slots: int,
        prompt_width: int,
        params: SamplingParams,
        stop_ids: torch.Tensor | None,
        checker: StopStringChecker,
        mailbox: WeightMailbox | None,
        pos_axes: tuple[int, ...],
        device: torch.device,
    ) -> None:
        self.engine = engine
        self.n, self.max_new = params.n, params.max_new_tokens
        self.prompt_width = prompt_width
        self.stop_ids, self.checker, self.mailbox = stop_ids, checker, mailbox
        self.device = device
        self.dtype = next(engine.module.parameters()).dtype
        self.max_len = prompt_width + self.max_new - 1
        self.kv_dtype, self.kv_round = engine._cache_precision(device)
        self.cache = SlotKVCache(
            engine._num_layers, slots, self.max_len, dtype=self.kv_dtype, round_to=self.kv_round
        )
        self.full_slots = self.slots = slots
        # per slot: its segment and output row there (-1 = free), tokens generated, next
        # column, next position, the token to feed, and the columns it may attend to
        self.slot_seg = torch.zeros(slots, dtype=torch.long, device=device)
        self.slot_row = torch.full((slots,), -1, dtype=torch.long, device=device)
        self.slot_step = torch.zeros(slots, dtype=torch.long, device=device)
        self.slot_col = torch.zeros(slots, dtype=torch.long, device=device)
        self.slot_pos = torch.zeros(slots, *pos_axes, dtype=torch.long, device=device)
        self.slot_token = torch.full((slots,), engine.pad_token_id, dtype=torch.long, device=device)
        self.kv_real = torch.zeros(slots, self.max_len, dtype=torch.bool, device=device)
        self.segments: dict[int, Segment] = {}  # by id, in admission order
        self._next_id = 0
        self.stats = {"prefill_s": 0.0, "decode_steps": 0.0, "decode_row_steps": 0.0}
        self.stats |= {"admissions": 0.0, "compactions": 0.0, "fed_batches": 0.0}
        self.version = self.col_ids = self.col_pos = None
        if mailbox is not None:
            self.version = int(mailbox.held)
            self.stats |= {"weight_swaps": 0.0, "reprefill_rows": 0.0, "reprefill_tokens": 0.0}
            self.stats["reprefill_s"] = 0.0
            if mailbox.mode == "resume":  # each column's token and position, to prefill again
                self.col_ids = torch.zeros(slots, self.max_len, dtype=torch.long, device=device)
                self.col_pos = torch.zeros(
                    slots, self.max_len, *pos_axes, dtype=torch.long, device=device
                )

    # ------------------------------------------------------------------ segments
    def add(self, segment: Segment) -> Segment:
        """Admit ``segment``'s prompts as slots free up; the slots a compaction dropped come
        back first."""
        self.segments[self._next_id] = segment
        self._next_id += 1
        if self.slots < self.full_slots:
            self._resize(self.full_slots)
        return segment

    def find(self, key: Hashable) -> Segment | None:
        return next((s for s in self.segments.values() if s.key == key), None)

    def holds(self) -> bool:
        """Whether a segment waits for its call (rows in flight, or finished outputs)."""
        return bool(self.segments)

    def fits(self, key_real: torch.Tensor) -> bool:
        """Whether prompts with this (B, P) mask fit the cache (their columns that are
        padding in every row dropped)."""
        lead = int(key_real.any(dim=0).int().argmax())
        return key_real.shape[1] - lead <= self.prompt_width

    def _waiting(self) -> bool:
        return any(s.next_prompt < s.batch for s in self.segments.values())

    # ------------------------------------------------------------------ the loop
    def run(self, target: Segment, more: Callable[[], Segment | None] | None = None) -> None:
        """Decode until every row of ``target`` has stopped; ``more()``: another batch's
        segment for the free slots, or None (module docstring)."""
        n, engine = self.n, self.engine
        while not target.done:
            if self.mailbox is not None:
                swapped = self.mailbox.poll(engine.module)
                if swapped is not None:
                    self.version = swapped
                    self.stats["weight_swaps"] += 1
                    if self.col_ids is not None:
                        self._reprefill()
            self._admit()
            # a feed is asked once n slots are free: compaction waits for its "nothing"
            may_compact = more is None
            if more is not None and not self._waiting() and int((self.slot_row < 0).sum()) >= n:
                segment = more()
                if segment is not None:
                    self.add(segment)
                    self.stats["fed_batches"] += 1
                    self._admit()
                else:
                    may_compact = True
            running = self.slot_row >= 0
            if not bool(running.any()):
                break
            free_count = self.slots - int(running.sum())
            if may_compact and not self._waiting() and free_count:
                threshold = max(1, math.ceil(engine.compaction_threshold * self.slots))
                if engine.compaction and free_count >= threshold:
                    self._resize(int(running.sum()), keep=running.nonzero().flatten())
                    self.stats["compactions"] += 1
            self._decode()

    def _decode(self) -> None:
        """One forward over the slots and the sampling of the running rows."""
        engine = self.engine
        running = self.slot_row >= 0
        # Free slots decode a pad token at column 0 (never fully masked, never read).
        rows_ix = torch.arange(self.slots, device=self.device)
        self.kv_real[rows_ix, self.slot_col] = True
        if self.col_ids is not None:
            self.col_ids[rows_ix, self.slot_col] = self.slot_token
            self.col_pos[rows_ix, self.slot_col] = self.slot_pos
        width = int(self.slot_col.max()) + 1
        self.cache.begin_step(self.slot_col, width)
        logits = engine._forward(
            self.slot_token.unsqueeze(1),
            engine._decode_mask(self.kv_real, width, self.dtype),
            self.slot_pos.unsqueeze(1),
            self.cache,
            decode=True,
        )
        self.stats["decode_steps"] += 1
        self.stats["decode_row_steps"] += float(self.slots)
        self.kv_real[~running, 0] = False
        self.slot_col = torch.where(running, self.slot_col + 1, self.slot_col)
        self.slot_pos = self.slot_pos + 1
        idx = running.nonzero().flatten()
        self._record(idx, logits[idx])

    def _record(self, slot_idx: torch.Tensor, logits: torch.Tensor) -> None:
        """Sample the rows in ``slot_idx`` from ``logits`` (len, vocab), each with its
        segment's seed; free the stopped."""
        segs = self.slot_seg[slot_idx]
        ids = segs.unique().tolist()
        for sid in ids:
            if len(ids) == 1:
                self._record_segment(sid, slot_idx, logits)
            else:
                mine = segs == sid
                self._record_segment(sid, slot_idx[mine], logits[mine])

    def _record_segment(self, sid: int, slot_idx: torch.Tensor, logits: torch.Tensor) -> None:
        seg, n, device = self.segments[sid], self.n, self.device
        rows, steps = self.slot_row[slot_idx], self.slot_step[slot_idx]
        tokens, chosen = self.engine._sample(logits, rows, steps, seg.params, seg.seed)
        seg.responses[rows, steps] = tokens
        seg.log_probs[rows, steps] = chosen
        if seg.versions is not None:
            seg.versions[rows, steps] = self.version
        done = steps + 1 >= self.max_new
        if self.stop_ids is not None:
            done |= torch.isin(tokens, self.stop_ids)
        if self.checker:
            tails = []
            for row, step in zip(rows.tolist(), steps.tolist()):
                start = max(0, step + 1 - self.checker.window)
                tails.append(seg.responses[row, start : step + 1].tolist())
            done |= torch.tensor(self.checker.hits(tails), dtype=torch.bool, device=device)
        seg.lengths[rows[done]] = steps[done] + 1
        self.slot_token[slot_idx] = tokens
        self.slot_step[slot_idx] = steps + 1
        freed = slot_idx[done]
        self.slot_row[freed] = -1
        self.slot_col[freed] = 0
        if bool(done.any()):
            for row in rows[done].tolist():
                prompt = row // n
                seg.unfinished[prompt] -= 1
                if seg.unfinished[prompt] == 0:
                    seg.open_prompts -= 1
                    if seg.on_group is not None:
                        rows_of = slice(prompt * n, prompt * n + n)
                        outs = (seg.responses[rows_of], seg.log_probs[rows_of])
                        outs += (seg.lengths[rows_of],)
                        if seg.versions is not None:
                            outs += (seg.versions[rows_of],)
                        seg.on_group(prompt, *outs)

    def _admit(self) -> None:
        """Fill free slots with whole prompts (n samples each), oldest segment first, and
        sample their first token; repeats while rows stop at once and slots free up."""
        n, engine = self.n, self.engine
        for sid, seg in list(self.segments.items()):
            while seg.next_prompt < seg.batch:
                free = (self.slot_row < 0).nonzero().flatten()
                count = min(int(free.numel()) // n, seg.batch - seg.next_prompt)
                if count == 0:
                    return
                t0 = time.perf_counter()
                first, last = seg.next_prompt, seg.next_prompt + count
                real = seg.key_real[first:last]
                lead = int(real.any(dim=0).int().argmax())  # columns padding in all of them
                real = real[:, lead:]
                ids = seg.input_ids[first:last, lead:]
                pos = seg.position_ids[first:last, lead:]
                plen = ids.shape[1]
                prefill = PreallocatedKVCache(
                    engine._num_layers,
                    count * n,
                    plen,
                    repeats=n,
                    dtype=self.kv_dtype,
                    round_to=self.kv_round,
                )
                images = seg.images
                logits = engine._forward(
                    ids,
                    engine._prefill_mask(real, self.dtype),
                    pos,
                    prefill,
                    inputs=images.rows(first, last).model_inputs() if images is not None else None,
                )
                target = free[: count * n]
                self.cache.insert(target, prefill, plen)
                if self.col_ids is not None:
                    self.col_ids[target, :plen] = ids.repeat_interleave(n, dim=0)
                    self.col_pos[target, :plen] = pos.repeat_interleave(n, dim=0)
                self.kv_real[target] = False
                self.kv_real[target, :plen] = real.repeat_interleave(n, dim=0)
                self.slot_seg[target] = sid
                self.slot_row[target] = torch.arange(first * n, last * n, device=self.device)
                self.slot_step[target] = 0
                self.slot_col[target] = plen
                self.slot_pos[target] = pos[:, -1].repeat_interleave(n, dim=0) + 1
                seg.next_prompt = last
                self.stats["admissions"] += 1
                self.stats["prefill_s"] += time.perf_counter() - t0
                self._record(target, logits.repeat_interleave(n, dim=0) if n > 1 else logits)

    def _reprefill(self) -> None:
        """resume: the running rows' cache columns written again by the new weights (one
        forward over their prompt + fed tokens, right-padded to the longest)."""
        idx = (self.slot_row >= 0).nonzero().flatten()
        if idx.numel() == 0:
            return
        t0 = time.perf_counter()
        engine = self.engine
        width = int(self.slot_col[idx].max())
        real = self.kv_real[idx, :width]
        prefill = PreallocatedKVCache(
            engine._num_layers, int(idx.numel()), width, dtype=self.kv_dtype, round_to=self.kv_round
        )
        engine._forward(
            self.col_ids[idx, :width],
            engine._prefill_mask(real, self.dtype),
            self.col_pos[idx, :width],
            prefill,
        )
        self.cache.insert(idx, prefill, width)
        self.stats["reprefill_rows"] += float(idx.numel())
        self.stats["reprefill_tokens"] += float(real.sum())
        self.stats["reprefill_s"] += time.perf_counter() - t0

    def _resize(self, size: int, keep: torch.Tensor | None = None) -> None:
        """Compaction (``keep``: the slots kept, in order) or growth back to ``size`` slots
        (the current ones first, the new ones free; their buffers copies of slot 0, masked)."""
        if keep is None:
            extra = torch.zeros(size - self.slots, dtype=torch.long, device=self.device)
            index = torch.cat([torch.arange(self.slots, device=self.device), extra])
        else:
            index = keep
        width = min(int(self.slot_col[index].max()) + 1, self.max_len)
        self.cache.select_rows(index, width)
        for name in ("slot_seg", "slot_row", "slot_step", "slot_col", "slot_pos", "slot_token"):
            setattr(self, name, getattr(self, name)[index])
        self.kv_real = self.kv_real[index]
        if self.col_ids is not None:
            self.col_ids, self.col_pos = self.col_ids[index], self.col_pos[index]
        if keep is None:
            new = slice(self.slots, size)
            self.slot_row[new] = -1
            self.slot_step[new] = 0
            self.slot_col[new] = 0
            self.slot_token[new] = self.engine.pad_token_id
            self.kv_real[new] = False
        self.slots = size

    def release(self, segment: Segment) -> None:
        """Forget ``segment`` (finished, its outputs taken by its call)."""
        for sid in [s for s, seg in self.segments.items() if seg is segment]:
            del self.segments[sid]

    def counters(self) -> dict[str, Any]:
        return dict(self.stats)
