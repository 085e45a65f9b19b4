"""`verl generate` and `verl eval` on a tiny model, and the pass@k / mean@n arithmetic."""

from __future__ import annotations

import json
import logging
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl import cli
from verl.cli._rollout_args import load_rollout_config, run_config_file
from verl.cli.evaluate import build_parser
from verl.config import load_config, to_yaml
from verl.rewards.scorers import default_compute_score
from verl.trainer.rl.evaluation import default_ks, evaluate_rows, pass_at_k

COLUMNS = {
    "data_source",
    "prompt",
    "prompt_text",
    "ground_truth",
    "extra_info",
    "index",
    "prompt_token_ids",
    "temperature",
    "responses",
    "response_token_ids",
    "response_lengths",
    "response_log_probs",
    "response_token_log_probs",
    "scores",
    "accs",
}


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 2, 3) == 1.0  # fewer than 3 wrong: any 3 hold a right one
    assert pass_at_k(5, 0, 5) == 0.0
    with pytest.raises(ValueError, match=r"k=5.*1 <= k <= n"):
        pass_at_k(4, 1, 5)
    assert default_ks(8) == [1, 2, 4, 8] and default_ks(6) == [1, 2, 4, 6] and default_ks(1) == [1]


def test_evaluate_rows_per_source_and_overall():
    rows = [
        {"data_source": "a", "accs": [1.0, 0.0, 0.0, 0.0], "scores": [1.0, 0.0, 0.0, 0.0]},
        {"data_source": "a", "accs": [1.0, 1.0, 1.0, 1.0], "scores": [1.0, 1.0, 1.0, 0.5]},
        {"data_source": "b", "accs": [0.0, 0.0, 0.0, 0.0], "scores": [0.0, 0.0, 0.0, 0.0]},
    ]
    report = evaluate_rows(rows, ks=[1, 2, 4])
    a = report["by_source"]["a"]
    assert (a["prompts"], a["n"]) == (2, 4)
    assert a["acc/mean@4"] == pytest.approx(5 / 8)
    assert a["score/mean@4"] == pytest.approx(4.5 / 8)
    assert a["pass@1"] == pytest.approx((0.25 + 1.0) / 2)
    assert a["pass@2"] == pytest.approx((0.5 + 1.0) / 2)
    assert a["pass@4"] == 1.0
    assert report["by_source"]["b"]["pass@4"] == 0.0
    overall = report["overall"]
    assert overall["prompts"] == 3 and overall["pass@2"] == pytest.approx(1.5 / 3)
    assert overall["acc/mean@4"] == pytest.approx(5 / 12)


def test_evaluate_rows_bad_input():
    with pytest.raises(ValueError, match="no generations"):
        evaluate_rows([])
    rows = [{"data_source": "a", "accs": [1.0, 0.0], "scores": [1.0, 0.0]}]
    with pytest.raises(ValueError, match=r"k=4: .* n=2"):
        evaluate_rows(rows, ks=[1, 4])


def test_generate_writes_n_scored_responses_per_prompt(
    tiny_model_dir, arith_file, tmp_path, capsys
):
    out = tmp_path / "gens.parquet"
    args = ["generate", "--model", str(tiny_model_dir), "--data", str(arith_file)]
    args += ["--n", "3", "--max-new-tokens", "5", "--batch-size", "2", "--seed", "7"]
    assert cli.main([*args, "-o", str(out)]) == 0
    assert f"wrote 5 prompts x 3 = 15 responses to {out}" in capsys.readouterr().out
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 5
    for row in rows:
        assert set(row) == COLUMNS
        assert row["data_source"] == "arithmetic"
        assert (
            row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"] in row["prompt_text"]
        )
        for key in ("responses", "response_lengths", "response_log_probs", "scores", "accs"):
            assert len(row[key]) == 3, key
        assert row["temperature"] == 1.0 and len(row["response_token_ids"]) == 3
        assert all(isinstance(t, int) for t in row["prompt_token_ids"])
        for tokens, ids, total, length in zip(
            row["response_token_log_probs"],
            row["response_token_ids"],
            row["response_log_probs"],
            row["response_lengths"],
        ):
            assert 1 <= length <= 5 and len(tokens) == length == len(ids)
            assert total == pytest.approx(sum(tokens), abs=1e-4)
            assert all(lp <= 0 for lp in tokens)
        # the reward manager's scores are the data source's scorer on the response text
        for response, score in zip(row["responses"], row["scores"]):
            expected = default_compute_score("arithmetic", response, row["ground_truth"])
            expected = expected["score"] if isinstance(expected, dict) else expected
            assert score == pytest.approx(float(expected))
    # a fixed seed gives the same samples
    again = tmp_path / "again.parquet"
    assert cli.main([*args, "-o", str(again)]) == 0
    assert pq.read_table(again).to_pylist() == rows


def test_generate_bad_input(tiny_model_dir, arith_file, tmp_path, capsys):
    base = ["generate", "--model", str(tiny_model_dir)]
    missing = tmp_path / "missing.parquet"
    assert cli.main([*base, "--data", str(missing), "-o", str(tmp_path / "o.parquet")]) == 2
    assert f"--data {str(missing)!r}: no such file" in capsys.readouterr().err
    assert cli.main([*base, "--data", str(arith_file), "-o", str(tmp_path / "o.csv")]) == 2
    assert "must end with .parquet or .jsonl" in capsys.readouterr().err
    assert cli.main([*base, "--data", str(arith_file), "--n", "0", "-o", "o.parquet"]) == 2
    assert "--n 0: must be >= 1" in capsys.readouterr().err
    assert (
        cli.main([*base, "--data", str(arith_file), "-o", "o.parquet", "data.max_prompt_lenth=9"])
        == 2
    )
    assert "did you mean data.max_prompt_length" in capsys.readouterr().err


def test_eval_of_a_model_equals_eval_of_its_generations(
    tiny_model_dir, arith_file, tmp_path, capsys
):
    sampling = ["--n", "4", "--max-new-tokens", "4", "--seed", "3", "--batch-size", "8"]
    gens = tmp_path / "gens.parquet"
    data = ["--model", str(tiny_model_dir), "--data", str(arith_file)]
    assert cli.main(["generate", *data, *sampling, "-o", str(gens)]) == 0
    capsys.readouterr()
    from_model, from_file = tmp_path / "model.json", tmp_path / "file.json"
    assert cli.main(["eval", *data, *sampling, "--json", str(from_model)]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == [
        "data_source",
        "prompts",
        "n",
        "acc/mean@4",
        "score/mean@4",
        "pass@1",
        "pass@2",
        "pass@4",
    ]
    assert table.splitlines()[1].split()[:3] == ["arithmetic", "5", "4"]
    assert cli.main(["eval", "--generations", str(gens), "--json", str(from_file)]) == 0
    report = json.loads(from_model.read_text())
    assert report == json.loads(from_file.read_text())
    rows = pq.read_table(gens).to_pylist()
    accs = [a for row in rows for a in row["accs"]]
    assert report["overall"]["acc/mean@4"] == pytest.approx(sum(accs) / len(accs))
    assert set(report["by_source"]) == {"arithmetic"}


def test_eval_scores_a_generations_file_without_scores(tmp_path, capsys):
    path = tmp_path / "gens.jsonl"
    rows = [
        {"data_source": "arithmetic", "ground_truth": "7", "responses": ["7", "It is 7", "8"]},
        {"data_source": "arithmetic", "ground_truth": "4", "responses": ["5", "6", "3"]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "m.json"
    assert cli.main(["eval", "--generations", str(path), "--k", "1", "3", "--json", str(out)]) == 0
    overall = json.loads(out.read_text())["overall"]
    assert overall["acc/mean@3"] == pytest.approx(2 / 6)
    assert overall["pass@1"] == pytest.approx((2 / 3 + 0) / 2)
    assert overall["pass@3"] == pytest.approx(0.5)
    assert not math.isnan(overall["score/mean@3"])


def test_eval_bad_input(arith_file, tmp_path, capsys):
    assert cli.main(["eval"]) == 2
    assert "either --data (with --model) or --generations" in capsys.readouterr().err
    assert cli.main(["eval", "--generations", str(tmp_path / "none.parquet")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"data_source": "arithmetic", "answer": "x"}) + "\n")
    assert cli.main(["eval", "--generations", str(bad)]) == 2
    assert "missing column(s) ['responses']" in capsys.readouterr().err
    ok = tmp_path / "ok.jsonl"
    ok.write_text(
        json.dumps({"data_source": "a", "responses": ["1"], "scores": [1.0], "accs": [1.0]}) + "\n"
    )
    assert cli.main(["eval", "--generations", str(ok), "--k", "2"]) == 2
    assert "k=2: pass@k needs 1 <= k <= n, and n=1" in capsys.readouterr().err


def test_eval_does_not_warn_about_training(tmp_path, caplog):
    """Evaluation learns nothing by design: grpo with n=1 is no reason for a warning."""
    path = tmp_path / "gens.jsonl"
    path.write_text(
        json.dumps({"data_source": "arithmetic", "ground_truth": "7", "responses": ["7"]}) + "\n"
    )
    with caplog.at_level(logging.INFO):
        assert cli.main(["eval", "--generations", str(path), "algorithm.adv_estimator=grpo"]) == 0
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [m for m in messages if "nothing is learned" in m], messages
    # the same config loaded for training does warn
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        load_config(None, ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1"])
    assert any("nothing is learned" in r.getMessage() for r in caplog.records)


def _fake_run(tmp_path, max_response_length: int, max_prompt_length: int):
    """A run directory as the trainer leaves it: a complete checkpoint holding the resolved
    config, and the final model in ``huggingface/`` beside it."""
    from verl.trainer.lifecycle.checkpoint import CheckpointManager

    cfg = load_config(
        None,
        [
            f"data.max_response_length={max_response_length}",
            f"data.max_prompt_length={max_prompt_length}",
        ],
    )
    root = tmp_path / "run"
    CheckpointManager(root, 1).save(
        3, lambda tmp: (tmp / "config.yaml").write_text(to_yaml(cfg)) and {"roles": {}}
    )
    (root / "huggingface").mkdir()
    return root


def test_eval_takes_the_lengths_of_the_run_that_trained_the_model(tmp_path):
    root = _fake_run(tmp_path, 7, 50)
    assert run_config_file(str(root / "huggingface")) == root / "global_step_3" / "config.yaml"
    args = build_parser().parse_args(["--model", str(root / "huggingface"), "--data", "x"])
    cfg = load_rollout_config(args, build_parser())
    assert (cfg.data.max_response_length, cfg.data.max_prompt_length) == (7, 50)
    # --max-new-tokens, key=value and --config win over the run's lengths
    args = build_parser().parse_args(
        [
            "--model",
            str(root / "huggingface"),
            "--data",
            "x",
            "--max-new-tokens",
            "5",
            "data.max_prompt_length=40",
        ]
    )
    cfg = load_rollout_config(args, build_parser())
    assert (cfg.data.max_response_length, cfg.data.max_prompt_length) == (5, 40)
    user = tmp_path / "user.yaml"
    user.write_text("data:\n  max_response_length: 9\n")
    args = build_parser().parse_args(
        ["--model", str(root / "huggingface"), "--data", "x", "--config", str(user)]
    )
    assert load_rollout_config(args, build_parser()).data.max_response_length == 9
    # a model no run wrote: the schema's default
    plain = tmp_path / "plain"
    plain.mkdir()
    assert run_config_file(str(plain)) is None
    args = build_parser().parse_args(["--model", str(plain), "--data", "x"])
    assert load_rollout_config(args, build_parser()).data.max_response_length == 64


def test_upstream_main_generation_command_line(tiny_model_dir, arith_file, tmp_path, capsys):
    """``python -m verl.trainer.main_generation`` with upstream's keys: the rows of
    ``verl generate``, with upstream's ``responses`` column of n_samples texts."""
    from verl.trainer import main_generation

    out = tmp_path / "gens.parquet"
    argv = [
        f"model.path={tiny_model_dir}",
        f"data.path={arith_file}",
        "data.prompt_key=prompt",
        "data.n_samples=2",
        f"data.output_path={out}",
        "data.batch_size=4",
        "rollout.temperature=1.0",
        "rollout.top_k=-1",
        "rollout.top_p=1.0",
        "rollout.response_length=5",
        "rollout.tensor_model_parallel_size=1",
        "trainer.n_gpus_per_node=1",
    ]
    assert main_generation.main(argv) == 0, capsys.readouterr().err
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == 5 and all(len(row["responses"]) == 2 for row in rows)
    assert all(1 <= n <= 5 for row in rows for n in row["response_lengths"])
    # upstream's output keeps the input's columns (its evaluation reads reward_model)
    inputs = pq.read_table(arith_file).to_pylist() if str(arith_file).endswith("parquet") else None
    assert all(row["reward_model"]["ground_truth"] == row["ground_truth"] for row in rows)
    if inputs is not None and "ability" in inputs[0]:
        assert [row["ability"] for row in rows] == [r["ability"] for r in inputs]
    assert main_generation.main([*argv, "rollout.gpu_layers=3"]) == 2
    assert "rollout.gpu_layers: not an upstream main_generation key" in capsys.readouterr().err
    assert main_generation.main(argv[:1]) == 2
    assert "data.path is required" in capsys.readouterr().err


def test_upstream_main_eval_command_line(tmp_path, capsys):
    """``python -m verl.trainer.main_eval`` on upstream's layout (ground truth inside
    reward_model, its own response column name): verl eval's table and upstream's
    test_score lines, computed by the arithmetic scorer."""
    from verl.trainer import main_eval

    rows = [
        {
            "source": "arithmetic",
            "outs": ["Answer: 5", "Answer: 4"],
            "reward_model": {"ground_truth": "5"},
        },
        {
            "source": "arithmetic",
            "outs": ["Answer: 9", "Answer: 9"],
            "reward_model": {"ground_truth": "9"},
        },
    ]
    path = tmp_path / "gens.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    argv = [f"data.path={path}", "data.response_key=outs", "data.data_source_key=source"]
    assert main_eval.main(argv) == 0
    out = capsys.readouterr().out
    want = [
        default_compute_score("arithmetic", r, row["reward_model"]["ground_truth"])
        for row in rows
        for r in row["outs"]
    ]
    want = [w["score"] if isinstance(w, dict) else w for w in want]
    assert f"test_score/arithmetic: {sum(want) / len(want):.4f}" in out
    assert "overall" in out
    assert main_eval.main([f"data.path={path}"]) == 2
    assert "missing column(s) ['data_source', 'responses']" in capsys.readouterr().err
    assert main_eval.main([*argv, "data.batch_size=4"]) == 2
    assert "data.batch_size: not an upstream main_eval key" in capsys.readouterr().err
