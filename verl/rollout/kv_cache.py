"""A preallocated key/value cache for batched decoding that plugs into HF models.

Each layer owns one ``(rows, kv_heads, max_len, head_dim)`` buffer for keys and one for
values, allocated once at the first (prefill) write. Decoding writes one column in place and
hands the attention a view of the filled prefix, so a step never reallocates (transformers'
``DynamicCache`` concatenates, i.e. copies the whole cache, every step) and attention only
spans the tokens written so far (``StaticCache`` attends over all ``max_len`` columns).

Two batch operations support the rollout engine:

- the prefill write can fan out: with ``repeats=n`` the ``B`` prompts' keys are written to
  ``B * n`` rows in ``repeat_interleave`` order, so a prompt is encoded once and shared by
  its ``n`` samples;
- ``select_rows`` keeps only the rows still generating (copying just the filled prefix), so
  finished sequences stop costing attention and projection compute.

All layers advance together: every row has the same number of cache columns, padding inside
them is handled by the attention mask.

:class:`SlotKVCache` is the continuous-batching variant: every row (a slot) has a length of
its own, decode writes go to each row's own next column, and a slot is refilled with a new
prompt's prefill (copied from a :class:`PreallocatedKVCache`) while the other rows keep
their columns.

With ``static=True`` (for a ``torch.compile``-d decode step) every decode write goes to the
column held in a tensor (``index_copy_``) and the attention gets the whole ``max_len`` buffer,
so the shapes a decode step sees never change; the caller masks the unwritten columns.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

__all__ = ["PreallocatedKVCache", "SlotKVCache"]


class _PreallocatedLayer(CacheLayerMixin):
    is_sliding = False

    def __init__(
        self,
        rows: int,
        max_len: int,
        repeats: int,
        static: bool = False,
        dtype: torch.dtype | None = None,
        round_to: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.rows = rows
        self.max_len = max_len
        self.repeats = repeats
        self.static = static
        self.store_dtype = dtype
        self.round_to = round_to
        self.length = 0
        # static mode: the next column to write, as a tensor so a compiled step reads no int
        self.column = torch.zeros(1, dtype=torch.long)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        _, heads, _, k_dim = key_states.shape
        # A static cache hands attention its unwritten columns too (masked): they must hold
        # zeros, not allocator garbage, since a masked NaN still turns the output into NaN.
        alloc = torch.zeros if self.static else torch.empty
        dtype = self.store_dtype or key_states.dtype
        like = {"dtype": dtype, "device": key_states.device}
        self.keys = alloc(self.rows, heads, self.max_len, k_dim, **like)
        self.values = alloc(self.rows, heads, self.max_len, value_states.shape[-1], **like)
        self.dtype, self.device = dtype, key_states.device
        self.column = self.column.to(self.device)
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.static and self.is_initialized:
            return self._static_update(key_states, value_states)
        new = key_states.shape[-2]
        start, end = self.length, self.length + new
        if end > self.max_len:
            raise RuntimeError(f"KV cache overflow: {end} tokens > max_len={self.max_len}")
        first = not self.is_initialized
        if first:
            self.lazy_initialization(key_states, value_states)
        key_states, value_states = self._stored(key_states), self._stored(value_states)
        if first and self.repeats > 1:
            # Fan the prompts out to their samples: a broadcast write, no extra copy.
            b, h = key_states.shape[:2]
            n = self.repeats
            k_view = self.keys.view(b, n, h, self.max_len, -1)
            v_view = self.values.view(b, n, h, self.max_len, -1)
            k_view[:, :, :, start:end] = key_states.unsqueeze(1)
            v_view[:, :, :, start:end] = value_states.unsqueeze(1)
            self.length = end
            self.column.fill_(end)
            # The prefill's own attention needs only the un-repeated prompt rows.
            return key_states, value_states
        self.keys[:, :, start:end] = key_states
        self.values[:, :, start:end] = value_states
        self.length = end
        self.column.fill_(end)
        return self.keys[:, :, :end], self.values[:, :, :end]

    def _static_update(
        self, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # No Python int is read or written here: a compiled decode step keeps one graph for
        # every column. ``length`` is advanced by the caller (``PreallocatedKVCache.advance``).
        index = self.column + torch.arange(key_states.shape[-2], device=self.column.device)
        self.keys.index_copy_(2, index, self._stored(key_states))
        self.values.index_copy_(2, index, self._stored(value_states))
        self.column.add_(key_states.shape[-2])
        return self.keys, self.values

    def _stored(self, states: torch.Tensor) -> torch.Tensor:
        """``states`` as the cache holds them: rounded to ``round_to``, in the cache's dtype."""
        if self.round_to is not None:
            states = states.to(self.round_to)
        return states.to(self.dtype)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if self.static and self.is_initialized:
            return self.max_len, 0
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.max_len

    def select_rows(self, index: torch.Tensor) -> None:
        if not self.is_initialized:
            self.rows = int(index.numel())
            return
        filled = self.length
        keys = self.keys.new_empty(index.numel(), *self.keys.shape[1:])
        values = self.values.new_empty(index.numel(), *self.values.shape[1:])
        # Only the filled prefix is worth copying.
        keys[:, :, :filled] = self.keys[:, :, :filled].index_select(0, index)
        values[:, :, :filled] = self.values[:, :, :filled].index_select(0, index)
        self.keys, self.values = keys, values
        self.rows = int(index.numel())

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.select_rows(indices)


class PreallocatedKVCache(Cache):
    """KV cache of ``num_layers`` preallocated layers for ``rows`` sequences of ``max_len``.

    ``repeats`` > 1 makes the first write (prefill of ``rows // repeats`` prompts) fill the
    rows in ``repeat_interleave`` order. Pass it as ``past_key_values`` with
    ``use_cache=True``; the caller supplies ``position_ids`` and the attention mask.

    ``dtype``: the buffers' dtype (default: that of the first keys written). ``round_to``:
    keys and values are rounded to this dtype before they are stored, e.g. float32 buffers
    holding bf16 values, which the decode attention of :mod:`verl.kernels.decode_attention`
    reads under bf16 autocast without converting the cache at every step.
    """

    def __init__(
        self,
        num_layers: int,
        rows: int,
        max_len: int,
        repeats: int = 1,
        static: bool = False,
        dtype: torch.dtype | None = None,
        round_to: torch.dtype | None = None,
    ) -> None:
        if rows % repeats:
            raise ValueError(f"rows={rows} is not a multiple of repeats={repeats}")
        super().__init__(
            layers=[
                _PreallocatedLayer(rows, max_len, repeats, static, dtype, round_to)
                for _ in range(num_layers)
            ]
        )
        self.static = static

    @property
    def length(self) -> int:
        """Columns written so far (prompt + fed-back tokens), the same for every layer."""
        return self.layers[0].length

    def advance(self, columns: int = 1) -> None:
        """static mode: record ``columns`` decode writes made since the last call (each layer
        counts its own writes in a tensor; this keeps ``length`` true for the caller)."""
        for layer in self.layers:
            layer.length += columns
            if layer.length > layer.max_len:
                raise RuntimeError(
                    f"KV cache overflow: {layer.length} tokens > max_len={layer.max_len}"
                )

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only rows ``index`` (1-D long), in that order."""
        for layer in self.layers:
            layer.select_rows(index)


class _SlotLayer(CacheLayerMixin):
    """One layer of a :class:`SlotKVCache`: ``(slots, kv_heads, max_len, head_dim)`` buffers,
    zero-filled at allocation (columns past a row's length are masked, and a masked NaN
    would still reach the output through the value matmul)."""

    is_sliding = False

    def __init__(self, owner: SlotKVCache) -> None:
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.allocate(key_states, value_states)

    def allocate(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        o = self.owner
        like = {"dtype": keys.dtype, "device": keys.device}
        self.keys = torch.zeros(o.slots, keys.shape[1], o.max_len, keys.shape[-1], **like)
        self.values = torch.zeros(o.slots, values.shape[1], o.max_len, values.shape[-1], **like)
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        o = self.owner
        if key_states.shape[-2] != 1 or o.columns is None:
            raise RuntimeError(
                "SlotKVCache takes decode steps only (one token per row, after begin_step); "
                "prefill goes through a PreallocatedKVCache and SlotKVCache.insert"
            )
        rows = torch.arange(key_states.shape[0], device=key_states.device)
        self.keys[rows, :, o.columns] = self._stored(key_states[:, :, 0])
        self.values[rows, :, o.columns] = self._stored(value_states[:, :, 0])
        return self.keys[:, :, : o.width], self.values[:, :, : o.width]

    def _stored(self, states: torch.Tensor) -> torch.Tensor:
        if self.owner.round_to is not None:
            states = states.to(self.owner.round_to)
        return states.to(self.keys.dtype)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.width, 0

    def get_seq_length(self) -> int:
        return max(self.owner.width - 1, 0)

    def get_max_length(self) -> int:
        return self.owner.max_len


class SlotKVCache(Cache):
    """KV cache of ``slots`` rows for continuous batching: each row has its own length.

    - :meth:`insert` copies the filled prefix of a prefill cache (rows of newly admitted
      prompts, their ``n`` samples fanned out) into the given slots; the slot's later
      columns keep a previous occupant's values, which the caller's mask hides.
    - :meth:`begin_step` ``(columns, width)`` before each decode forward: row ``i`` writes
      its new key / value at ``columns[i]`` and the attention sees columns ``[0, width)``
      of every row (``width`` > every ``columns[i]``); the caller's 4-D mask says which of
      them each row may attend to.
    - :meth:`select_rows` keeps some rows (compaction once no prompt waits for a slot).

    ``dtype`` / ``round_to`` as in :class:`PreallocatedKVCache`; the buffers take the dtype
    of the first inserted cache when ``dtype`` is None.
    """

    def __init__(
        self,
        num_layers: int,
        slots: int,
        max_len: int,
        dtype: torch.dtype | None = None,
        round_to: torch.dtype | None = None,
    ) -> None:
        self.slots = slots
        self.max_len = max_len
        self.store_dtype = dtype
        self.round_to = round_to
        self.columns: torch.Tensor | None = None
        self.width = 0
        super().__init__(layers=[_SlotLayer(self) for _ in range(num_layers)])

    def insert(self, slots: torch.Tensor, prefill: PreallocatedKVCache, columns: int) -> None:
        """Copy columns ``[0, columns)`` of every row of ``prefill`` (already rounded and in
        its storage dtype) into rows ``slots`` (1-D long, one per prefill row)."""
        if columns > self.max_len:
            raise RuntimeError(f"KV cache overflow: {columns} tokens > max_len={self.max_len}")
        for mine, theirs in zip(self.layers, prefill.layers):
            keys, values = theirs.keys[:, :, :columns], theirs.values[:, :, :columns]
            if not mine.is_initialized:
                dtype = self.store_dtype or keys.dtype
                mine.allocate(keys.to(dtype), values.to(dtype))
            mine.keys[slots, :, :columns] = keys.to(mine.keys.dtype)
            mine.values[slots, :, :columns] = values.to(mine.values.dtype)

    def begin_step(self, columns: torch.Tensor, width: int) -> None:
        """The next decode forward writes row ``i`` at ``columns[i]`` (1-D long) and attends
        over ``width`` columns."""
        if width > self.max_len:
            raise RuntimeError(f"KV cache overflow: {width} tokens > max_len={self.max_len}")
        self.columns, self.width = columns, width

    def select_rows(self, index: torch.Tensor, width: int) -> None:
        """Keep only rows ``index`` (1-D long), in that order; copies ``width`` columns."""
        for layer in self.layers:
            if not layer.is_initialized:
                continue
            keys = layer.keys.new_zeros(index.numel(), *layer.keys.shape[1:])
            values = layer.values.new_zeros(index.numel(), *layer.values.shape[1:])
            keys[:, :, :width] = layer.keys[:, :, :width].index_select(0, index)
            values[:, :, :width] = layer.values[:, :, :width].index_select(0, index)
            layer.keys, layer.values = keys, values
        self.slots = int(index.numel())
