"""Sequence packing of image prompts: a vision-language model with a multimodal rope
(Qwen2-VL family) on a packed batch.

Contract: :func:`packed_image_response_hidden` takes a padded ``(rows, P + R)`` batch,
its ``(4, rows, P + R)`` position ids (row 0 the text positions, rows 1-3 the multimodal
rope index, as ``verl.workers.vision_inputs.forward_inputs`` gives them) and the rows'
images (``pixel_values`` and ``image_grid_thw`` of every image, in row order), packs the
rows' real tokens with :func:`verl.kernels.packing.pack_sequences` and returns the base
model's hidden states that predict the valid response tokens, as
:func:`verl.kernels.packed_model.packed_response_hidden` does for a text model.

- **A row stays whole.** Packing places each row's real tokens contiguously in one bin, so
  an image's tokens never straddle two sequences (nor two bins).
- **Positions per sequence.** Each token keeps its own row's four position ids (the rope
  index is computed per prompt + response, starting at 0 at the row's first real token), so
  the rotary embedding of every token equals the padded pass's. Row 0 (text positions)
  restarts at 0 for every sequence; transformers' Qwen2-VL builds the block-diagonal causal
  mask of a packed batch from it (``attention_mask`` None). Filler at the end of a bin
  counts up from 0 in all four rows, a sequence of its own whose outputs are never read.
- **Images in packed order.** The model scatters the image features into the image tokens
  in the flattened order of ``input_ids``; bins reorder rows (first-fit decreasing), so
  the rows' images are reordered to the order their rows take in the packed layout. Each
  row's images are found by counting its image tokens (``config.image_token_id``) against
  the grids (``t * h * w / merge_size**2`` tokens per image).

Shared-prompt packing (``share_prompt_prefix``) is not applied to image batches: their rows
are packed plainly (logged once). Results equal the padded pass's up to float rounding
(``tests/vision/test_vision_packing.py``: within 1e-5 in fp32).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from verl.kernels.packed_model import shape_multiple
from verl.kernels.packing import PackedBatch, pack_sequences

logger = logging.getLogger(__name__)

__all__ = ["pack_image_batch", "packed_image_response_hidden", "row_image_counts"]

_share_prefix_logged = False


def row_image_counts(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    image_grid_thw: torch.Tensor,
    image_token_id: int,
    merge_size: int,
) -> list[int]:
    """How many of the images (``image_grid_thw`` ``(images, 3)``, in row order) each row of
    ``input_ids`` ``(rows, seq)`` holds, from its count of image tokens.

    Raises:
        ValueError: the rows' image tokens do not add up to whole images of the grids.
    """
    tokens = ((input_ids == image_token_id) & attention_mask.bool()).sum(-1).tolist()
    per_image = (image_grid_thw.prod(-1) // (merge_size**2)).tolist()
    counts, k = [], 0
    for row, wanted in enumerate(tokens):
        n, got = 0, 0
        while got < wanted and k < len(per_image):
            got += per_image[k]
            k += 1
            n += 1
        if got != wanted:
            raise ValueError(
                f"row {row} has {wanted} image tokens, which are not whole images of the "
                f"grids given ({per_image}): the batch's images do not match its rows"
            )
        counts.append(n)
    if k != len(per_image):
        raise ValueError(
            f"{len(per_image)} images given but the rows' image tokens hold {k}: the batch's "
            "images do not match its rows"
        )
    return counts


def pack_image_batch(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
    width_multiple: int = 1,
) -> tuple[PackedBatch, torch.Tensor, list[int]]:
    """Pack a padded image batch (module docstring).

    Args:
        input_ids / attention_mask: ``(rows, P + R)``, prompts left-padded.
        position_ids: ``(4, rows, P + R)``.

    Returns:
        ``(packed, positions (4, bins, width), order)``: ``order`` lists the rows with
        real tokens in the order the packed layout holds them.
    """
    if position_ids.dim() != 3 or position_ids.shape[0] != 4:
        raise ValueError(
            f"position_ids {tuple(position_ids.shape)}: an image batch packs with (4, rows, "
            "seq) multimodal position ids (text row first)"
        )
    packed = pack_sequences(input_ids, attention_mask, response_len, width_multiple=width_multiple)
    bins, width = packed.input_ids.shape
    flat = packed.position_ids.reshape(1, -1).repeat(4, 1)  # filler: as the text row
    mask = attention_mask.bool()
    real = [i for i in range(input_ids.shape[0]) if bool(mask[i].any())]
    starts = [block[0] for block in packed.blocks or []]
    if len(starts) != len(real):
        raise RuntimeError("pack_sequences recorded no block per row: cannot place positions")
    device = flat.device
    for i, start in zip(real, starts, strict=True):
        values = position_ids[:, i, mask[i]].to(device)
        flat[:, start : start + values.shape[1]] = values
    order = [i for _, i in sorted(zip(starts, real, strict=True))]
    return packed, flat.view(4, bins, width), order


def packed_image_response_hidden(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
    model_inputs: dict[str, torch.Tensor],
    share_prefix: bool = False,
) -> tuple[torch.Tensor, PackedBatch]:
    """The hidden states (of ``model.model``, the base of a Qwen2-VL-family model) that
    predict the valid response tokens, computed on the batch packed with its images.

    ``model_inputs``: ``{"pixel_values", "image_grid_thw"}`` of the rows' images in row
    order (empty when no row has one). Returns ``(hidden (n, H), packed)`` as
    :func:`verl.kernels.packed_model.packed_response_hidden`.
    """
    global _share_prefix_logged
    if share_prefix and not _share_prefix_logged:
        _share_prefix_logged = True
        logger.info(
            "share_prompt_prefix: image batches are packed without sharing prompts (each row "
            "keeps its own prompt and images)"
        )
    base = model.model
    packed, positions, order = pack_image_batch(
        input_ids, attention_mask, position_ids, response_len, shape_multiple(model)
    )
    kwargs: dict[str, torch.Tensor] = {}
    if model_inputs:
        grids = model_inputs["image_grid_thw"]
        config = model.config
        counts = row_image_counts(
            input_ids,
            attention_mask,
            grids,
            config.image_token_id,
            config.vision_config.spatial_merge_size,
        )
        patches = grids.prod(-1).tolist()
        first_image = [sum(counts[:i]) for i in range(len(counts))]
        first_patch = [sum(patches[:k]) for k in range(len(patches) + 1)]
        pixel_parts, grid_parts = [], []
        for i in order:
            a, b = first_image[i], first_image[i] + counts[i]
            if a == b:
                continue
            pixel_parts.append(model_inputs["pixel_values"][first_patch[a] : first_patch[b]])
            grid_parts.append(grids[a:b])
        if pixel_parts:
            kwargs["pixel_values"] = torch.cat(pixel_parts)
            kwargs["image_grid_thw"] = torch.cat(grid_parts)
    out = base(
        input_ids=packed.input_ids,
        position_ids=positions.to(packed.input_ids.device),
        attention_mask=None,
        use_cache=False,
        **kwargs,
    )
    flat = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])
    return flat[packed.response_index], packed
