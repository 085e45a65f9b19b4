"""Image prompts: reading the ``images`` column, validating it, and turning a row into a
vision-language processor's inputs.

**Format** (upstream verl's geo3k layout): a prompt row as in ``verl.data.rl_dataset``, plus
an ``images`` column holding a list per row; each entry is one of

    {"bytes": <binary image file>}       (parquet; what ``datasets`` writes for an Image column)
    {"path": "imgs/0.png"}               (relative to the data file's directory, or absolute)
    "imgs/0.png"                         (a plain path, same rules)

and the prompt's message contents hold one ``<image>`` placeholder per image, in order:
``"<image>What colour is the square?"``. A row without the column (or with an empty list)
and without placeholders is a text-only prompt. JSON lines files cannot hold binary data:
there images are paths.

**Validation** happens when the rows are read (:func:`read_vision_rows`): every image is
decoded in full, and every problem of every row is reported together in one
``DatasetValidationError``, each naming the file, the 1-based row and the image: an entry
that is neither bytes nor a path, bytes PIL cannot decode, a missing or unreadable file,
more images than ``<image>`` placeholders or fewer. Rows keep where their images are (the
bytes, or the resolved path), not the decoded pixels: a row's images are decoded again when
it is processed (:meth:`VisionRow.load_images`).

**Processing** (:func:`process_prompt`): the messages are rewritten in the typed form
vision chat templates read (``<image>`` -> ``{"type": "image"}``, text between them ->
``{"type": "text", "text": ...}``, as upstream), rendered with the processor's chat
template and the generation prompt, and given to the processor with the images. For
Qwen2-VL the result is ``input_ids``, ``attention_mask``, ``mm_token_type_ids`` (L,),
``pixel_values`` (patches, 3 * 2 * 14 * 14) and ``image_grid_thw`` (images, 3); with the
model's config also ``position_ids`` (4, L): row 0 the text positions, rows 1-3 the
multimodal rope index (temporal, height, width) computed by the model class's own
``get_rope_index`` (:func:`multimodal_position_ids`). That (4, L) layout is what
transformers' Qwen2-VL reads as "text positions first" (it builds the attention mask of
packed sequences from row 0) and what upstream verl passes.
"""

from __future__ import annotations

import io
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from verl.data.base import shown
from verl.data.io import DatasetValidationError, normalize_paths, read_records
from verl.data.rl_dataset import validate_row

logger = logging.getLogger(__name__)

__all__ = [
    "IMAGE_INPUTS_KEY",
    "IMAGE_KEY",
    "IMAGE_PLACEHOLDER",
    "MM_TOKEN_TYPES_KEY",
    "MULTIMODAL_POSITIONS_KEY",
    "ImageProblem",
    "ImageSource",
    "VisionRow",
    "count_placeholders",
    "decode_image",
    "image_source",
    "multimodal_position_ids",
    "process_prompt",
    "read_vision_rows",
    "row_image_problems",
    "to_multimodal_messages",
]

IMAGE_PLACEHOLDER = "<image>"
IMAGE_KEY = "images"
# The batch keys of image prompts (verl.data.vision_dataset; the same names as
# verl.rollout.base, which this layer cannot import): the per-row image inputs in
# non_tensor_batch, the token types and the (rows, seq, 4) rope index in batch.
IMAGE_INPUTS_KEY = "multi_modal_inputs"
MM_TOKEN_TYPES_KEY = "mm_token_type_ids"
MULTIMODAL_POSITIONS_KEY = "multimodal_position_ids"
_PLACEHOLDER_RE = re.compile(re.escape(IMAGE_PLACEHOLDER))


class ImageProblem(ValueError):
    """One image cannot be used; the message says why (the caller adds where it is)."""


@dataclass(frozen=True)
class ImageSource:
    """Where one image is: its encoded bytes, or an absolute path (exactly one is set)."""

    data: bytes | None = None
    path: str | None = None

    def describe(self) -> str:
        return f"file {self.path}" if self.path is not None else f"{len(self.data or b'')} bytes"


def image_source(entry: Any, base_dir: str) -> ImageSource:
    """The :class:`ImageSource` of one ``images`` entry; a relative path is resolved
    against ``base_dir`` (the data file's directory).

    Raises:
        ImageProblem: the entry is neither ``{"bytes": ...}``, ``{"path": ...}`` nor a
            path string.
    """
    if isinstance(entry, dict):
        data, path = entry.get("bytes"), entry.get("path")
        if data is not None:
            if isinstance(data, bytearray):
                data = bytes(data)
            if not isinstance(data, bytes):
                raise ImageProblem(
                    f"'bytes' must be binary image data, got {shown(data)} (JSON lines files "
                    "cannot hold binary data: give a 'path', or write parquet)"
                )
            if not data:
                raise ImageProblem("'bytes' is empty")
            return ImageSource(data=data)
        if path is None:
            raise ImageProblem(
                "the entry has neither 'bytes' nor 'path' (both are missing or null)"
            )
        entry = path
    if isinstance(entry, (str, os.PathLike)):
        path = os.fspath(entry)
        if not path.strip():
            raise ImageProblem("the image path is empty")
        return ImageSource(path=os.path.normpath(os.path.join(base_dir, path)))
    raise ImageProblem(
        f"an image entry must be {{'bytes': ...}}, {{'path': ...}} or a path string, "
        f"got {shown(entry)}"
    )


def decode_image(source: ImageSource) -> Any:
    """Decode ``source`` in full and return it as an RGB ``PIL.Image``.

    Raises:
        ImageProblem: the file is missing or unreadable, or PIL cannot decode the data
            (not an image, truncated, or over PIL's decompression-bomb limit).
    """
    from PIL import Image, UnidentifiedImageError

    if source.path is not None:
        if not os.path.isfile(source.path):
            raise ImageProblem(f"image file {source.path} does not exist (or is not a file)")
        try:
            with open(source.path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ImageProblem(
                f"image file {source.path} cannot be read: {e.strerror or e}"
            ) from None
    else:
        data = source.data or b""
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return image.convert("RGB")
    except UnidentifiedImageError:
        raise ImageProblem(
            f"{source.describe()}: not a decodable image (PIL does not recognise the format)"
        ) from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise ImageProblem(f"{source.describe()}: not a decodable image ({e})") from None


def count_placeholders(messages: Sequence[dict[str, Any]]) -> int:
    """How many ``<image>`` placeholders the messages' contents hold."""
    return sum(
        len(_PLACEHOLDER_RE.findall(m["content"]))
        for m in messages
        if isinstance(m, dict) and isinstance(m.get("content"), str)
    )


def row_image_problems(
    row: dict[str, Any], base_dir: str, image_key: str = IMAGE_KEY, prompt_key: str = "prompt"
) -> tuple[list[ImageSource], list[str]]:
    """The image sources of a valid prompt row and the problems of its images (each image
    decoded in full); the problems name the image (1-based) and what is wrong."""
    entries = row.get(image_key)
    if entries is None:
        entries = []
    if not isinstance(entries, (list, tuple)):
        return [], [f"{image_key!r} must be a list of images, got {shown(entries)}"]
    sources: list[ImageSource] = []
    problems: list[str] = []
    for i, entry in enumerate(entries, start=1):
        try:
            source = image_source(entry, base_dir)
            decode_image(source)
        except ImageProblem as e:
            problems.append(f"image {i} of {len(entries)}: {e}")
            continue
        sources.append(source)
    wanted = count_placeholders(row[prompt_key])
    if wanted != len(entries):
        more = "more" if len(entries) > wanted else "fewer"
        problems.append(
            f"{len(entries)} image(s) but {wanted} {IMAGE_PLACEHOLDER!r} placeholder(s) in the "
            f"prompt: {more} images than placeholders; put one {IMAGE_PLACEHOLDER} in the "
            "prompt where each image goes, in the order of the list"
        )
    return sources, problems


@dataclass
class VisionRow:
    """One validated row: its data (``prompt`` as chat messages), where it came from
    (``"train.parquet row 3"``) and its images' sources."""

    data: dict[str, Any]
    where: str
    images: list[ImageSource] = field(default_factory=list)

    def load_images(self) -> list[Any]:
        """The row's images decoded as RGB ``PIL.Image``s, in placeholder order."""
        return [decode_image(source) for source in self.images]


def read_vision_rows(
    data_files: str | os.PathLike | Sequence[str | os.PathLike],
    image_key: str = IMAGE_KEY,
    prompt_key: str = "prompt",
    max_reported_problems: int = 20,
) -> list[VisionRow]:
    """Read and validate every row of the files (parquet, ``.jsonl``, ``.json``): the
    prompt row format of ``verl.data.rl_dataset`` and the images (module docstring).

    Raises:
        DatasetValidationError: every problem found, each naming its file and 1-based row.
    """
    rows: list[VisionRow] = []
    problems: list[str] = []
    for path in normalize_paths(data_files):
        base_dir = os.path.dirname(os.path.abspath(path))
        records = read_records(path).records
        if not records:
            problems.append(f"{path}: the file has no rows")
        for rec in records:
            if rec.problem is not None:
                problems.append(f"{rec.where}: {rec.problem}")
                continue
            data = rec.data
            if isinstance(data.get(prompt_key), str):
                data[prompt_key] = [{"role": "user", "content": data[prompt_key]}]
            row_problems = validate_row(data, prompt_key)
            if row_problems:
                problems.extend(f"{rec.where}: {p}" for p in row_problems)
                continue
            sources, image_problems = row_image_problems(data, base_dir, image_key, prompt_key)
            if image_problems:
                problems.extend(f"{rec.where}: {p}" for p in image_problems)
                continue
            rows.append(VisionRow(data, rec.where, sources))
    if problems:
        raise DatasetValidationError(problems, max_reported_problems)
    logger.info(
        "read %d image prompt(s) with %d image(s)", len(rows), sum(len(r.images) for r in rows)
    )
    return rows


def to_multimodal_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages with ``<image>`` placeholders in the typed form vision chat templates read:
    ``"<image>What?"`` -> ``[{"type": "image"}, {"type": "text", "text": "What?"}]``.

    Empty text between placeholders is dropped; a content without placeholders becomes one
    text part; a content already in typed form is kept as it is.
    """
    out = []
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            parts: list[dict[str, Any]] = []
            for i, text in enumerate(content.split(IMAGE_PLACEHOLDER)):
                if i:
                    parts.append({"type": "image"})
                if text:
                    parts.append({"type": "text", "text": text})
            content = parts
        out.append({**message, "content": content})
    return out


def process_prompt(
    processor: Any,
    messages: Sequence[dict[str, Any]],
    images: Sequence[Any] = (),
    config: Any = None,
) -> dict[str, torch.Tensor]:
    """A prompt's model inputs: ``messages`` (with ``<image>`` placeholders) and their
    ``images`` (``PIL.Image``s, placeholder order) through ``processor``'s chat template
    (with the generation prompt) and the processor.

    Returns unbatched tensors: ``input_ids``, ``attention_mask``, ``mm_token_type_ids``
    (L,) int64; with images ``pixel_values`` (patches, patch_dim) and ``image_grid_thw``
    (images, 3); with ``config`` (the model's config, e.g. ``model.config``) also
    ``position_ids`` (4, L) (:func:`multimodal_position_ids`).

    Raises:
        ValueError: the number of images differs from the number of placeholders.
    """
    wanted = count_placeholders(messages)
    if wanted != len(images):
        raise ValueError(
            f"{len(images)} image(s) for {wanted} {IMAGE_PLACEHOLDER!r} placeholder(s) in the "
            "prompt; give one image per placeholder"
        )
    text = processor.apply_chat_template(
        to_multimodal_messages(messages), add_generation_prompt=True, tokenize=False
    )
    kwargs: dict[str, Any] = {"text": [text], "return_tensors": "pt"}
    if images:
        kwargs["images"] = list(images)
    batch = processor(**kwargs)
    out: dict[str, torch.Tensor] = {
        "input_ids": batch["input_ids"][0].long(),
        "attention_mask": batch["attention_mask"][0].long(),
    }
    type_ids = batch.get("mm_token_type_ids")
    out["mm_token_type_ids"] = (
        type_ids[0].long() if type_ids is not None else torch.zeros_like(out["input_ids"])
    )
    if images:
        out["pixel_values"] = batch["pixel_values"]
        out["image_grid_thw"] = batch["image_grid_thw"].long()
    if config is not None:
        out["position_ids"] = multimodal_position_ids(
            config,
            out["input_ids"],
            out["mm_token_type_ids"],
            out.get("image_grid_thw"),
            out["attention_mask"],
        )
    return out


class _ModelMethods:
    """The methods of a model class bound to a holder of its config alone: enough for the
    config-only helpers (``get_rope_index``) without building the model."""

    def __init__(self, model_cls: type, config: Any):
        self._model_cls = model_cls
        self.config = config

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._model_cls, name)
        return attr.__get__(self) if callable(attr) else attr


def _rope_index(config: Any) -> Any:
    from transformers import MODEL_MAPPING

    try:
        model_cls = MODEL_MAPPING[type(config)]
    except KeyError:
        model_cls = None
    if model_cls is None or not hasattr(model_cls, "get_rope_index"):
        raise ValueError(
            f"model_type={getattr(config, 'model_type', None)!r} has no multimodal rope index "
            "(get_rope_index); only models with 3-D rope positions (Qwen2-VL family) need "
            "position_ids from here"
        )
    return _ModelMethods(model_cls, config).get_rope_index


def multimodal_position_ids(
    config: Any,
    input_ids: torch.Tensor,
    mm_token_type_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Position ids for a multimodal-rope model: ``(4, L)`` for one sequence ``(L,)``,
    ``(4, B, L)`` for a batch ``(B, L)``.

    Row 0 is the text position (``cumsum(attention_mask) - 1``, 0 on padding, as
    ``verl.data.rl_dataset.collate_prompts``); rows 1-3 are the (temporal, height, width)
    rope index from the model class's ``get_rope_index`` (called with ``config`` alone),
    0 on padding. ``image_grid_thw`` holds the grids of every image of the batch, in order.
    """
    single = input_ids.dim() == 1
    if single:
        input_ids = input_ids.unsqueeze(0)
        mm_token_type_ids = mm_token_type_ids.unsqueeze(0)
        attention_mask = None if attention_mask is None else attention_mask.unsqueeze(0)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    vision, _ = _rope_index(config)(
        input_ids,
        mm_token_type_ids=mm_token_type_ids,
        image_grid_thw=image_grid_thw,
        attention_mask=attention_mask,
    )
    text = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    positions = torch.cat([text.unsqueeze(0), vision.to(text.dtype)], dim=0)
    return positions[:, 0] if single else positions
