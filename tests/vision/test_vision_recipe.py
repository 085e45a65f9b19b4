"""The SFT -> GRPO recipe of the tiny Qwen2-VL on the synthetic visual task
(examples/vision_shapes_sft_grpo.py).

Fast: an SFT batch is rollout-shaped (prompts left-padded, ``answer<|im_end|>`` right-padded)
and its multimodal rope index equals the one the model computes itself. Slow: the recipe
runs end to end (2 SFT steps, 2 GRPO steps, greedy accuracy before and after); the learning
run itself is measured in docs/vision.md.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "vision_shapes_sft_grpo.py"


@pytest.fixture(scope="module")
def recipe():
    spec = importlib.util.spec_from_file_location("vision_shapes_sft_grpo", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sft_batch_is_rollout_shaped_with_the_models_rope_index(recipe, vl):
    ds, _ = vl.prompts(rows=2)
    items = [ds[0], ds[1]]
    tokenizer = vl.processor.tokenizer
    data, width = recipe.sft_batch(items, tokenizer, vl.model.config)
    b = data.batch
    assert b["response_mask"].shape == (2, width)
    for i, item in enumerate(items):
        answer = tokenizer(item["ground_truth"] + tokenizer.eos_token, add_special_tokens=False)
        n = len(answer["input_ids"])
        assert b["input_ids"][i, -width:][:n].tolist() == answer["input_ids"]
        assert int(b["response_mask"][i].sum()) == n
    # the model's own positions (get_rope_index over prompt + answer) give the same logits
    positions, inputs = recipe.forward_inputs(data)
    with torch.no_grad():
        ours = vl.model(
            input_ids=b["input_ids"],
            attention_mask=b["attention_mask"],
            position_ids=positions,
            **inputs,
        ).logits
        types = (b["input_ids"] == vl.model.config.image_token_id).long()
        theirs = vl.model(
            input_ids=b["input_ids"],
            attention_mask=b["attention_mask"],
            mm_token_type_ids=types,
            **inputs,
        ).logits
    real = b["attention_mask"].bool()
    assert (ours - theirs)[real].abs().max().item() < 1e-5


@pytest.mark.slow
def test_recipe_runs_end_to_end(recipe, tmp_path):
    curve = recipe.main(["--out", str(tmp_path), "--smoke"])
    saved = json.loads((tmp_path / "curve.json").read_text())
    assert saved["grpo"] == curve["grpo"]
    for stage in ("majority", "random", "sft", "grpo"):
        assert set(curve[stage]) == {"colour", "count", "all"}
        assert all(0.0 <= v <= 1.0 for v in curve[stage].values())
    assert len(curve["sft_loss"]) == 2 and all(math.isfinite(v) for v in curve["sft_loss"])
    assert curve["sft_loss"][1] < curve["sft_loss"][0]
    assert [m["step"] for m in curve["grpo_history"]] == [1, 2]
    assert (tmp_path / "grpo" / "huggingface" / "processor_config.json").is_file()


def test_majority_is_the_best_blind_answer(recipe):
    def item(task, answer):
        return {"extra_info": {"task": task}, "ground_truth": answer}

    items = [item("colour", "red"), item("colour", "red"), item("colour", "blue")]
    items += [item("count", "2"), item("count", "3")]
    assert recipe.majority(items) == {"colour": 2 / 3, "count": 1 / 2, "all": 3 / 5}


def test_expected_accuracy_is_the_answer_probability_cut_at_four_tokens(recipe, vl):
    ds, _ = vl.prompts(rows=3)
    items = [ds[0], ds[1], ds[2]]
    tokenizer = vl.processor.tokenizer
    vl.model.eval()
    got = recipe.expected_accuracy(vl.model, items, tokenizer)
    want = []
    for item in items:  # one row at a time, the model's own positions
        data, width = recipe.sft_batch([item], tokenizer, vl.model.config)
        b = data.batch
        _, inputs = recipe.forward_inputs(data)
        types = (b["input_ids"] == vl.model.config.image_token_id).long()
        with torch.no_grad():
            logits = vl.model(input_ids=b["input_ids"], mm_token_type_ids=types, **inputs).logits[0]
        answer = b["input_ids"][0, -width:][: min(4, int(b["response_mask"].sum()))]
        start = b["input_ids"].shape[1] - width
        probs = logits[start - 1 : start - 1 + len(answer)].softmax(-1)
        want.append(probs[torch.arange(len(answer)), answer].prod().item())
    assert abs(got["all"] - sum(want) / len(want)) < 1e-5
    assert 0.0 < got["all"] < 1.0
