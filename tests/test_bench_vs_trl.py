"""bench/bench_vs_trl.py without TRL and without training: arguments, workloads, the run
plan, the verl command line, record parsing, medians, ratios and the table, on fake timing
records. Also the process-tree memory sampler of bench/_common.py on a real child tree."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from verl.config import load_config

BENCH = Path(__file__).resolve().parents[1] / "bench"
MiB = 1024 * 1024


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    # the bench scripts import their helpers as `from _common import ...`
    sys.path.insert(0, str(BENCH))
    try:
        yield _load("bench_vs_trl")
    finally:
        sys.path.remove(str(BENCH))


def test_arguments_defaults_quick_and_bad_steps(bench):
    args = bench.parse_args([])
    assert args.workloads == ["W1", "W2", "W3"]
    assert args.settings == ["identical", "recommended", "defaults"]
    assert args.steps == 5
    quick = bench.parse_args(["--quick"])
    assert quick.workloads == ["W1"] and quick.steps == 2
    assert bench.parse_args(["--quick", "--steps", "3"]).steps == 3
    assert bench.parse_args(["--workloads", "W2", "W3", "--settings", "identical"]).workloads == [
        "W2",
        "W3",
    ]
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "0"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--workloads", "W9"])


def test_extra_verl_overrides_are_collected_and_checked(bench):
    assert bench.parse_args([]).verl_override == []
    args = bench.parse_args(
        ["--verl-override", "trainer.mixed_precision=auto", "--verl-override", "a.b=1"]
    )
    assert args.verl_override == ["trainer.mixed_precision=auto", "a.b=1"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--verl-override", "trainer.mixed_precision"])


def test_workloads_match_the_issue(bench):
    w = bench.WORKLOADS
    assert (w["W1"].prompts, w["W1"].n, w["W1"].max_new_tokens, w["W1"].samples) == (16, 4, 16, 64)
    assert (w["W2"].prompts, w["W2"].n, w["W2"].max_new_tokens, w["W2"].samples) == (32, 8, 32, 256)
    assert (w["W3"].prompts, w["W3"].n, w["W3"].max_new_tokens, w["W3"].samples) == (8, 4, 48, 32)
    assert w["W1"].model == w["W2"].model == "tiny" and w["W3"].model == "smollm2"
    assert (
        dict(
            hidden_size=256,
            num_layers=4,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=1024,
            tie_word_embeddings=True,
            seed=0,
        )
        == bench.TINY_MODEL_KWARGS
    )


def test_run_plan_alternates_which_side_goes_first(bench):
    plan = bench.run_plan(["W1", "W2"], ["identical", "recommended"])
    assert [(w, s) for w, s, _ in plan] == [
        ("W1", "identical"),
        ("W1", "recommended"),
        ("W2", "identical"),
        ("W2", "recommended"),
    ]
    assert [o for _, _, o in plan] == [
        ("verl", "trl"),
        ("trl", "verl"),
        ("verl", "trl"),
        ("trl", "verl"),
    ]


def test_addition_rows_and_the_shared_reward(bench, tmp_path):
    rows = bench.addition_rows(50, seed=3)
    assert rows == bench.addition_rows(50, seed=3)
    for row in rows:
        a, b = row["prompt"][0]["content"].removesuffix("=").split("+")
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
        assert row["reward_model"]["ground_truth"] == str(int(a) + int(b))
        assert row["prompt"][0]["role"] == "user"
    path = bench.write_jsonl(rows, tmp_path / "p.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows
    reward = _load("_addition_reward")
    assert reward.exact_match(" 57<|im_end|>", "57") == 1.0
    assert reward.exact_match("57\n", "57") == 1.0
    assert reward.exact_match("The answer is 57", "57") == 0.0
    assert reward.exact_match("570", "57") == 0.0
    assert reward.compute_score("addition", "57", "57") == 1.0


@pytest.mark.parametrize("setting", ["identical", "recommended"])
def test_verl_overrides_load_as_a_valid_config(bench, tmp_path, setting):
    w = bench.WORKLOADS["W2"]
    data = bench.write_jsonl(bench.addition_rows(4), tmp_path / "p.jsonl")
    model = tmp_path / "model"  # validation checks that the directory exists
    model.mkdir()
    overrides = bench.verl_overrides(w, setting, data, str(model), tmp_path / "out", 6)
    cfg = load_config(overrides=overrides)
    actor = cfg.actor_rollout_ref.actor
    assert cfg.data.train_batch_size == 32 and cfg.actor_rollout_ref.rollout.n == 8
    assert cfg.data.max_response_length == 32
    assert actor.ppo_mini_batch_size == 32 and actor.ppo_micro_batch_size_per_device == 256
    assert actor.ppo_epochs == 1 and not actor.use_kl_loss
    assert cfg.trainer.total_training_steps == 6
    assert cfg.custom_reward_function.path == str(bench.REWARD_FILE)
    recommended = setting == "recommended"
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing is recommended
    assert cfg.trainer.mixed_precision == ("bf16" if recommended else "fp32")


def test_the_defaults_setting_sets_only_the_workloads_keys(bench, tmp_path):
    w = bench.WORKLOADS["W2"]
    data = bench.write_jsonl(bench.addition_rows(4), tmp_path / "p.jsonl")
    model = tmp_path / "model"
    model.mkdir()
    overrides = bench.verl_overrides(w, "defaults", data, str(model), tmp_path / "out", 6)
    keys = {o.split("=", 1)[0] for o in overrides}
    assert not any("micro_batch" in k or "precision" in k or "checkpointing" in k for k in keys)
    cfg, default = load_config(overrides=overrides), load_config()
    actor, default_actor = cfg.actor_rollout_ref.actor, default.actor_rollout_ref.actor
    assert cfg.data.train_batch_size == 32 and cfg.actor_rollout_ref.rollout.n == 8
    assert actor.ppo_mini_batch_size == 32 and not actor.use_kl_loss  # one step per batch
    # everything else is the library's default: the token budget, precision and
    # checkpointing auto
    assert actor.uses_token_budget and actor.token_budget == default_actor.token_budget
    assert cfg.trainer.mixed_precision == default.trainer.mixed_precision
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing is None  # auto
    assert actor.optim.weight_decay == default_actor.optim.weight_decay
    assert actor.loss_agg_mode is None and actor.logprob_chunk_size == 512


def test_trl_side_accepts_every_setting(bench):
    text = bench.TRL_SIDE.read_text()
    for setting in bench.SETTINGS:
        assert f'"{setting}"' in text


def _fake_verl_metrics(step_times: list[float], mean_len: float) -> list[dict]:
    return [
        {
            "step": i + 1,
            "timing_s/step": t,
            "timing_s/gen": 0.5 * t,
            "timing_s/old_log_prob": 0.1 * t,
            "timing_s/update_actor": 0.3 * t,
            "response_length/mean": mean_len,
            "critic/score/mean": 0.0,
        }
        for i, t in enumerate(step_times)
    ]


def test_summaries_ratios_and_table_on_fake_records(bench):
    samples = 64
    verl_steps = bench.verl_steps_from_metrics(
        [{"step": 0, "val/acc": 0.5}, *_fake_verl_metrics([9.0, 1.0, 2.0, 1.5, 100.0, 1.2], 16.0)],
        samples,
    )
    assert len(verl_steps) == 6  # the validation-only line is skipped
    trl_result = {
        "steps": [
            {"step_s": t, "mean_completion_len": 8.0, "reward": 0.0}
            for t in (5.0, 3.0, 2.0, 4.0, 4.0, 6.0)
        ]
    }
    trl_steps = bench.trl_steps_from_result(trl_result, samples)
    peaks_v = bench.TreePeaks(tree=500 * MiB, rss_sum=900 * MiB, root_rss=480 * MiB)
    peaks_t = bench.TreePeaks(tree=1000 * MiB, rss_sum=1000 * MiB, root_rss=1000 * MiB)
    verl = bench.side_summary(verl_steps, samples, peaks_v)
    trl = bench.side_summary(trl_steps, samples, peaks_t)

    # median of the steps after the warm-up: verl [1, 2, 1.5, 100, 1.2] -> 1.5
    assert verl["step_s"] == 1.5 and verl["warmup_step_s"] == 9.0
    assert verl["samples_per_s"] == round(64 / 1.5, 2)
    # tokens/s per step is 16 * 64 / t; the median over [1, 2, 1.5, 100, 1.2] is at t=1.5
    assert verl["gen_tokens_per_s"] == round(16 * 64 / 1.5, 1)
    assert verl["stages_s"] == {
        "gen": 0.75,
        "old_log_prob": 0.15,
        "update_actor": 0.45,
        "other": 0.15,
    }
    assert (verl["peak_rss_mib"], verl["peak_rss_sum_mib"], verl["peak_root_rss_mib"]) == (
        500,
        900,
        480,
    )
    # TRL: [3, 2, 4, 4, 6] -> 4; no stages
    assert trl["step_s"] == 4.0 and "stages_s" not in trl
    assert trl["gen_tokens_per_s"] == round(8 * 64 / 4.0, 1)

    q = bench.ratios(verl, trl)
    assert q["samples_per_s"] == round((64 / 1.5) / (64 / 4.0), 3)
    assert q["step_s"] == round(1.5 / 4.0, 3)
    assert q["peak_rss"] == 0.5
    assert q["gen_tokens_per_s"] == pytest.approx((16 * 64 / 1.5) / (8 * 64 / 4.0), abs=1e-3)

    table = bench.format_table(
        [{"workload": "W1", "setting": "identical", "verl": verl, "trl": trl, "ratios": q}]
    )
    lines = table.splitlines()
    row = next(line for line in lines if line.startswith("W1") and "x" in line)
    assert row.split("|")[1].split() == ["1.50", "4.00"]
    assert row.split("|")[4].split() == ["500", "1000"]
    assert row.split("|")[5].split() == ["2.67x", "5.33x", "0.50x"]
    markdown = bench.format_markdown(
        [{"workload": "W1", "setting": "identical", "verl": verl, "trl": trl, "ratios": q}]
    ).splitlines()
    assert len(markdown) == 3
    cells = [c.strip() for c in markdown[2].strip("|").split("|")]
    assert cells == [
        "W1",
        "identical",
        "1.50 s",
        "4.00 s",
        "2.67x",
        "5.33x",
        "500",
        "1000",
        "0.50x",
        "0.75 / 0.15 / 0.45 s",
    ]
    stage_row = lines[-1]
    assert "gen=0.75" in stage_row and "update_actor=0.45" in stage_row
    assert "other=0.15" in stage_row


def test_side_summary_needs_a_measured_step(bench):
    with pytest.raises(ValueError, match="at least one measured step"):
        bench.side_summary([{"step_s": 1.0, "gen_tokens": 1.0}], 4, bench.TreePeaks())


_TREE_SCRIPT = """
import os, sys, time
block = bytearray(64 * 1024 * 1024)  # touched: 64 MiB in the parent
for i in range(0, len(block), 4096):
    block[i] = 1
pid = os.fork()
if pid == 0:  # the child shares the parent's 64 MiB copy-on-write and adds 32 of its own
    own = bytearray(32 * 1024 * 1024)
    for i in range(0, len(own), 4096):
        own[i] = 1
    time.sleep(1.5)
    os._exit(0)
os.waitpid(pid, 0)
"""


def test_tree_peaks_count_a_forked_child_once(tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        common = _load("_common")
    finally:
        sys.path.remove(str(BENCH))
    code, peaks, wall = common.run_tree_measured(
        [sys.executable, "-c", _TREE_SCRIPT],
        env={},
        log_path=tmp_path / "log",
        interval_s=0.02,
        descendants_interval_s=0.1,
    )
    assert code == 0 and wall > 1.0
    # the root holds its 64 MiB block; the child adds only its 32 MiB (plus small private
    # pages), whereas the plain RSS sum counts the shared 64 MiB twice
    assert peaks.root_rss > 64 * MiB
    assert peaks.root_rss + 28 * MiB < peaks.tree < peaks.root_rss + 60 * MiB
    assert peaks.rss_sum > peaks.tree + 50 * MiB


def test_from_json_prints_the_tables_of_a_saved_run(bench, tmp_path, capsys):
    verl = bench.side_summary(
        bench.verl_steps_from_metrics(_fake_verl_metrics([3.0, 2.0, 2.0], 10.0), 32),
        32,
        bench.TreePeaks(tree=700 * MiB),
    )
    trl = bench.side_summary(
        bench.trl_steps_from_result(
            {"steps": [{"step_s": 4.0, "mean_completion_len": 10.0}] * 3}, 32
        ),
        32,
        bench.TreePeaks(tree=1400 * MiB),
    )
    record = {"workload": "W3", "setting": "recommended", "verl": verl, "trl": trl}
    record["ratios"] = bench.ratios(verl, trl)
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps({"results": [record]}))
    bench.main(["--from-json", str(saved), "--markdown"])
    out = capsys.readouterr().out
    assert "| W3 | recommended | 2.00 s | 4.00 s | 2.00x | 2.00x | 700 | 1400 | 0.50x |" in out
    assert "W3       recommended |   2.00   4.00 |" in out


def test_a_failed_side_is_reported_and_the_other_kept(bench):
    verl = bench.side_summary(
        bench.verl_steps_from_metrics(_fake_verl_metrics([3.0, 2.0], 10.0), 32),
        32,
        bench.TreePeaks(tree=700 * MiB),
    )
    failed = {"error": "TRL W3 identical failed (-9); log: x/run.log"}
    record = {"workload": "W3", "setting": "identical", "verl": verl, "trl": failed}
    table = bench.format_table([record])
    assert "W3       identical   | verl: ok; trl: TRL W3 identical failed (-9)" in table
    assert "gen=1.00" in table  # verl's stages still listed
    row = bench.format_markdown([record]).splitlines()[2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 10 and cells[:2] == ["W3", "identical"]
    assert cells[2].startswith("verl: ok; trl: TRL W3 identical failed (-9)")
