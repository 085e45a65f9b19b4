"""Tests for verl/models/tiny_vision.py and verl/models/vision_processor.py: a tiny Qwen2-VL
model and processor built offline, run, saved and loaded back."""

import json

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from verl.models.tiny_vision import (
    IMAGE_PAD,
    VISION_END,
    VISION_START,
    mrope_section,
    save_tiny_vision_model_dir,
    tiny_vision_model,
    tiny_vision_processor,
)
from verl.models.vision_processor import ImageOnlyQwen2VLProcessor, load_vision_processor

MESSAGES = [
    {
        "role": "user",
        "content": [{"type": "image"}, {"type": "text", "text": "What colour is the square?"}],
    }
]


@pytest.fixture(scope="module")
def processor():
    return tiny_vision_processor()


@pytest.fixture(scope="module")
def model(processor):
    return tiny_vision_model(processor)


def _inputs(processor, size=(56, 56), images=1):
    image = Image.new("RGB", size, (255, 0, 0))
    content = [{"type": "image"}] * images + [{"type": "text", "text": "What colour?"}]
    text = processor.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    return processor(text=[text], images=[image] * images, return_tensors="pt")


def test_chat_template_places_the_vision_tokens(processor):
    text = processor.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert text == (
        f"<|im_start|>user\n{VISION_START}{IMAGE_PAD}{VISION_END}What colour is the square?"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = processor.tokenizer.convert_tokens_to_ids([VISION_START, VISION_END, IMAGE_PAD])
    assert len(set(ids)) == 3 and all(i >= 3 for i in ids)


@pytest.mark.parametrize(
    ("size", "grid"),
    [((56, 56), (1, 4, 4)), ((112, 84), (1, 6, 8)), ((20, 20), (1, 4, 4)), ((400, 400), (1, 8, 8))],
)
def test_processor_expands_an_image_to_its_tokens(processor, size, grid):
    # (width, height) -> resized to multiples of 28 within [56*56, 112*112] pixels; one
    # token per 2x2 patches of 14 pixels
    out = _inputs(processor, size)
    assert out["image_grid_thw"].tolist() == [list(grid)]
    t, h, w = grid
    image_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert int((out["input_ids"] == image_id).sum()) == t * h * w // 4
    assert out["pixel_values"].shape == (t * h * w, 3 * 2 * 14 * 14)
    assert out["mm_token_type_ids"].sum() == t * h * w // 4


def test_forward_with_an_image_gives_logits(processor, model):
    out = _inputs(processor, images=2)
    logits = model(**out).logits
    assert logits.shape == (1, out["input_ids"].shape[1], len(processor.tokenizer))
    assert torch.isfinite(logits).all()
    # the image changes the output: the vision tower is wired in
    other = dict(out)
    other["pixel_values"] = out["pixel_values"] + 1.0
    assert not torch.allclose(model(**other).logits, logits)


def test_generate_with_an_image(processor, model):
    out = _inputs(processor)
    seq = model.generate(**out, max_new_tokens=4, do_sample=False)
    assert seq.shape[0] == 1 and out["input_ids"].shape[1] < seq.shape[1] <= 4 + seq.shape[1]
    assert torch.equal(seq[:, : out["input_ids"].shape[1]], out["input_ids"])


def test_model_is_deterministic_for_a_seed(processor):
    a = tiny_vision_model(processor, seed=3)
    b = tiny_vision_model(processor, seed=3)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name


def test_mrope_section():
    assert mrope_section(128) == [16, 24, 24]  # Qwen2-VL-7B's
    assert mrope_section(16) == [2, 3, 3]
    with pytest.raises(ValueError, match="even"):
        mrope_section(15)


def test_saved_directory_loads_back(tmp_path, processor):
    path = save_tiny_vision_model_dir(tmp_path / "vl", processor, seed=1)
    config = json.loads((path / "processor_config.json").read_text())
    assert config["processor_class"] == "Qwen2VLProcessor"
    assert config["video_processor"]["patch_size"] == 14
    tok_config = json.loads((path / "tokenizer_config.json").read_text())
    assert tok_config["processor_class"] == "Qwen2VLProcessor"

    loaded = load_vision_processor(path)
    assert loaded.image_processor.patch_size == 14
    assert loaded.tokenizer.convert_tokens_to_ids(
        IMAGE_PAD
    ) == processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    original = tiny_vision_model(processor, seed=1)
    reloaded = AutoModelForImageTextToText.from_pretrained(path).eval()
    assert type(reloaded).__name__ == "Qwen2VLForConditionalGeneration"
    a, b = _inputs(processor), _inputs(loaded)
    assert torch.equal(a["input_ids"], b["input_ids"])
    assert torch.equal(a["pixel_values"], b["pixel_values"])
    with torch.no_grad():
        assert torch.allclose(original(**a).logits, reloaded(**b).logits, atol=1e-6)


def test_auto_processor_without_torchvision(tmp_path, processor):
    """Without torchvision transformers cannot build Qwen2VLProcessor (its video processor
    needs it): load_vision_processor builds the image-only processor instead."""
    from transformers.utils import is_torchvision_available

    path = tmp_path / "p"
    processor.save_pretrained(path)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2_vl"}))
    loaded = load_vision_processor(path)
    if is_torchvision_available():
        assert type(AutoProcessor.from_pretrained(path)).__name__ == "Qwen2VLProcessor"
    else:
        with pytest.raises(ImportError, match="Torchvision"):
            AutoProcessor.from_pretrained(path)
        assert isinstance(loaded, ImageOnlyQwen2VLProcessor)
    assert loaded.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=False
    ) == processor.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)


def test_load_vision_processor_refuses_a_text_model(tmp_path):
    from verl.models.tiny import save_tiny_model_dir

    path = save_tiny_model_dir(tmp_path / "text", hidden_size=16, num_layers=1)
    with pytest.raises(ValueError, match=r"model_type='qwen2'.*torchvision"):
        load_vision_processor(path)


def test_videos_are_refused(processor):
    with pytest.raises(ValueError, match="videos"):
        processor(text=["x"], videos=[[Image.new("RGB", (56, 56))]])
