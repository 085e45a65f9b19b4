"""Loading a vision-language model's processor, with or without torchvision.

transformers 5 builds Qwen2-VL's processor (``Qwen2VLProcessor``) from three parts: the
image processor, the tokenizer and a *video* processor. The video processor needs
torchvision, and without it constructing ``Qwen2VLProcessor`` raises (no class resolves
for its ``video_processor`` argument) and ``AutoProcessor.from_pretrained(dir)`` either
raises an ``ImportError`` naming torchvision or, for a directory whose processor class it
cannot resolve, silently returns the bare tokenizer instead of a processor. This project's environments have no torchvision (the registry carries only CUDA
builds of it, and vLLM's CPU backend fails to import with one installed: docs/rollout.md).

:class:`ImageOnlyQwen2VLProcessor` is Qwen2-VL's processor without the video part: the same
image processor (the PIL backend, ``Qwen2VLImageProcessorPil``, when torchvision is
absent), tokenizer, chat template and image-token expansion. ``save_pretrained`` writes an
ordinary Qwen2-VL processor directory (``processor_class: Qwen2VLProcessor``, with a
``video_processor`` entry), so with torchvision installed ``AutoProcessor`` loads it as the
stock class. :func:`load_vision_processor` loads any directory: ``AutoProcessor`` when that
gives a processor with an image processor, else the image-only processor for the Qwen2-VL
family, else a ``ValueError`` naming the directory and the cause.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from transformers import Qwen2VLProcessor
from transformers.processing_utils import ProcessorMixin

logger = logging.getLogger(__name__)

__all__ = [
    "IMAGE_ONLY_MODEL_TYPES",
    "ImageOnlyQwen2VLProcessor",
    "load_vision_processor",
    "save_processor_files",
]

# model_type -> the processor class a directory of that model names (saved and loaded as)
IMAGE_ONLY_MODEL_TYPES = {
    "qwen2_vl": "Qwen2VLProcessor",
    "qwen2_5_vl": "Qwen2_5_VLProcessor",
}


class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
    """``Qwen2VLProcessor`` without a video processor (images and text only).

    Calls as the stock processor: ``processor(text=[...], images=[...],
    return_tensors="pt")`` gives ``input_ids``, ``attention_mask``, ``mm_token_type_ids``
    (text 0, image 1), ``pixel_values`` (patches, channels * temporal_patch * patch**2)
    and ``image_grid_thw`` (images, 3); each ``<|image_pad|>`` of the text becomes
    ``t * h * w / merge_size**2`` image tokens. Videos are refused.

    ``saved_as`` is the processor class written to ``processor_config.json`` and
    ``tokenizer_config.json`` (``Qwen2VLProcessor`` unless the directory it came from named
    another member of the family).
    """

    saved_as = "Qwen2VLProcessor"

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        # Qwen2VLProcessor.__init__ would pass a video processor to ProcessorMixin; set the
        # token attributes it sets and skip it.
        self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
        self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        if self.image_token_id is None or self.image_token_id == tokenizer.unk_token_id:
            raise ValueError(
                f"the tokenizer has no {self.image_token!r} token; a Qwen2-VL processor needs "
                "the vision special tokens (<|vision_start|>, <|vision_end|>, <|image_pad|>)"
            )
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template)

    def __call__(self, images=None, text=None, videos=None, **kwargs):
        if videos is not None:
            raise ValueError(
                "ImageOnlyQwen2VLProcessor takes images and text only; videos need the stock "
                "Qwen2VLProcessor, which needs torchvision"
            )
        return super().__call__(images=images, text=text, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["processor_class"] = self.saved_as
        # The stock processor loads its video processor from this entry (torchvision only):
        # the same patching as the images, the class defaults for the rest.
        image = self.image_processor
        out.setdefault(
            "video_processor",
            {
                "video_processor_type": "Qwen2VLVideoProcessor",
                "patch_size": image.patch_size,
                "temporal_patch_size": image.temporal_patch_size,
                "merge_size": image.merge_size,
            },
        )
        return out

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs) -> Any:
        result = super().save_pretrained(save_directory, **kwargs)
        # ProcessorMixin stamps the tokenizer with this class's own name: name the stock one.
        self.tokenizer._set_processor_class(self.saved_as)
        self.tokenizer.save_pretrained(save_directory)
        return result


def _model_type(path: str) -> str | None:
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        return None
    with open(config, encoding="utf-8") as f:
        return json.load(f).get("model_type")


def load_vision_processor(path: str | os.PathLike) -> Any:
    """The processor of the vision-language model directory ``path``.

    ``AutoProcessor.from_pretrained(path)`` when it gives a processor with an image
    processor; for the Qwen2-VL family (``config.json`` ``model_type`` in
    :data:`IMAGE_ONLY_MODEL_TYPES`) without torchvision, :class:`ImageOnlyQwen2VLProcessor`
    from the directory's image processor, tokenizer and chat template.

    Raises:
        ValueError: the directory holds no image processor, or its model is not one this
            loader can build without torchvision (the message names both).
    """
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    path = os.fspath(path)
    cause: str
    try:
        processor = AutoProcessor.from_pretrained(path)
    except (ValueError, TypeError, OSError, ImportError) as e:
        cause = f"AutoProcessor failed: {type(e).__name__}: {e}"
    else:
        if getattr(processor, "image_processor", None) is not None:
            return processor
        cause = f"AutoProcessor gave a {type(processor).__name__}, which has no image processor"
    model_type = _model_type(path)
    if model_type not in IMAGE_ONLY_MODEL_TYPES:
        raise ValueError(
            f"{path}: cannot load a vision processor ({cause}); model_type={model_type!r} is "
            f"not one verl builds an image-only processor for ({sorted(IMAGE_ONLY_MODEL_TYPES)})"
            "; install torchvision or use a Qwen2-VL family model"
        )
    try:
        image_processor = AutoImageProcessor.from_pretrained(path)
    except (ValueError, OSError) as e:
        raise ValueError(f"{path}: no image processor config ({e})") from e
    tokenizer = AutoTokenizer.from_pretrained(path)
    processor = ImageOnlyQwen2VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=getattr(tokenizer, "chat_template", None),
    )
    processor.saved_as = IMAGE_ONLY_MODEL_TYPES[model_type]
    logger.info("%s: image-only %s processor (%s)", path, model_type, cause)
    return processor


def save_processor_files(module: Any, tokenizer: Any, out_dir: str | os.PathLike) -> bool:
    """Write a vision-language model's processor files (``processor_config.json`` with its
    image processor, the chat template; the tokenizer's files again) into
    ``out_dir``, beside the model an export or checkpoint writes there; nothing for a text
    model. Returns whether it wrote them.

    ``module``: the model (its ``config.model_type`` says whether it is one of
    :data:`IMAGE_ONLY_MODEL_TYPES`); the image processor is the one of the directory it was
    loaded from (``config._name_or_path``), over ``tokenizer`` (the run's). Without such a
    directory a warning says that the export has no processor.
    """
    from transformers import AutoImageProcessor

    config = getattr(module, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in IMAGE_ONLY_MODEL_TYPES:
        return False
    source = getattr(config, "_name_or_path", None) or ""
    try:
        image_processor = AutoImageProcessor.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError) as e:
        logger.warning(
            "%s: no image processor written: the model came from %r, whose image processor "
            "does not load (%s); copy it from the model's directory",
            out_dir,
            source,
            e,
        )
        return False
    processor = ImageOnlyQwen2VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=getattr(tokenizer, "chat_template", None),
    )
    processor.saved_as = IMAGE_ONLY_MODEL_TYPES[model_type]
    processor.save_pretrained(out_dir)
    return True
