"""A tiny, randomly initialised Qwen2-VL model and its processor, built offline.

The architecture is transformers' own ``Qwen2VLForConditionalGeneration`` (vision
transformer, patch merger, language model with multimodal 3-D rope), at sizes that run a
forward in milliseconds on a CPU. The processor is Qwen2-VL's: its image processor from a
config (patch 14, merge 2, temporal patch 2; images resized to between ``min_pixels`` and
``max_pixels``), and the tiny byte-level BPE of :mod:`verl.models.tiny` extended with the
vision special tokens and a chat template that places them:

    user content [{"type": "image"}, {"type": "text", "text": "What colour?"}]
    -> <|im_start|>user\\n<|vision_start|><|image_pad|><|vision_end|>What colour?<|im_end|>\\n

The processor expands each ``<|image_pad|>`` to ``t * h * w / 4`` image tokens (``(t, h,
w)`` the image's patch grid, ``image_grid_thw``): a 56x56 image is a 4x4 grid, 4 tokens.
Without torchvision the processor is :class:`ImageOnlyQwen2VLProcessor`
(:mod:`verl.models.vision_processor` says why); a saved directory is an ordinary Qwen2-VL
directory: ``load_vision_processor(dir)`` (or ``AutoProcessor`` where torchvision is
installed) and ``AutoModelForImageTextToText.from_pretrained(dir)`` load it back.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from verl.models.tiny import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    _tokenizer_json,
)
from verl.models.vision_processor import ImageOnlyQwen2VLProcessor

logger = logging.getLogger(__name__)

__all__ = [
    "IMAGE_PAD",
    "VIDEO_PAD",
    "VISION_CHAT_TEMPLATE",
    "VISION_END",
    "VISION_START",
    "build_tiny_vision_tokenizer",
    "mrope_section",
    "save_tiny_vision_model_dir",
    "tiny_vision_model",
    "tiny_vision_processor",
]

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
# Appended after the trained vocabulary, in this order (ids len(base) .. len(base) + 3).
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
TINY_VISION_MAX_LENGTH = 1024

# ChatML whose message content is a string or a list of {"type": "image"} /
# {"type": "text", "text": ...} parts, as Qwen2-VL's own template places them.
VISION_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Qwen2-VL's defaults are 56*56 .. 28*28*1280 pixels: the tiny processor keeps images small.
TINY_MIN_PIXELS = 56 * 56
TINY_MAX_PIXELS = 112 * 112


def build_tiny_vision_tokenizer(cache_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """The tiny ChatML tokenizer (:func:`verl.models.tiny.build_tiny_tokenizer`) with
    Qwen2-VL's vision special tokens and :data:`VISION_CHAT_TEMPLATE`.

    Ids 0-2 as the tiny tokenizer (``<|endoftext|>`` pad, ``<|im_start|>``, ``<|im_end|>``
    eos); the four vision tokens follow the trained vocabulary.
    """
    tok = Tokenizer.from_str(_tokenizer_json(cache_dir))
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START, *VISION_TOKENS],
        model_max_length=TINY_VISION_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = VISION_CHAT_TEMPLATE
    return hf_tok


def tiny_vision_processor(
    tokenizer: PreTrainedTokenizerFast | None = None,
    *,
    min_pixels: int = TINY_MIN_PIXELS,
    max_pixels: int = TINY_MAX_PIXELS,
    cache_dir: str | Path | None = None,
) -> Any:
    """A Qwen2-VL processor over the tiny tokenizer (patch 14, merge 2: one image token per
    28x28 pixels after resizing into ``[min_pixels, max_pixels]``).

    The image processor is the torchvision one where torchvision is installed, else the PIL
    one; the processor is :class:`ImageOnlyQwen2VLProcessor` (no video processor).
    """
    from transformers.utils import is_torchvision_available

    if not 0 < min_pixels <= max_pixels:
        raise ValueError(f"need 0 < min_pixels <= max_pixels, got {min_pixels}, {max_pixels}")
    if is_torchvision_available():
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import (
            Qwen2VLImageProcessor as ImageProcessor,
        )
    else:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil as ImageProcessor,
        )
    tokenizer = tokenizer if tokenizer is not None else build_tiny_vision_tokenizer(cache_dir)
    image_processor = ImageProcessor(
        size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
    )
    return ImageOnlyQwen2VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template or VISION_CHAT_TEMPLATE,
    )


def mrope_section(head_dim: int) -> list[int]:
    """Qwen2-VL's split of the rotary half-dimension over (temporal, height, width):
    ``[16, 24, 24]`` for its head_dim 128, the same proportions for other sizes."""
    if head_dim % 2:
        raise ValueError(f"head_dim={head_dim} must be even for rotary embeddings")
    half = head_dim // 2
    spatial = 3 * half // 8
    if spatial < 1 or half - 2 * spatial < 1:
        raise ValueError(f"head_dim={head_dim} is too small to split over 3 rope axes")
    return [half - 2 * spatial, spatial, spatial]


def tiny_vision_model(
    processor: Any = None,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    vision_depth: int = 1,
    vision_embed_dim: int = 32,
    vision_heads: int = 2,
    max_position_embeddings: int = TINY_VISION_MAX_LENGTH,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    tie_word_embeddings: bool = True,
) -> PreTrainedModel:
    """A random ``Qwen2VLForConditionalGeneration`` sized to ``processor`` (deterministic
    for ``seed``; the tiny processor when None).

    ``vocab_size = len(tokenizer)``; the image/video/vision-start/end token ids and the
    patch sizes come from the processor, so its inputs fit the model. Returned in eval mode.
    """
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not divisible by num_kv_heads={num_kv_heads}")
    if vision_embed_dim % vision_heads:
        raise ValueError(
            f"vision_embed_dim={vision_embed_dim} is not divisible by vision_heads={vision_heads}"
        )
    processor = processor if processor is not None else tiny_vision_processor()
    tokenizer = processor.tokenizer
    image = processor.image_processor
    ids = dict(zip(VISION_TOKENS, tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))))
    pad_id = tokenizer.pad_token_id
    eos_id = tokenizer.eos_token_id
    bos_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else pad_id
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            max_position_embeddings=max_position_embeddings,
            rms_norm_eps=1e-6,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": mrope_section(hidden_size // num_heads),
            },
            pad_token_id=pad_id,
            eos_token_id=eos_id,
            bos_token_id=bos_id,
            tie_word_embeddings=tie_word_embeddings,
        ),
        vision_config=dict(
            depth=vision_depth,
            embed_dim=vision_embed_dim,
            hidden_size=hidden_size,  # the merger's output: the language model's width
            num_heads=vision_heads,
            mlp_ratio=2,
            patch_size=image.patch_size,
            spatial_merge_size=image.merge_size,
            temporal_patch_size=image.temporal_patch_size,
        ),
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        tie_word_embeddings=tie_word_embeddings,
    )
    # fork_rng keeps model building from disturbing the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config).to(dtype)
    model.generation_config.pad_token_id = pad_id
    model.generation_config.eos_token_id = eos_id
    model.generation_config.bos_token_id = bos_id
    return model.eval()


def save_tiny_vision_model_dir(
    path: str | Path, processor: Any = None, **model_kwargs: Any
) -> Path:
    """Write a tiny Qwen2-VL model and its processor as a HF directory and return it.

    ``model_kwargs`` go to :func:`tiny_vision_model` (hidden_size, num_layers, seed, ...).
    """
    path = Path(path)
    processor = processor if processor is not None else tiny_vision_processor()
    model = tiny_vision_model(processor, **model_kwargs)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    logger.info("saved tiny qwen2_vl model (%d params) to %s", model.num_parameters(), path)
    return path
