"""Tests for verl/data/vision.py: reading and validating image columns, processing a prompt
with its images, and the multimodal position ids."""

from __future__ import annotations

import io
import json

import pytest
import torch
from PIL import Image

from verl.data.io import DatasetValidationError, write_records
from verl.data.vision import (
    ImageProblem,
    ImageSource,
    count_placeholders,
    decode_image,
    image_source,
    multimodal_position_ids,
    process_prompt,
    read_vision_rows,
    to_multimodal_messages,
)
from verl.models.tiny_vision import IMAGE_PAD, tiny_vision_model, tiny_vision_processor


def _png(colour=(255, 0, 0), size=(56, 56)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def _row(content: str, images, source="visual_shapes", answer="red") -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": content}],
        "images": images,
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"index": 0},
    }


@pytest.fixture(scope="module")
def processor():
    return tiny_vision_processor()


@pytest.fixture(scope="module")
def model(processor):
    return tiny_vision_model(processor)


# ------------------------------------------------------------------ entries and decoding


def test_image_source_forms(tmp_path):
    data = _png()
    assert image_source({"bytes": data, "path": None}, str(tmp_path)) == ImageSource(data=data)
    assert image_source({"bytes": None, "path": "a/b.png"}, str(tmp_path)).path == str(
        tmp_path / "a" / "b.png"
    )
    assert image_source("b.png", "/data").path == "/data/b.png"
    assert image_source("/abs/c.png", "/data").path == "/abs/c.png"
    for bad, match in [
        ({"bytes": None, "path": None}, "neither 'bytes' nor 'path'"),
        ({"bytes": "iVBOR..."}, "JSON lines files cannot hold binary"),
        ({"bytes": b""}, "empty"),
        (3, "must be"),
        ("  ", "path is empty"),
    ]:
        with pytest.raises(ImageProblem, match=match):
            image_source(bad, "/data")


def test_decode_image(tmp_path):
    image = decode_image(ImageSource(data=_png((0, 0, 255), (30, 20))))
    assert image.mode == "RGB" and image.size == (30, 20)
    assert image.getpixel((0, 0)) == (0, 0, 255)
    with pytest.raises(ImageProblem, match="not a decodable image"):
        decode_image(ImageSource(data=b"not an image at all"))
    with pytest.raises(ImageProblem, match="not a decodable image"):
        decode_image(ImageSource(data=_png()[:60]))  # truncated
    with pytest.raises(ImageProblem, match=r"does not exist"):
        decode_image(ImageSource(path=str(tmp_path / "missing.png")))


def test_placeholders_and_typed_messages():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "<image>Left or<image>right?"},
    ]
    assert count_placeholders(messages) == 2
    assert to_multimodal_messages(messages) == [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "text", "text": "Left or"},
                {"type": "image"},
                {"type": "text", "text": "right?"},
            ],
        },
    ]


# ------------------------------------------------------------------ reading files


def test_read_parquet_bytes_and_jsonl_paths(tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "0.png").write_bytes(_png((0, 255, 0)))
    abs_png = tmp_path / "abs.png"
    abs_png.write_bytes(_png((0, 0, 255)))
    parquet = write_records(
        [
            _row("<image>What colour?", [{"bytes": _png(), "path": None}]),
            _row("No image here.", []),
        ],
        tmp_path / "train.parquet",
    )
    jsonl = write_records(
        [
            _row("<image>What colour?", [{"path": "imgs/0.png"}], answer="green"),
            _row("<image> and <image>?", ["imgs/0.png", str(abs_png)], answer="blue"),
        ],
        tmp_path / "train.jsonl",
    )
    rows = read_vision_rows([parquet, jsonl])
    assert [len(r.images) for r in rows] == [1, 0, 1, 2]
    assert rows[0].where == f"{parquet} row 1"
    assert rows[3].where == f"{jsonl} line 2"
    colours = [img.getpixel((0, 0)) for r in rows for img in r.load_images()]
    assert colours == [(255, 0, 0), (0, 255, 0), (0, 255, 0), (0, 0, 255)]
    assert rows[1].data["prompt"] == [{"role": "user", "content": "No image here."}]


def test_every_bad_image_is_reported_with_file_and_row(tmp_path):
    path = write_records(
        [
            _row("<image>ok", [{"bytes": _png()}]),
            _row("<image>x", [{"bytes": b"garbage"}]),
            _row("<image>x", [{"path": "nowhere/missing.png"}]),
            _row("<image>x", [{"bytes": _png()}, {"bytes": _png()}]),
            _row("<image><image>x", [{"bytes": _png()}]),
            {
                "data_source": "visual_shapes",
                "prompt": [{"role": "user", "content": "<image>x"}],
                "images": [{"bytes": _png()}],
            },
        ],
        tmp_path / "bad.parquet",
    )
    with pytest.raises(DatasetValidationError) as info:
        read_vision_rows(path)
    problems = info.value.problems
    text = str(info.value)
    assert f"{path} row 2: image 1 of 1: 7 bytes: not a decodable image (PIL does not" in text
    missing = tmp_path / "nowhere" / "missing.png"
    assert f"{path} row 3: image 1 of 1: image file {missing} does not exist" in text
    assert f"{path} row 4: 2 image(s) but 1 '<image>' placeholder(s) in the prompt: more" in text
    assert f"{path} row 5: 1 image(s) but 2 '<image>' placeholder(s) in the prompt: fewer" in text
    assert f"{path} row 6: missing required field 'reward_model'" in text
    assert not any("row 1:" in p for p in problems)
    assert len(problems) == 5


def test_jsonl_bytes_and_non_lists_are_refused(tmp_path):
    path = tmp_path / "bad.jsonl"
    rows = [_row("<image>x", [{"bytes": "aGVsbG8="}]), _row("no placeholder", "img.png")]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(DatasetValidationError) as info:
        read_vision_rows(path)
    assert info.value.problems == [
        f"{path} line 1: image 1 of 1: 'bytes' must be binary image data, got str 'aGVsbG8=' "
        "(JSON lines files cannot hold binary data: give a 'path', or write parquet)",
        f"{path} line 2: 'images' must be a list of images, got str 'img.png'",
    ]


# ------------------------------------------------------------------ processing


def test_process_prompt_gives_the_processor_inputs(processor):
    images = [Image.new("RGB", (56, 56), (255, 0, 0)), Image.new("RGB", (112, 56), (0, 0, 255))]
    messages = [{"role": "user", "content": "<image>Left, <image>right: which is red?"}]
    out = process_prompt(processor, messages, images)
    assert out["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 8]]
    image_id = processor.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    n_image_tokens = (16 + 32) // 4
    assert int((out["input_ids"] == image_id).sum()) == n_image_tokens
    assert int(out["mm_token_type_ids"].sum()) == n_image_tokens
    assert out["pixel_values"].shape == (16 + 32, 1176)
    assert out["attention_mask"].all() and out["input_ids"].dim() == 1
    text = processor.tokenizer.decode(out["input_ids"])
    assert text.startswith("<|im_start|>user\n<|vision_start|><|image_pad|>")
    assert text.endswith("which is red?<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match=r"1 image\(s\) for 2"):
        process_prompt(processor, messages, images[:1])


def test_text_only_prompt(processor, model):
    out = process_prompt(processor, [{"role": "user", "content": "Hi"}], config=model.config)
    assert "pixel_values" not in out and not out["mm_token_type_ids"].any()
    n = out["input_ids"].numel()
    assert out["position_ids"].tolist() == [list(range(n))] * 4


def test_position_ids_match_the_model(processor, model):
    """The (4, L) ids from the model class's get_rope_index give the logits the model
    computes with its own positions."""
    images = [Image.new("RGB", (84, 56), (0, 255, 0))]
    messages = [{"role": "user", "content": "Look: <image> What colour?"}]
    out = process_prompt(processor, messages, images, config=model.config)
    pos = out["position_ids"]
    n = out["input_ids"].numel()
    assert pos.shape == (4, n)
    assert pos[0].tolist() == list(range(n))
    # image tokens share a temporal position and spread over height x width (2 x 3 tokens)
    image = out["mm_token_type_ids"].bool()
    first = int(image.nonzero()[0])
    assert pos[1, image].unique().tolist() == [first]
    assert sorted(set(pos[2, image].tolist())) == [first, first + 1]
    assert sorted(set(pos[3, image].tolist())) == [first, first + 1, first + 2]
    # text after the image continues from the largest image position + 1
    assert pos[1:, first + 6].tolist() == [first + 3] * 3
    batch = {
        k: v.unsqueeze(0) for k, v in out.items() if k not in ("pixel_values", "image_grid_thw")
    }
    kwargs = dict(pixel_values=out["pixel_values"], image_grid_thw=out["image_grid_thw"])
    with torch.no_grad():
        own = model(**{k: v for k, v in batch.items() if k != "position_ids"}, **kwargs).logits
        model.model.rope_deltas = None
        given = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"].transpose(0, 1),
            **kwargs,
        ).logits
    assert torch.allclose(own, given, atol=1e-5)


def test_position_ids_of_a_left_padded_batch(processor, model):
    a = process_prompt(
        processor, [{"role": "user", "content": "<image>Hi"}], [Image.new("RGB", (56, 56))]
    )
    b = process_prompt(
        processor,
        [{"role": "user", "content": "A longer question <image>?"}],
        [Image.new("RGB", (56, 56))],
    )
    width = max(a["input_ids"].numel(), b["input_ids"].numel())

    def left_pad(x):
        return torch.cat([torch.zeros(width - x.numel(), dtype=x.dtype), x])

    ids = torch.stack([left_pad(a["input_ids"]), left_pad(b["input_ids"])])
    mask = torch.stack([left_pad(a["attention_mask"]), left_pad(b["attention_mask"])])
    types = torch.stack([left_pad(a["mm_token_type_ids"]), left_pad(b["mm_token_type_ids"])])
    grids = torch.cat([a["image_grid_thw"], b["image_grid_thw"]])
    pos = multimodal_position_ids(model.config, ids, types, grids, mask)
    assert pos.shape == (4, 2, width)
    single = multimodal_position_ids(
        model.config, a["input_ids"], a["mm_token_type_ids"], a["image_grid_thw"]
    )
    pad = width - a["input_ids"].numel()
    assert torch.equal(pos[:, 0, pad:], single)
    assert not pos[:, 0, :pad].any()


def test_position_ids_refuse_a_text_model():
    from verl.models.tiny import build_tiny_model

    config = build_tiny_model(hidden_size=16, num_layers=1).config
    with pytest.raises(ValueError, match=r"model_type='qwen2' has no multimodal rope index"):
        multimodal_position_ids(
            config, torch.ones(3, dtype=torch.long), torch.zeros(3, dtype=torch.long)
        )
