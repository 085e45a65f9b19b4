"""Shared-prompt packing: the rows of a GRPO group computed with their prompt once.

With ``rollout.n > 1`` the ``n`` samples of a prompt repeat its tokens. Plain packing
(:mod:`verl.kernels.packing`) lays every row out whole, so the prompt is computed ``n``
times, forward and backward. Here the rows of a micro-batch whose real prompt ids are
identical (found by the ids, never by ``uid``, so sharing is always exact) become one
packed sequence ``[prompt, response_1, ..., response_k]`` (a "unit"):

- positions: the prompt ``0 .. p-1``; every response continues from ``p``, as in its own
  padded row;
- attention (an explicit ``(bins, capacity, capacity)`` boolean mask, True = may attend):
  a prompt token sees the earlier prompt tokens; a token of response ``i`` sees the whole
  prompt and the earlier tokens of response ``i``, never another response or another unit;
- the hidden state that predicts response ``i``'s first token is the prompt's last one,
  shared by the group (``response_index`` repeats it); the others are response ``i``'s own.

Every token then sees exactly the keys, at exactly the positions, of its padded row, so
the log-probs, entropies and gradients equal the padded pass up to float rounding (the
gradient of a shared prompt state is the sum over the responses, as it is when the prompt
is computed once per row). Units are packed into bins by :func:`verl.kernels.packing.plan_bins`
(block-diagonal across units); a group whose unit would pass ``max_unit`` tokens is cut
into several units, each with its own copy of the prompt, so a bin's attention (its length
squared) stays bounded.
"""

from __future__ import annotations

import torch

from verl.kernels.packing import _MIN_CAPACITY, PackedBatch, bins_and_width, row_lengths


def prompt_groups(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int
) -> list[list[int]]:
    """Rows with identical real prompt ids, grouped (groups in order of first appearance).

    Args:
        input_ids / attention_mask: ``(rows, P + R)``, prompts left-padded in the first
            ``P = seq_len - response_len`` columns.
        response_len: ``R``.

    Returns:
        Row indices per group; every row is in exactly one group.
    """
    if input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"attention_mask {tuple(attention_mask.shape)} != input_ids {tuple(input_ids.shape)}"
        )
    prompt_width = input_ids.shape[1] - response_len
    ids = input_ids[:, :prompt_width].cpu()
    prompt_lens = attention_mask[:, :prompt_width].cpu().bool().sum(-1).tolist()
    groups: dict[bytes, list[int]] = {}
    for i, p in enumerate(prompt_lens):
        key = ids[i, prompt_width - p :].numpy().tobytes()
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def has_shared_prompts(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int
) -> bool:
    """Whether two rows of the batch have the same real prompt ids."""
    return any(len(g) > 1 for g in prompt_groups(input_ids, attention_mask, response_len))


def _units(
    groups: list[list[int]], prompt_lens: list[int], response_lens: list[int], max_unit: int
) -> list[list[int]]:
    """Groups cut so that a unit (prompt + its responses) holds at most ``max_unit`` tokens
    (a single row always fits)."""
    units = []
    for group in groups:
        p = prompt_lens[group[0]]
        current, length = [], p
        for i in group:
            if current and length + response_lens[i] > max_unit:
                units.append(current)
                current, length = [], p
            current.append(i)
            length += response_lens[i]
        units.append(current)
    return units


def pack_shared_prefix(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    capacity: int | None = None,
    pad_token_id: int = 0,
    max_unit: int | None = None,
    groups: list[list[int]] | None = None,
    width_multiple: int = 1,
) -> PackedBatch:
    """Pack a padded batch with each group's prompt once (see the module docstring).

    Args:
        input_ids / attention_mask: ``(rows, P + R)``, prompts left-padded, responses
            right-padded (each row's real tokens contiguous; response tokens with loss mask
            0, e.g. tool output in a multi-turn response, are ordinary real tokens here).
        response_len: ``R``.
        capacity: tokens per bin (at least the longest unit); default :func:`plan_bins`.
        pad_token_id: id of the bins' trailing filler (its outputs are never read).
        max_unit: most tokens of one unit; default ``max(2 * 256, longest row)``.
        groups: the batch's :func:`prompt_groups` when the caller has them already.
        width_multiple: round the packed width up to a multiple of this (filler columns).

    Returns:
        A :class:`~verl.kernels.packing.PackedBatch` whose ``attention_mask`` is the
        ``(bins, width, width)`` boolean mask (True = the query row may attend the key
        column).
    """
    rows, seq_len = input_ids.shape
    prompt_width = seq_len - response_len
    prompt_lens, response_lens = row_lengths(
        input_ids, attention_mask, response_len, "pack_shared_prefix"
    )
    ids = input_ids.cpu()
    valid = attention_mask.cpu().bool()
    longest_row = max((p + r for p, r in zip(prompt_lens, response_lens, strict=True)), default=1)
    if max_unit is None:
        max_unit = max(2 * _MIN_CAPACITY, longest_row)
    if groups is None:
        groups = prompt_groups(ids, valid, response_len)
    units = _units(groups, prompt_lens, response_lens, max_unit)
    unit_lens = [prompt_lens[u[0]] + sum(response_lens[i] for i in u) for u in units]
    bins, width = bins_and_width(unit_lens, capacity, width_multiple)

    size = len(bins) * width
    flat_ids = torch.full((size,), pad_token_id, dtype=ids.dtype)
    flat_pos = torch.zeros(size, dtype=torch.long)
    # segment: which unit a token belongs to (filler: one segment per bin, after the
    # units); branch: 0 for a prompt token, k for the unit's k-th response
    segment = torch.full((size,), -1, dtype=torch.long)
    branch = torch.zeros(size, dtype=torch.long)
    row_index: list[torch.Tensor | None] = [None] * rows
    blocks: list[tuple[int, int, int, int]] = []
    for b, members in enumerate(bins):
        offset = b * width
        for u in members:
            unit = units[u]
            p = prompt_lens[unit[0]]
            prompt_at = offset
            flat_ids[offset : offset + p] = ids[unit[0], prompt_width - p : prompt_width]
            flat_pos[offset : offset + p] = torch.arange(p)
            segment[offset : offset + p] = u
            blocks.append((offset, p, 0, 0))
            offset += p
            for k, i in enumerate(unit, start=1):
                r = response_lens[i]
                flat_ids[offset : offset + r] = ids[i, prompt_width : prompt_width + r]
                flat_pos[offset : offset + r] = torch.arange(p, p + r)
                segment[offset : offset + r] = u
                branch[offset : offset + r] = k
                # token 0 is predicted by the prompt's last state, token j by token j - 1
                row_index[i] = torch.arange(offset - 1, offset + r - 1)
                row_index[i][:1] = prompt_at + p - 1
                blocks.append((offset, r, prompt_at, p))
                offset += r
    # filler at the end of each bin: a causal sequence of its own, positions from 0
    filler = (segment < 0).view(len(bins), width)
    segment.view(len(bins), width)[filler] = (
        len(units) + torch.arange(len(bins))[:, None].expand(len(bins), width)[filler]
    )
    filler_pos = (filler.cumsum(-1) - 1).clamp_min(0)
    flat_pos = torch.where(filler.reshape(-1), filler_pos.reshape(-1), flat_pos)

    seg = segment.view(len(bins), width)
    br = branch.view(len(bins), width)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    same_unit = seg[:, :, None] == seg[:, None, :]
    visible_branch = (br[:, None, :] == 0) | (br[:, None, :] == br[:, :, None])
    mask = same_unit & visible_branch & causal

    response_mask = valid[:, prompt_width:]
    response_index = torch.cat(
        [row_index[i] for i in range(rows) if row_index[i] is not None]
        or [torch.zeros(0, dtype=torch.long)]
    )
    labels = ids[:, prompt_width:][response_mask]
    device = input_ids.device
    return PackedBatch(
        input_ids=flat_ids.view(len(bins), width).to(device),
        position_ids=flat_pos.view(len(bins), width).to(device),
        response_index=response_index.to(device),
        labels=labels.to(device),
        response_mask=response_mask.to(device),
        attention_mask=mask.to(device),
        blocks=blocks,
    )
