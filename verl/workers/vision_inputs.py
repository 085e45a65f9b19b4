"""The image inputs of a training forward (a vision-language actor, Qwen2-VL family).

An image batch (``verl.rollout.base.IMAGE_KEYS``; layout in ``verl.data.vision_dataset``)
holds each row's ``{"pixel_values", "image_grid_thw"}`` in
``non_tensor_batch["multi_modal_inputs"]`` and the ``(rows, seq, 4)`` multimodal rope index
in ``batch["multimodal_position_ids"]``. Micro-batches are row selections of the batch, so
each carries exactly its rows' images: ``pixel_values`` is cut by each row's patch count
(``image_grid_thw.prod(-1).sum()`` of the row). :func:`forward_inputs` gives a micro-batch's
``position_ids`` (``(4, rows, seq)``, what the model reads) and the image keywords of its
forward, concatenated in row order. With ``pack_sequences`` the forward packs the rows
with their images (:mod:`verl.kernels.vision_packing`: a row and its images stay in one
sequence, each token keeps its row's rope index; shared-prompt packing is not applied to
image batches, which pack plainly); sequence parallelism is refused for image batches
(:func:`check_image_batching`).
"""

from __future__ import annotations

from typing import Any

import torch

from verl.protocol import DataProto
from verl.rollout.base import IMAGE_INPUTS_KEY, IMAGE_KEYS, MULTIMODAL_POSITIONS_KEY

__all__ = ["IMAGE_KEYS", "check_image_batching", "forward_inputs", "has_images", "image_keys"]


def has_images(data: DataProto) -> bool:
    """Whether ``data`` is an image batch."""
    return IMAGE_INPUTS_KEY in data.non_tensor_batch


def image_keys(data: DataProto) -> list[str]:
    """The tensor keys of :data:`IMAGE_KEYS` that ``data`` holds (to select with its
    sequence keys)."""
    return [k for k in IMAGE_KEYS if k in data.batch]


def check_image_batching(data: DataProto, batching: Any, sequence_parallel_size: int = 1) -> None:
    """Refuse an image batch with a micro-batch layout the image inputs cannot take.

    Raises:
        KeyError: the batch lacks its multimodal rope index.
        ValueError: the sequence parallel size is over 1, for an image batch.
    """
    if not has_images(data):
        return
    if MULTIMODAL_POSITIONS_KEY not in data.batch:
        raise KeyError(
            f"an image batch needs {MULTIMODAL_POSITIONS_KEY!r} (the rollout's multimodal rope "
            "index, rollout.name=hf) for its training passes"
        )
    if sequence_parallel_size > 1:
        raise ValueError(
            "image prompts (a vision-language model) do not support sequence parallelism: set "
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1"
        )


def forward_inputs(
    data: DataProto, device: torch.device | None = None
) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
    """``(position_ids, model_inputs)`` of one (micro-)batch's forward.

    Text batch: ``batch["position_ids"]`` and None. Image batch: the ``(4, rows, seq)``
    multimodal rope index and ``{"pixel_values", "image_grid_thw"}`` of its rows, in row
    order, on ``device`` (the batch's ``input_ids``' device when None); no image keywords
    when none of its rows has an image.
    """
    batch = data.batch
    if not has_images(data):
        return batch["position_ids"], None
    device = batch["input_ids"].device if device is None else device
    positions = batch[MULTIMODAL_POSITIONS_KEY].permute(2, 0, 1).to(device)
    rows = [r for r in data.non_tensor_batch[IMAGE_INPUTS_KEY] if r]
    if not rows:
        return positions, {}
    inputs = {
        "pixel_values": torch.cat([r["pixel_values"] for r in rows]).to(device),
        "image_grid_thw": torch.cat([r["image_grid_thw"] for r in rows]).to(device),
    }
    return positions, inputs
