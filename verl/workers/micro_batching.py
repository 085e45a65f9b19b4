"""Micro-batches for forward/backward passes: fixed-size or packed by a token budget, with
the padding each micro-batch does not need cut off.

A batch of sequences is ``cat(prompt, response)``: prompts left-padded to ``P`` columns,
responses right-padded to ``R``. A micro-batch whose longest prompt has ``p <= P`` tokens
and longest response ``r <= R`` only needs the columns ``[P - p, P + r)``; cutting the rest
changes no result (the cut positions are masked out everywhere) and saves the compute and
activation memory of ``(P - p) + (R - r)`` columns per row.

``use_dynamic_bsz`` (token-budget micro-batching): samples are sorted by their cost and
packed greedily so that ``rows x (p + r)`` of every micro-batch stays within
``max_token_len``; short samples then travel in large micro-batches and long ones in small
ones. Outputs are put back in the caller's order with :func:`gather_response_outputs`.
Loss weights stay exact whatever the split (see ``micro_batch_weights`` in
``verl/workers/common.py``).

``share_prefix`` (shared-prompt packing, ``verl.kernels.prefix_packing``): the rows of a
group (identical real prompt ids) stay in one micro-batch where it fits, so its prompt is
computed once; a micro-batch's token count is then its real shared count (each group's
prompt once plus its responses).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from verl.kernels.prefix_packing import prompt_groups
from verl.protocol import DataProto


@dataclass
class MicroBatch:
    """One micro-batch: trimmed ``data``, its rows' positions in the batch, its response width."""

    data: DataProto
    index: torch.Tensor  # (rows,) positions in the original batch
    response_len: int  # response columns kept (r); the batch had R


def _lengths(attention_mask: torch.Tensor, response_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    prompt_mask = attention_mask[:, :-response_len]
    response_mask = attention_mask[:, -response_len:]
    return prompt_mask.sum(-1), response_mask.sum(-1)


def trim_padding(data: DataProto, response_len: int) -> tuple[DataProto, int]:
    """``data`` cut to the columns its rows use; returns it and the kept response width.

    Tensors ``(rows, P + R)`` (``input_ids``, ``attention_mask``, ``position_ids``) keep
    ``[P - p, P + r)``; tensors ``(rows, R)`` (``responses``, ``response_mask``, log-probs,
    advantages, values, ...) keep ``[:r]``; other tensors are kept whole. At least one
    prompt and one response column are kept.
    """
    mask = data.batch["attention_mask"]
    seq_len = mask.shape[1]
    prompt_len = seq_len - response_len
    prompt_lens, response_lens = _lengths(mask, response_len)
    longest = torch.stack([prompt_lens.max(), response_lens.max()]).tolist()  # one read
    p, r = (max(1, int(n)) for n in longest)
    if p == prompt_len and r == response_len:
        return data, response_len
    tensors = {}
    for key, value in data.batch.items():
        if value.dim() >= 2 and value.shape[1] == seq_len:
            value = value[:, prompt_len - p : prompt_len + r]
        elif value.dim() >= 2 and value.shape[1] == response_len:
            value = value[:, :r]
        tensors[key] = value
    trimmed = DataProto.from_dict(
        tensors=tensors, non_tensors=dict(data.non_tensor_batch), meta_info=dict(data.meta_info)
    )
    return trimmed, r


def split_micro_batches(
    data: DataProto,
    response_len: int,
    *,
    micro_batch_size: int | None = None,
    max_token_len: int | None = None,
    agree: Callable[[int], int] | None = None,
    packed: bool = False,
    share_prefix: bool = False,
) -> list[MicroBatch]:
    """Split ``data`` into trimmed micro-batches.

    Exactly one of ``micro_batch_size`` (rows per micro-batch, in order) and
    ``max_token_len`` (token budget: ``rows x (longest prompt + longest response)`` per
    micro-batch, rows sorted longest first) must be given. A single row longer than the
    budget gets a micro-batch of its own.

    ``agree(count) -> count``: with a token budget, the number of micro-batches every
    data-parallel rank will use (the maximum over ranks). FSDP2 runs collectives in every
    forward, so all ranks must run the same number; a rank with fewer micro-batches splits
    its largest ones until it has that many.

    ``packed``: the forward packs each micro-batch's real tokens end to end
    (``verl.kernels.packing``), so a micro-batch costs the sum of its rows' lengths instead
    of rows x longest.

    ``share_prefix`` (with ``packed``): rows with the same real prompt ids stay together
    (whole groups fill a micro-batch of ``micro_batch_size`` rows, or of ``max_token_len``
    real tokens counting each group's prompt once; a group that cannot fit is cut). The
    number of micro-batches may then differ between ranks, so ``agree`` applies to both
    modes.
    """
    if (micro_batch_size is None) == (max_token_len is None):
        raise ValueError("give exactly one of micro_batch_size and max_token_len")
    rows = len(data)
    if share_prefix and packed:
        if micro_batch_size is not None and micro_batch_size <= 0:
            raise ValueError(f"micro_batch_size must be positive, got {micro_batch_size}")
        if max_token_len is not None and max_token_len <= 0:
            raise ValueError(f"max_token_len must be positive, got {max_token_len}")
        groups = _group_micro_batches(
            data.batch["input_ids"],
            data.batch["attention_mask"],
            response_len,
            micro_batch_size,
            max_token_len,
        )
        if agree is not None:
            groups = _split_to_count(groups, agree(len(groups)))
        parts = [(data[index], index) for index in groups]
    elif micro_batch_size is not None:
        if micro_batch_size <= 0:
            raise ValueError(f"micro_batch_size must be positive, got {micro_batch_size}")
        parts = [
            (
                data[start : start + micro_batch_size],
                torch.arange(start, min(start + micro_batch_size, rows)),
            )
            for start in range(0, rows, micro_batch_size)
        ]
    else:
        if max_token_len <= 0:
            raise ValueError(f"max_token_len must be positive, got {max_token_len}")
        groups = _pack_by_tokens(
            data.batch["attention_mask"], response_len, max_token_len, packed=packed
        )
        if agree is not None:
            groups = _split_to_count(groups, agree(len(groups)))
        parts = [(data[index], index) for index in groups]
    out = []
    for part, index in parts:
        trimmed, r = trim_padding(part, response_len)
        out.append(MicroBatch(trimmed, index, r))
    return out


def _pack_by_tokens(
    attention_mask: torch.Tensor, response_len: int, max_token_len: int, packed: bool = False
) -> list[torch.Tensor]:
    prompt_lens, response_lens = _lengths(attention_mask, response_len)
    cost = prompt_lens + response_lens
    order = torch.argsort(cost, descending=True, stable=True).tolist()
    groups: list[list[int]] = []
    current: list[int] = []
    max_p = max_r = total = 0
    for i in order:
        p, r = max(max_p, int(prompt_lens[i])), max(max_r, int(response_lens[i]))
        length = max(int(cost[i]), 1)
        if packed:
            over = total + length > max_token_len
        else:
            over = (len(current) + 1) * (max(p, 1) + max(r, 1)) > max_token_len
        if current and over:
            groups.append(current)
            current, p, r, total = [], int(prompt_lens[i]), int(response_lens[i]), 0
        current.append(i)
        max_p, max_r = p, r
        total += length
    if current:
        groups.append(current)
    return [torch.tensor(g, dtype=torch.long) for g in groups]


def _group_micro_batches(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    micro_batch_size: int | None,
    max_token_len: int | None,
) -> list[torch.Tensor]:
    """Micro-batches of whole prompt groups: by rows (groups in order of first appearance)
    or by a budget of shared real tokens (units sorted largest first)."""
    prompt_lens, response_lens = _lengths(attention_mask, response_len)
    prompt_lens, response_lens = prompt_lens.tolist(), response_lens.tolist()
    # cut each group into units that fit one micro-batch on their own
    units: list[list[int]] = []
    costs: list[int] = []
    for group in prompt_groups(input_ids, attention_mask, response_len):
        p = prompt_lens[group[0]]
        current, cost = [], p
        for i in group:
            full = (
                len(current) >= micro_batch_size
                if micro_batch_size is not None
                else cost + response_lens[i] > max_token_len
            )
            if current and full:
                units.append(current)
                costs.append(cost)
                current, cost = [], p
            current.append(i)
            cost += response_lens[i]
        units.append(current)
        costs.append(cost)
    if micro_batch_size is not None:
        order, size, limit = list(range(len(units))), [len(u) for u in units], micro_batch_size
    else:
        order = sorted(range(len(units)), key=lambda u: -costs[u])
        size, limit = [max(c, 1) for c in costs], max_token_len
    out: list[list[int]] = []
    current, used = [], 0
    for u in order:
        if current and used + size[u] > limit:
            out.append(current)
            current, used = [], 0
        current.extend(units[u])
        used += size[u]
    if current:
        out.append(current)
    return [torch.tensor(g, dtype=torch.long) for g in out]


def _split_to_count(groups: list[torch.Tensor], count: int) -> list[torch.Tensor]:
    groups = list(groups)
    while len(groups) < count:
        largest = max(range(len(groups)), key=lambda i: len(groups[i]))
        if len(groups[largest]) < 2:
            raise ValueError(f"cannot make {count} micro-batches from {sum(map(len, groups))} rows")
        group = groups.pop(largest)
        half = (len(group) + 1) // 2
        groups[largest:largest] = [group[:half], group[half:]]
    return groups


def gather_response_outputs(
    parts: list[tuple[MicroBatch, torch.Tensor]], rows: int, response_len: int
) -> torch.Tensor:
    """Per-micro-batch outputs ``(rows_i, r_i, *rest)`` -> ``(rows, response_len, *rest)`` in
    batch order (``rest``: e.g. the ``k`` of per-token top-k values).

    Columns a micro-batch cut off are filled with zeros (they are padding: masked by
    ``response_mask`` downstream).
    """
    if not parts:
        raise ValueError("no micro-batch outputs to gather")
    first = parts[0][1]
    out = first.new_zeros((rows, response_len, *first.shape[2:]))
    for mb, values in parts:
        out[mb.index, : values.shape[1]] = values
    return out
