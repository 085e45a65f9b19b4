"""The SFT -> reward model -> GRPO example (examples/rm_pipeline.py).

Fast: the data keeps every RL validation problem out of the SFT rows and the reward-model
pairs. Slow: the example runs end to end, 2 steps of each stage on small batches, on the tiny
model and on SmolLM2 (its LoRA reward model in bf16 autocast where the CPU has bf16); GRPO
trains on the reward model's scores alone; the tiny model's run is made once
(``tiny_smoke``) for the test of its results and the test that reuses its reward model (one
xdist group, so both find it). The learning runs are measured in docs/reward_model.md.
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


@pytest.mark.parametrize(("argv", "use_kl"), [([], True), (["--kl-coef", "0"], False)])
def test_kl_coef_flag_sets_the_grpo_kl_loss(example, tmp_path, argv, use_kl):
    args = example.parse_args(["--out", str(tmp_path), *argv])
    data = example.make_data(tmp_path, args)
    cfg = example.grpo_config(
        "smollm2-135m-instruct", "smollm2-135m-instruct", data, tmp_path, args
    )
    actor = cfg.actor_rollout_ref.actor
    assert actor.use_kl_loss is use_kl
    assert not cfg.algorithm.use_kl_in_reward  # one KL term: the loss, not the reward
    assert cfg.reward_model.enable and cfg.reward_model.model.path == "smollm2-135m-instruct"
    if use_kl:
        assert actor.kl_loss_coef == example.DEFAULTS["smollm2"]["kl_coef"] > 0
        assert actor.kl_loss_type == "low_var_kl"
    args = example.parse_args(["--out", str(tmp_path), "--kl-coef", "0.25"])
    cfg = example.grpo_config("smollm2-135m-instruct", None, data, tmp_path, args)
    assert cfg.actor_rollout_ref.actor.kl_loss_coef == 0.25 and not cfg.reward_model.enable


@pytest.mark.parametrize(
    "argv", [["--kl-coef", "-0.1"], ["--rm-model", "x", "--reward", "rule"]], ids=["kl", "rm"]
)
def test_contradictory_flags_are_refused(example, tmp_path, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        example.parse_args(["--out", str(tmp_path), *argv])
    assert exc.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_mixed_rm_pairs_train_on_policy_and_synthetic_pairs(example, tmp_path, monkeypatch):
    args = example.parse_args(["--out", str(tmp_path), "--rm-pairs", "mixed"])
    args.rm_problems, args.rm_val_problems = 16, 8
    data = example.make_data(tmp_path, args)
    held_out = {row_problem(r.data) for r in read_records(data["rl_val"]).records}
    sampled = {}

    def fake_sampling(model_dir, rows, samples, per_problem, seed):
        # a right and a wrong "policy answer" per problem, as the sampler would pair them
        sampled[seed] = {row_problem(r) for r in rows}
        return [
            {"prompt": r["prompt"], "chosen": "It is 5", "rejected": "Hm", "error": "policy"}
            for r in rows
        ]

    monkeypatch.setattr(example, "sample_policy_pairs", fake_sampling)
    files = example.write_policy_pairs("smollm2-135m-instruct", tmp_path, held_out, args)
    policy, synthetic = files["rm_train"]
    assert Path(policy).name == "policy_rm_train.parquet"
    assert Path(files["rm_val"]).name == "policy_rm_val.parquet"
    rows = [r.data for r in read_records(synthetic).records]
    assert len(rows) == 16 * args.wrong_per_problem
    for row in rows:  # no RL validation problem, no RM validation problem
        assert _problem(row["prompt"][0]["content"]) not in held_out | sampled[2]
        assert row["chosen"] != row["rejected"] and row["rejected"].lstrip("-").isdigit()
    cfg = example.rm_config("smollm2-135m-instruct", data | files, tmp_path, args)
    assert list(cfg.data.train_files) == [policy, synthetic]
    assert list(cfg.data.val_files) == [files["rm_val"]]


def test_last_validation_samples_are_the_wrong_answers_of_the_last_validation(example, tmp_path):
    val = tmp_path / "grpo" / "validation"
    val.mkdir(parents=True)
    rows = [("12", "12"), ("The answer is 7", "8"), ("5", "5"), ("9 + 9 = 81", "18")]
    (val / "4.jsonl").write_text(json.dumps({"response": "1", "ground_truth": "2"}) + "\n")
    (val / "16.jsonl").write_text(
        "".join(json.dumps({"response": r, "ground_truth": t}) + "\n" for r, t in rows)
    )
    samples = example.last_validation_samples(tmp_path)
    assert samples == [
        {"step": 16, "response": "The answer is 7", "ground_truth": "8"},
        {"step": 16, "response": "9 + 9 = 81", "ground_truth": "18"},
    ]
    assert example.last_validation_samples(tmp_path / "none") == []


TINY_SMOKE = "rm_pipeline_tiny_smoke"  # the xdist group of the tests that read tiny_smoke


@pytest.fixture(scope="module")
def tiny_smoke(example, tmp_path_factory) -> Path:
    """The output directory of the example's ``--smoke`` run on the tiny model."""
    out = tmp_path_factory.mktemp("tiny_smoke")
    assert example.main(["--out", str(out), "--model", "tiny", "--smoke"]) == 0
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "model", [pytest.param("tiny", marks=pytest.mark.xdist_group(TINY_SMOKE)), "smollm2"]
)
def test_pipeline_runs_two_steps_of_each_stage(example, tmp_path, model, request):
    if model == "tiny":
        tmp_path = request.getfixturevalue("tiny_smoke")
    else:
        # one torch thread, as the rest of the suite: the example's default for SmolLM2 (2)
        # stalls on two cores shared with the other xdist worker, and main() sets the count
        # for the whole process
        argv = ["--out", str(tmp_path), "--model", model, "--smoke", "--threads", "1"]
        assert example.main(argv) == 0
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
    # SmolLM2's default KL loss to the initial policy ran: its value is in every step
    kl = [step["kl"] for step in grpo["steps"]]
    assert all(k is not None and k >= 0.0 for k in kl) if model == "smollm2" else kl == [None] * 2
    assert (tmp_path / "grpo" / "validation" / "2.jsonl").is_file()


@pytest.mark.slow
@pytest.mark.xdist_group(TINY_SMOKE)
def test_pipeline_reuses_a_trained_reward_model(example, tmp_path, tiny_smoke):
    rm_dir = tiny_smoke / "rm" / "ckpt" / "huggingface"
    second = tmp_path / "second"
    argv = ["--out", str(second), "--model", "tiny", "--smoke", "--kl-coef", "0"]
    assert example.main([*argv, "--rm-model", str(rm_dir)]) == 0
    result = json.loads((second / "pipeline.json").read_text())
    assert result["rm"]["loss"] == [] and not (second / "rm" / "ckpt").exists()
    assert [s["step"] for s in result["grpo"]["steps"]] == [1, 2]
    assert all(s["kl"] is None for s in result["grpo"]["steps"])  # no KL term, no reference
    rows = [json.loads(line) for line in (second / "grpo" / "logs" / "metrics.jsonl").open()]
    assert any("reward/model_score_mean" in row for row in rows)
