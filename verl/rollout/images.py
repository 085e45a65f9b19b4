"""Image prompts in the rollout: the model inputs of a batch's images and its multimodal rope
positions, shared by the ``hf`` and ``native`` engines.

An image batch (a vision-language model such as Qwen2-VL; the keys of
:data:`verl.rollout.base.IMAGE_KEYS`) holds per-row ``{"pixel_values", "image_grid_thw"}``
dicts in ``non_tensor_batch["multi_modal_inputs"]`` (empty for a row without images) and
``mm_token_type_ids`` (B, P) (text 0, image 1) in ``batch``.

- :func:`image_inputs`: the keywords transformers' ``generate`` takes for the batch (the
  rows' images concatenated in row order, and the token types).
- :class:`PromptImages` / :func:`native_image_prompts`: what the native engine needs: each
  prompt's images (a wave or admission takes its prompts' share) and the prefill positions
  ``(B, P, 4)``: row 0 the text positions, rows 1-3 the model's own ``get_rope_index``,
  as ``generate`` builds them. Only the model types of :data:`NATIVE_IMAGE_MODEL_TYPES`,
  whose vision merge and rope the native engine was checked against (greedy tokens equal to
  ``generate``'s); any other is refused by its ``model_type``.
- :func:`add_multimodal_positions`: the output keys the training passes read:
  ``mm_token_type_ids`` (B*n, P+R) (0 over the responses) and ``multimodal_position_ids``
  (B*n, P+R, 4), the rope index over prompt + response (responses are text: their
  positions continue from the prompt's largest, as generation placed them), 0 on padding.
  First it ends every response at its first sampled vision placeholder
  (:func:`end_at_vision_placeholders`).

**A sampled placeholder ends the response.** The model may sample its own image or video
placeholder token (``config.image_token_id`` / ``video_token_id``; a small or untrained
model does so often). Generation embeds it as text, but the training forward takes every
image token of ``input_ids`` for an image slot and would fail on the count (more image
tokens than the grids hold). So such a response is cut before the placeholder: that token
and the rest become padding (mask 0, log-prob 0). The kept tokens are an on-policy sample
with their rollout log-probs unchanged; the response is scored and trained like one cut at
the length limit (no end-of-sequence token).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from verl.rollout.base import IMAGE_INPUTS_KEY, MM_TOKEN_TYPES_KEY, MULTIMODAL_POSITIONS_KEY

logger = logging.getLogger(__name__)

__all__ = [
    "NATIVE_IMAGE_MODEL_TYPES",
    "PromptImages",
    "add_multimodal_positions",
    "end_at_vision_placeholders",
    "image_inputs",
    "native_image_prompts",
    "rope_index_of",
]

#: ``config.model_type`` values whose image prompts the native engine generates from.
NATIVE_IMAGE_MODEL_TYPES = ("qwen2_vl",)


def _token_types(prompts: Any) -> torch.Tensor:
    if MM_TOKEN_TYPES_KEY not in prompts.batch:
        raise KeyError(
            f"image prompts need {MM_TOKEN_TYPES_KEY!r} (text 0, image 1) in the batch; "
            "collate them with verl.data.vision_dataset.collate_vision_prompts"
        )
    return prompts.batch[MM_TOKEN_TYPES_KEY]


def image_inputs(prompts: Any) -> dict[str, torch.Tensor]:
    """``generate``'s image keywords of an image batch (``{}`` for text prompts)."""
    rows = prompts.non_tensor_batch.get(IMAGE_INPUTS_KEY)
    if rows is None:
        return {}
    out = {MM_TOKEN_TYPES_KEY: _token_types(prompts)}
    with_images = [r for r in rows if r]
    if with_images:
        out["pixel_values"] = torch.cat([r["pixel_values"] for r in with_images])
        out["image_grid_thw"] = torch.cat([r["image_grid_thw"] for r in with_images])
    return out


def rope_index_of(module: torch.nn.Module) -> Any:
    """The ``get_rope_index`` of the (sub)module that defines it (Qwen2-VL's base model)."""
    for sub in module.modules():
        if hasattr(type(sub), "get_rope_index"):
            return sub.get_rope_index
    raise ValueError(
        f"{type(module).__name__} has no get_rope_index: image prompts need a model with a "
        "multimodal rope index (the Qwen2-VL family)"
    )


@dataclass
class PromptImages:
    """The images of ``B`` prompts, one entry per prompt: ``pixel_values`` (patches, dim)
    and ``grids`` (images, 3) ``image_grid_thw``, None for a prompt without images."""

    pixel_values: list[torch.Tensor | None]
    grids: list[torch.Tensor | None]

    def rows(self, first: int, last: int) -> PromptImages:
        """The images of prompts ``first .. last - 1``."""
        return PromptImages(self.pixel_values[first:last], self.grids[first:last])

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """The forward's ``pixel_values`` and ``image_grid_thw`` of these prompts, in prompt
        order (``{}`` when none has an image): the model runs its vision tower on them and
        puts the embeddings at the image tokens of ``input_ids``."""
        pixels = [p for p in self.pixel_values if p is not None]
        if not pixels:
            return {}
        grids = [g for g in self.grids if g is not None]
        return {"pixel_values": torch.cat(pixels), "image_grid_thw": torch.cat(grids)}


def native_image_prompts(
    module: torch.nn.Module,
    prompts: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
) -> tuple[torch.Tensor, PromptImages] | None:
    """The native engine's prefill positions ``(B, P, 4)`` and :class:`PromptImages` of an
    image batch (on the model's device), or None for text prompts.

    Raises:
        ValueError: ``module`` is not one of :data:`NATIVE_IMAGE_MODEL_TYPES`.
        KeyError: the batch has no ``mm_token_type_ids``.
    """
    rows = prompts.non_tensor_batch.get(IMAGE_INPUTS_KEY)
    if rows is None:
        return None
    model_type = getattr(getattr(module, "config", None), "model_type", None)
    if model_type not in NATIVE_IMAGE_MODEL_TYPES:
        raise ValueError(
            f"the native rollout generates from images for model_type in "
            f"{NATIVE_IMAGE_MODEL_TYPES} only (the vision merge and multimodal rope it was "
            f"checked against); {type(module).__name__} is model_type={model_type!r}: set "
            "actor_rollout_ref.rollout.name=hf for this model"
        )
    device = next(module.parameters()).device
    types = _token_types(prompts).to(device)
    pixels = [r["pixel_values"].to(device) if r else None for r in rows]
    grids = [r["image_grid_thw"].to(device) if r else None for r in rows]
    images = PromptImages(pixels, grids)
    given = [g for g in grids if g is not None]
    with torch.no_grad():
        vision, _ = rope_index_of(module)(
            input_ids.to(device),
            mm_token_type_ids=types,
            image_grid_thw=torch.cat(given) if given else None,
            attention_mask=attention_mask.to(device),
        )
    text = position_ids.to(device=device, dtype=vision.dtype)
    positions = torch.cat([text.unsqueeze(0), vision], dim=0).permute(1, 2, 0).contiguous()
    return positions, images


def end_at_vision_placeholders(module: torch.nn.Module, out: Any, pad_token_id: int) -> int:
    """End each response of the rollout output ``out`` at its first sampled vision
    placeholder (``module.config``'s ``image_token_id`` / ``video_token_id``), in place:
    from there ``responses`` and the response part of ``input_ids`` become
    ``pad_token_id``, ``response_mask`` and the response part of ``attention_mask`` 0,
    ``rollout_log_probs`` 0 (module docstring). Returns how many responses were cut."""
    config = getattr(module, "config", None)
    ids = [getattr(config, key, None) for key in ("image_token_id", "video_token_id")]
    ids = [int(i) for i in ids if i is not None]
    batch = out.batch
    responses, mask = batch["responses"], batch["response_mask"]
    if not ids:
        return 0
    hit = torch.isin(responses, torch.tensor(ids, device=responses.device)) & mask.bool()
    cut = hit.cumsum(-1) > 0  # the first placeholder and everything after it
    rows = int(cut.any(-1).sum())
    if not rows:
        return 0
    width = responses.shape[1]
    batch["responses"] = responses.masked_fill(cut, pad_token_id)
    batch["response_mask"] = mask.masked_fill(cut, 0)
    if "rollout_log_probs" in batch:
        batch["rollout_log_probs"] = batch["rollout_log_probs"].masked_fill(cut, 0.0)
    prompt = cut.new_zeros(len(cut), batch["input_ids"].shape[1] - width)
    full = torch.cat([prompt, cut], dim=1)
    batch["input_ids"] = batch["input_ids"].masked_fill(full, pad_token_id)
    batch["attention_mask"] = batch["attention_mask"].masked_fill(full, 0)
    logger.warning(
        "%d of %d responses sampled a vision placeholder token (%s): each ends before it",
        rows,
        len(responses),
        ids,
    )
    return rows


def add_multimodal_positions(module: torch.nn.Module, out: Any, pad_token_id: int) -> None:
    """Add ``multimodal_position_ids`` (rows, P+R, 4) and the full-width
    ``mm_token_type_ids`` to a rollout output of image prompts, after ending its responses
    at sampled vision placeholders (module docstring)."""
    end_at_vision_placeholders(module, out, pad_token_id)
    batch = out.batch
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    prompt_types = batch[MM_TOKEN_TYPES_KEY]
    types = torch.cat(
        [prompt_types, prompt_types.new_zeros(len(out), batch["responses"].shape[1])], dim=1
    )
    rows = out.non_tensor_batch[IMAGE_INPUTS_KEY]
    grids = [r["image_grid_thw"] for r in rows if r]
    grid = torch.cat(grids).to(input_ids.device) if grids else None
    with torch.no_grad():
        vision, _ = rope_index_of(module)(
            input_ids,
            mm_token_type_ids=types,
            image_grid_thw=grid,
            attention_mask=attention_mask,
        )
    text = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    positions = torch.cat([text.unsqueeze(0), vision.to(text.device, text.dtype)], dim=0)
    batch[MM_TOKEN_TYPES_KEY] = types
    batch[MULTIMODAL_POSITIONS_KEY] = positions.permute(1, 2, 0).contiguous()
