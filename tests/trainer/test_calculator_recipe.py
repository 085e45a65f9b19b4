"""The SFT -> GRPO calculator recipe (examples/calculator_sft_grpo.py).

Fast: the SFT data mixes tool-call transcripts and direct answers in the asked proportion,
on problems outside the validation set, and bad fractions are refused. Slow: the recipe runs
end to end (2 SFT steps, 2 GRPO steps, greedy validation before and after) on its tiny
model (``--model tiny``: the same SFT, GRPO and tool plumbing in seconds, not minutes), and
its default base, the embedded SmolLM2 with the tools chat template, is built and loads;
the learning run itself is measured in docs/multiturn.md (it takes many minutes).
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from verl.data.io import read_records

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "calculator_sft_grpo.py"


@pytest.fixture(scope="module")
def recipe():
    spec = importlib.util.spec_from_file_location("calculator_sft_grpo", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sft_rows_mix_tool_calls_and_direct_answers(recipe, tmp_path):
    held_out = {(100, "*", 101), (102, "*", 103)}
    path = recipe.write_sft_rows(tmp_path / "sft.jsonl", 200, 3, 0.25, held_out)
    rows = [r.data["messages"] for r in read_records(path).records]
    assert len(rows) == 200
    with_tool = [m for m in rows if len(m) == 5]
    direct = [m for m in rows if len(m) == 3]
    assert len(with_tool) + len(direct) == 200
    assert 30 <= len(with_tool) <= 70  # 25% of 200 = 50, binomial sd ~6
    for messages in rows:
        assert messages[0] == {"role": "system", "content": recipe.SYSTEM}
        a, b = (int(x) for x in messages[1]["content"].split("?")[0][8:].split(" * "))
        assert (a, "*", b) not in held_out
        assert messages[-1] == {"role": "assistant", "content": str(a * b)}
    call = json.loads(with_tool[0][2]["content"].removeprefix("<tool_call>").split("</")[0])
    assert call["name"] == "calculator" and with_tool[0][3]["role"] == "tool"
    all_tool = recipe.write_sft_rows(tmp_path / "all.jsonl", 20, 3, 1.0, set())
    assert all(len(r.data["messages"]) == 5 for r in read_records(all_tool).records)


def test_bad_tool_fraction_is_refused(recipe, tmp_path):
    with pytest.raises(ValueError, match=r"--tool-fraction 1\.5"):
        recipe.write_sft_rows(tmp_path / "sft.jsonl", 8, 3, 1.5, set())


@pytest.mark.slow
def test_recipe_runs_two_steps_of_each(recipe, tmp_path):
    assert recipe.main(["--out", str(tmp_path), "--smoke", "--model", "tiny"]) == 0
    result = json.loads((tmp_path / "curve.json").read_text())
    assert result["args"]["sft_steps"] == 2 and len(result["sft_loss"]) == 2
    assert all(math.isfinite(x) and x > 0 for x in result["sft_loss"])
    assert result["sft_loss"][1] < result["sft_loss"][0]
    assert [c["step"] for c in result["steps"]] == [1, 2]
    for point in result["steps"]:
        assert 0.0 <= point["correct"] <= 1.0
        assert point["turns_mean"] >= 1.0 and point["tool_calls_mean"] >= 0.0
    assert [v["step"] for v in result["val"]] == [0, 2]  # greedy, before and after GRPO
    for point in result["val"]:
        assert 0.0 <= point["correct"] <= 1.0 and point["tool_calls_mean"] >= 0.0
    transcripts = (tmp_path / "sft" / "train.jsonl").read_text().splitlines()
    assert len(transcripts) == 16  # 8 per SFT step
    assert (tmp_path / "sft_ckpt" / "huggingface" / "config.json").is_file()
    template = (tmp_path / "tiny" / "chat_template.jinja").read_text()
    assert "Tools: " in template


@pytest.mark.slow
def test_smollm2_base_is_the_embedded_model_with_the_tools_template(recipe, tmp_path):
    """The recipe's default base: SmolLM2's cached weights (linked, not copied) and its
    tokenizer with the tools template, whose tool line renders as the SFT transcripts'
    system message (``tool_tokenizer`` checks it on SmolLM2's tokenizer); transformers loads
    the directory as a model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.models.embedded import embedded_model_dir

    base = recipe.smollm2_tools_dir(tmp_path)
    assert base == tmp_path / "smollm2_tools"
    src = embedded_model_dir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        assert (base / name).is_symlink() and (base / name).resolve() == (src / name).resolve()
    template = (base / "chat_template.jinja").read_text()
    assert "Tools: " in template
    tokenizer = AutoTokenizer.from_pretrained(base)
    assert tokenizer.chat_template == recipe.TOOLS_TEMPLATE
    recipe.tool_tokenizer(tokenizer)  # raises if the RL prompt and the SFT prompt differ
    model = AutoModelForCausalLM.from_pretrained(base)
    ids = tokenizer(recipe.SYSTEM, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert bool(torch.isfinite(logits).all())
