"""The SFT -> GRPO calculator recipe (examples/calculator_sft_grpo.py) runs end to end:
2 SFT steps on generated tool-call transcripts, then 2 GRPO steps with the calculator
(the learning run itself is measured in docs/multiturn.md; it takes minutes)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "calculator_sft_grpo.py"


@pytest.mark.slow
def test_recipe_runs_two_steps_of_each(tmp_path):
    spec = importlib.util.spec_from_file_location("calculator_sft_grpo", RECIPE)
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    assert recipe.main(["--out", str(tmp_path), "--smoke"]) == 0
    result = json.loads((tmp_path / "curve.json").read_text())
    assert result["sft_steps"] == 2 and len(result["sft_loss"]) == 2
    assert all(math.isfinite(x) and x > 0 for x in result["sft_loss"])
    assert [c["step"] for c in result["curve"]] == [1, 2]
    for point in result["curve"]:
        assert 0.0 <= point["correct"] <= 1.0
        assert point["turns_mean"] >= 1.0 and point["tool_calls_mean"] >= 0.0
    transcripts = (tmp_path / "sft" / "train.jsonl").read_text().splitlines()
    assert len(transcripts) == 32
    assert (tmp_path / "sft_ckpt" / "huggingface" / "config.json").is_file()
