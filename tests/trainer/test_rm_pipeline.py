"""The SFT -> reward model -> GRPO example (examples/rm_pipeline.py).

Fast: the data keeps every RL validation problem out of the SFT rows and the reward-model
pairs. Slow: the example runs end to end, 2 steps of each stage on small batches, on the tiny
model and on SmolLM2 (its LoRA reward model in bf16 autocast where the CPU has bf16); GRPO
trains on the reward model's scores alone. The learning runs are measured in
docs/reward_model.md.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from verl.data.arithmetic import row_problem
from verl.data.io import read_records

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rm_pipeline.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("rm_pipeline", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _problem(prompt_text: str) -> tuple[int, str, int]:
    a, op, b = prompt_text.removeprefix("What is ").split("?")[0].split(" ")
    return int(a), op, int(b)


def test_held_out_problems_stay_out_of_sft_and_rm_data(example, tmp_path):
    args = example.parse_args(["--out", str(tmp_path), "--model", "tiny", "--val-size", "16"])
    args.sft_steps = 4
    data = example.make_data(tmp_path, args)
    held_out = {row_problem(r.data) for r in read_records(data["rl_val"]).records}
    assert len(held_out) == 16
    sft = [r.data for r in read_records(data["sft"]).records]
    assert len(sft) == 32
    rm = [r.data for f in ("rm_train", "rm_val") for r in read_records(data[f]).records]
    for row in sft + rm:
        assert _problem(row["prompt"][0]["content"]) not in held_out
    for row in rm:
        a, op, b = _problem(row["prompt"][0]["content"])
        assert row["chosen"] == str(a + b if op == "+" else a * b) != row["rejected"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_pipeline_runs_two_steps_of_each_stage(example, tmp_path, model):
    assert example.main(["--out", str(tmp_path), "--model", model, "--smoke"]) == 0
    result = json.loads((tmp_path / "pipeline.json").read_text())
    assert len(result["sft"]["loss"]) == 2
    assert all(math.isfinite(x) for x in result["sft"]["loss"])
    rm = result["rm"]
    assert len(rm["loss"]) == 2 and all(0.0 <= a <= 1.0 for a in rm["acc"])
    assert [v["step"] for v in rm["val"]] == [0, 2]
    assert (tmp_path / "rm" / "ckpt" / "huggingface" / "config.json").is_file()
    rm_config = json.loads((tmp_path / "rm" / "ckpt" / "huggingface" / "config.json").read_text())
    assert len(rm_config["id2label"]) == 1  # one output: the reward
    assert rm_config["architectures"][0].endswith("ForSequenceClassification")
    grpo = result["grpo"]
    assert [s["step"] for s in grpo["steps"]] == [1, 2]
    for step in grpo["steps"]:
        assert 0.0 <= step["rule_acc"] <= 1.0 and step["rm_score_mean"] is not None
    assert [v["step"] for v in grpo["val"]] == [0, 2]
    # GRPO was trained on the reward model's scores: the run's metrics have them.
    rows = [json.loads(line) for line in (tmp_path / "grpo" / "logs" / "metrics.jsonl").open()]
    assert any("reward/model_score_mean" in row for row in rows)
