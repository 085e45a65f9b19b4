"""Sequence packing: the real tokens of a padded batch laid end to end, no padding compute.

A padded batch is ``cat(prompt, response)`` per row: prompts left-padded to ``P`` columns,
responses right-padded to ``R``. Row ``i`` has ``p_i`` prompt and ``r_i`` response tokens,
``l_i = p_i + r_i`` in all. Packing places the rows' real tokens one after another in a few
packed rows ("bins") of ``capacity`` columns (first-fit decreasing, so a bin's leftover is
small), with position ids restarting at 0 for every sequence. Given ``position_ids`` and no
attention mask, transformers (>= 4.5x, 5.x) detects the restarts and builds a
block-diagonal causal mask (``masking_utils.find_packed_sequence_indices``) for the eager
and sdpa kernels; flash-attention uses them as varlen boundaries. Attention never crosses a
sequence, so every token sees exactly what it saw in the padded row, and the results agree
with the padded pass up to float rounding (tests: within 1e-5). With sdpa attention the
packer's ``blocks`` (one per sequence) let :mod:`verl.kernels.block_attention` attend each
sequence's own keys only instead of the whole bin under a mask
(:func:`verl.kernels.packed_model.packed_forward`).

The capacity is at least the longest sequence; by default bins hold between
``_MIN_CAPACITY`` and twice that many tokens (or one sequence), so short sequences share a
bin while attention, which costs a bin's length squared, stays a small share of the
compute; the tokens are spread evenly over the bins, so none is mostly filler.

When rows share a prompt (``rollout.n`` samples), :mod:`verl.kernels.prefix_packing` packs
the prompt once per group instead, with an explicit attention mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MIN_CAPACITY = 256


@dataclass
class PackedBatch:
    """A padded batch packed into bins.

    ``input_ids`` / ``position_ids`` ``(bins, capacity)``; ``response_index`` ``(n,)`` the
    flat positions (into ``bins * capacity``) of the hidden states that predict the ``n``
    valid response tokens, whose ids are ``labels`` ``(n,)`` and whose place in the padded
    ``(rows, R)`` layout is the boolean ``response_mask`` (row-major order).
    ``attention_mask``: ``None`` (the model derives the block-diagonal causal mask from the
    restarting positions) or an explicit ``(bins, capacity, capacity)`` boolean mask, True
    where a query token may attend a key token (shared-prompt packing,
    :mod:`verl.kernels.prefix_packing`).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    response_index: torch.Tensor
    labels: torch.Tensor
    response_mask: torch.Tensor
    attention_mask: torch.Tensor | None = None
    # the attention structure as blocks (verl.kernels.block_attention.Block): each real token is
    # a query of exactly one block; None when the packer did not record them
    blocks: list[tuple[int, int, int, int]] | None = None

    @property
    def num_tokens(self) -> int:
        """Columns computed: ``bins * capacity`` (padding included)."""
        return self.input_ids.numel()


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Rows grouped into bins of at most ``capacity`` tokens (longest rows placed first)."""
    if any(n > capacity for n in lengths):
        raise ValueError(f"a sequence of {max(lengths)} tokens exceeds capacity={capacity}")
    bins: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda k: -lengths[k]):
        for b, room in enumerate(free):
            if lengths[i] <= room:
                bins[b].append(i)
                free[b] -= lengths[i]
                break
        else:
            bins.append([i])
            free.append(capacity - lengths[i])
    return bins


def plan_bins(lengths: list[int]) -> list[list[int]]:
    """The default packing of sequences of ``lengths`` tokens: ``total // max(longest,
    _MIN_CAPACITY)`` bins (at least one), the tokens spread evenly over them, the capacity
    raised in small steps until first-fit decreasing fits them in that many, so no bin is
    left mostly filler (filler costs compute like padding). When the sequences are long
    and alike (shared-prompt units of one size), that plan can still leave bins half
    filler; one sequence per capacity of the longest is then taken instead, whichever
    computes fewer columns (bins x width; the narrower on a tie: attention costs width
    squared)."""
    longest, total = max(lengths, default=1), sum(lengths)
    count = max(1, total // max(longest, _MIN_CAPACITY))
    capacity = max(longest, -(-total // count))
    while True:
        bins = first_fit_decreasing(lengths, capacity)
        if len(bins) <= count:
            break
        capacity += max(1, longest // 8)
    if not lengths:
        return bins

    def cost(plan: list[list[int]]) -> tuple[int, int]:
        width = max(sum(lengths[i] for i in b) for b in plan)
        return len(plan) * width, width

    tight = first_fit_decreasing(lengths, longest)
    return min((bins, tight), key=cost)


def row_lengths(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int, who: str
) -> tuple[list[int], list[int]]:
    """Real prompt and response tokens of each row of a padded ``(rows, P + R)`` batch, after
    checking its shapes (``who`` names the caller in the errors)."""
    seq_len = input_ids.shape[1]
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask {tuple(attention_mask.shape)} != input_ids {tuple(input_ids.shape)}"
        )
    if not 0 < response_len < seq_len:
        raise ValueError(f"response_len={response_len} must be in [1, {seq_len - 1}]")
    mask = attention_mask.cpu().bool()
    prompt_lens = mask[:, : seq_len - response_len].sum(-1).tolist()
    response_lens = mask[:, seq_len - response_len :].sum(-1).tolist()
    if any(p == 0 and r > 0 for p, r in zip(prompt_lens, response_lens, strict=True)):
        raise ValueError(f"{who}: a row has response tokens but no prompt token")
    return prompt_lens, response_lens


def bins_and_width(
    lengths: list[int], capacity: int | None, width_multiple: int = 1
) -> tuple[list[list[int]], int]:
    """Bins of sequences of ``lengths`` tokens (:func:`plan_bins` when ``capacity`` is None)
    and the packed width: the fullest bin's length (not the capacity), rounded up to a
    multiple of ``width_multiple`` (the extra columns are filler)."""
    if width_multiple < 1:
        raise ValueError(f"width_multiple={width_multiple} must be >= 1")
    bins = plan_bins(lengths) if capacity is None else first_fit_decreasing(lengths, capacity)
    width = max(1, max(sum(lengths[i] for i in b) for b in bins))
    return bins, -(-width // width_multiple) * width_multiple


def pack_sequences(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    capacity: int | None = None,
    pad_token_id: int = 0,
    width_multiple: int = 1,
) -> PackedBatch:
    """Pack a padded batch (see the module docstring).

    Args:
        input_ids / attention_mask: ``(rows, P + R)``, prompts left-padded, responses
            right-padded (each row's real tokens are contiguous).
        response_len: ``R``.
        capacity: tokens per bin (at least the longest sequence); default
            :func:`plan_bins`. The packed width is the fullest bin's length.
        pad_token_id: id of the bins' trailing filler (its outputs are never read).
        width_multiple: round the packed width up to a multiple of this (filler columns),
            so that passes see few distinct shapes (see
            :func:`verl.kernels.packed_model.shape_multiple`).
    """
    rows, seq_len = input_ids.shape
    prompt_width = seq_len - response_len
    prompt_list, response_list = row_lengths(
        input_ids, attention_mask, response_len, "pack_sequences"
    )
    mask = attention_mask.bool()
    prompt_lens = torch.tensor(prompt_list, dtype=torch.long)
    lengths = [p + r for p, r in zip(prompt_list, response_list, strict=True)]
    bins, capacity = bins_and_width(lengths, capacity, width_multiple)
    # where each row starts in the flat (bins * capacity) layout
    starts = [0] * rows
    for b, members in enumerate(bins):
        offset = b * capacity
        for i in members:
            starts[i] = offset
            offset += lengths[i]
    flat_ids = torch.full((len(bins) * capacity,), pad_token_id, dtype=input_ids.dtype)
    flat_pos = torch.zeros(len(bins) * capacity, dtype=torch.long)
    valid = mask.cpu()
    tokens = input_ids.cpu()[valid]  # real tokens, row after row, in order
    start_t = torch.tensor(starts, dtype=torch.long)
    lengths_t = torch.tensor(lengths, dtype=torch.long)
    # position of each real token within its sequence, and its flat destination
    within = torch.arange(int(lengths_t.sum())) - torch.repeat_interleave(
        torch.cumsum(lengths_t, 0) - lengths_t, lengths_t
    )
    dest = torch.repeat_interleave(start_t, lengths_t) + within
    flat_ids[dest] = tokens
    flat_pos[dest] = within
    # filler at the end of a bin counts up from 0 as a sequence of its own
    used = torch.zeros(len(bins) * capacity, dtype=torch.bool)
    used[dest] = True
    filler = ~used.view(len(bins), capacity)
    filler_pos = (filler.cumsum(-1) - 1).clamp_min(0)
    flat_pos = torch.where(filler.reshape(-1), filler_pos.reshape(-1), flat_pos)
    # response token j of row i is predicted by the hidden state at start + p_i - 1 + j
    response_mask = valid[:, prompt_width:]
    j = torch.arange(response_len).expand(rows, response_len)
    index = (start_t + prompt_lens.cpu() - 1)[:, None] + j
    response_index = index[response_mask]
    labels = input_ids.cpu()[:, prompt_width:][response_mask]
    device = input_ids.device
    return PackedBatch(
        input_ids=flat_ids.view(len(bins), capacity).to(device),
        position_ids=flat_pos.view(len(bins), capacity).to(device),
        response_index=response_index.to(device),
        labels=labels.to(device),
        response_mask=response_mask.to(device),
        blocks=[(starts[i], lengths[i], 0, 0) for i in range(rows) if lengths[i] > 0],
    )
