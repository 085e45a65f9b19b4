"""bench/bench_main_async.py cheaply: its configurations' overrides against the preset's
schema, the rotation of the run order, and the summary's interpolation and verdicts on
made-up curves. Slow tests: two configurations measured in this process on the tiny W2
model (2 steps, 8 held-out problems, 8 tokens: two training runs) with the clock, samples
and rollout idle time checked against what the run recorded and the table and the PNG built
from those records; and the whole command (three configurations, each in its own process)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from verl.config import load_config

BENCH = Path(__file__).resolve().parents[1] / "bench"
PRESET = BENCH.parent / "examples" / "grpo_smollm2_arithmetic.yaml"
TINY = ["--model", "w2", "--steps", "2", "--val-every", "1", "--val-size", "8"]
TINY += ["--response-length", "8", "--sync-threads", "1"]


@pytest.fixture(scope="module")
def bench():
    # the bench scripts import their helpers as `from _common import ...`
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(
            "bench_main_async", BENCH / "bench_main_async.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


# --------------------------------------------------------------------------- configurations


def test_defaults_and_each_configs_overrides_load_on_the_preset(bench, tmp_path):
    args = bench.parse_args([])
    assert (args.steps, args.val_every, args.repeats) == (24, 6, 2)
    assert args.config_list == ["sync", "one_step_off", "streaming"]
    assert args.preset == PRESET and args.model == "preset"
    cfgs = {
        name: load_config(str(PRESET), bench.config_overrides(args, name, str(tmp_path)))
        for name in bench.CONFIGS
    }
    sync, off, stream = cfgs["sync"], cfgs["one_step_off"], cfgs["streaming"]
    assert sync.trainer.num_threads == 2 and sync.trainer.rollout_num_threads is None
    assert not sync.trainer.async_rollout and sync.algorithm.filter_groups.enable
    for cfg in (off, stream):
        assert cfg.trainer.async_rollout
        assert (cfg.trainer.num_threads, cfg.trainer.rollout_num_threads) == (1, 1)
    assert off.trainer.rollout_mode == "one_step_off" and not off.algorithm.filter_groups.enable
    assert stream.trainer.rollout_mode == "streaming" and stream.algorithm.filter_groups.enable
    assert not cfgs["sync_nofilter"].algorithm.filter_groups.enable
    for cfg in cfgs.values():  # the preset's task, validated every 6 steps from step 0
        assert (cfg.trainer.total_training_steps, cfg.trainer.test_freq) == (24, 6)
        assert cfg.trainer.val_before_train and cfg.data.arithmetic.val_size == 192
        assert cfg.data.max_response_length == 16 and cfg.actor_rollout_ref.rollout.n == 8
    small = bench.parse_args([*TINY, "--override", "trainer.seed=7"])
    small.model_dir = "/m"
    cfg_keys = bench.config_overrides(small, "streaming", str(tmp_path))
    assert "actor_rollout_ref.model.path=/m" in cfg_keys
    assert cfg_keys[-1] == "trainer.seed=7"
    assert "algorithm.filter_groups.enable=false" in cfg_keys  # w2 scores ~0: never fills
    with pytest.raises(SystemExit):
        bench.parse_args(["--configs", "one_step_off,streaming"])  # no sync
    with pytest.raises(SystemExit):
        bench.parse_args(["--configs", "sync,bogus"])


def test_run_plan_rotates_the_order_each_repeat(bench):
    plan = bench.run_plan(["sync", "one_step_off", "streaming"], 3)
    assert [name for _, name in plan] == [
        "sync", "one_step_off", "streaming",
        "one_step_off", "streaming", "sync",
        "streaming", "sync", "one_step_off",
    ]  # fmt: skip
    assert [r for r, _ in plan] == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_validation_holds_the_rollout_thread_and_its_generation_is_not_counted(bench, monkeypatch):
    import threading
    import time

    from verl.rollout.native import NativeRollout

    forwards: list[str] = []
    monkeypatch.setattr(NativeRollout, "_forward", lambda self, tag: forwards.append(tag) or tag)
    monkeypatch.setattr(NativeRollout, "generate", lambda self, prompts, params: prompts)
    gate, calls, blocked = threading.Event(), [], []
    gate.set()
    with bench._instrumented(gate, calls, blocked):
        gate.clear()  # a validation runs
        rollout = threading.Thread(target=lambda: NativeRollout._forward(None, "rollout"))
        rollout.start()
        time.sleep(0.3)
        assert NativeRollout._forward(None, "validation") == "validation"  # main: not held
        assert forwards == ["validation"]  # the rollout thread's pass waits
        NativeRollout.generate(None, [1, 2, 3], None)  # the validation's generation
        gate.set()
        rollout.join(5)
        NativeRollout.generate(None, [1, 2], None)  # training's
    assert forwards == ["validation", "rollout"]
    assert len(blocked) == 1 and blocked[0] >= 0.25
    assert [(c["rows"], c["val"]) for c in calls] == [(3, True), (2, False)]
    assert all(c["end"] >= c["start"] for c in calls)
    assert NativeRollout._forward(None, "after") == "after"  # restored: not gated
    assert len(blocked) == 1


# --------------------------------------------------------------------------- measured runs


@pytest.fixture(scope="module")
def measured(bench, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("main_async")
    args = bench.parse_args(TINY)
    args.model_dir = bench.w2_model_dir(tmp)
    runs = []
    for name in ("sync", "streaming"):
        run = bench.measure(args, name, str(tmp / name))
        run["repeat"] = 0
        runs.append(run)
    return runs


@pytest.mark.slow
def test_measured_runs_clock_samples_and_idle_time(measured):
    runs = measured
    for run in runs:
        steps, vals = run["steps"], run["validations"]
        assert [s["step"] for s in steps] == [1, 2]
        assert [v["step"] for v in vals] == [0, 1, 2]
        assert vals[0]["train_s"] == 0.0  # before training: the clock has not started
        # a validation is taken at its step's end on the training clock, validation excluded
        for v, s in zip(vals[1:], steps, strict=True):
            assert s["end_s"] <= v["train_s"] < s["end_s"] + 0.05
        assert 0 < steps[0]["end_s"] < steps[1]["end_s"] == run["train_s"]
        assert all(v["val_s"] > 0 for v in vals) and run["val_size"] == 8
        assert all(v["acc"] == 0.0 for v in vals)  # random init
        # 8 prompts x 8 samples per step, the preset's shape
        assert run["trained_samples"] == 2 * 8 * 8
        assert run["samples_per_s"] == pytest.approx(128 / run["train_s"])
        assert run["wall_per_step_s"] == pytest.approx(run["train_s"] / 2)
        assert 0 < run["rollout_busy_s"] <= run["train_s"] + 1e-6
        assert run["rollout_idle_fraction"] == pytest.approx(
            1 - run["rollout_busy_s"] / run["train_s"]
        )
    sync, stream = runs
    # sync generates each step's one batch (validation's generation is not counted)
    assert sync["generated_samples"] == 128 and sync["rollout_held_s"] == 0.0
    assert "trainer.num_threads=1" in sync["overrides"]
    assert stream["generated_samples"] >= 128 and stream["rollout_held_s"] >= 0.0
    assert "trainer.rollout_num_threads=1" in stream["overrides"]


@pytest.mark.slow
def test_report_and_plot_carry_the_measured_numbers(bench, measured, tmp_path):
    runs = measured
    summary = bench.summarize(runs, 2)
    record = {
        "command": "bench",
        "args": {"repeats": 1},
        "nproc": 2,
        "cpu": "cpu",
        "load": [[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]],
        "threads": {"sync": 1, "trainer": 1, "rollout": 1},
        "runs": runs,
        "summary": summary,
    }
    sync, stream = summary["configs"]["sync"], summary["configs"]["streaming"]
    assert sync["wall_per_step_s"] == runs[0]["wall_per_step_s"]
    assert stream["vs_sync"]["samples_per_s"] == pytest.approx(
        runs[1]["samples_per_s"] / runs[0]["samples_per_s"]
    )
    shortest = min(r["train_s"] for r in runs) / 60
    assert summary["marks_min"][-1] == pytest.approx(shortest, abs=1e-4)
    assert summary["marks_min"][-1] <= shortest
    text = bench.format_report(record)
    row = next(line for line in text.splitlines() if line.startswith("streaming "))
    cells = row.split()
    assert cells[2] == f"{runs[1]['wall_per_step_s']:.2f}"
    assert cells[3] == f"{stream['vs_sync']['wall_per_step_s']:.2f}"
    assert cells[4] == f"{runs[1]['samples_per_s']:.2f}"
    assert cells[7] == f"{100 * runs[1]['rollout_idle_fraction']:.0f}"
    assert f"samples/s vs sync: streaming {stream['vs_sync']['samples_per_s']:.2f}x" in text
    steps_row = next(line for line in text.splitlines() if line.startswith("sync ") and "(" in line)
    assert f"0.0 ({runs[0]['validations'][2]['train_s'] / 60:.2f})" in steps_row
    png = bench.plot(record, tmp_path / "out" / "acc.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert json.loads(json.dumps(record))["summary"] == json.loads(json.dumps(summary))


# --------------------------------------------------------------------------- the summary


def _run(config: str, accs: list[float], times_s: list[float], repeat: int = 0) -> dict:
    return {
        "config": config,
        "repeat": repeat,
        "val_size": 100,
        "setup_s": 5.0,
        "train_s": times_s[-1],
        "wall_per_step_s": times_s[-1] / 4,
        "samples_per_s": 256 / times_s[-1],
        "gen_samples_per_s": 300 / times_s[-1],
        "rollout_idle_fraction": 0.25,
        "validations": [
            {"step": 2 * i, "train_s": t, "acc": a / 100, "val_s": 3.0}
            for i, (a, t) in enumerate(zip(accs, [0.0, *times_s], strict=True))
        ],
    }


def test_summary_interpolates_gains_marks_and_judges_against_syncs_standard_error(bench):
    runs = [
        _run("sync", [30.0, 40.0, 50.0], [60.0, 120.0]),
        _run("streaming", [30.0, 45.0, 55.0], [30.0, 90.0]),
        _run("one_step_off", [30.0, 32.0, 36.0], [60.0, 120.0]),
    ]
    summary = bench.summarize(runs, 3)
    assert summary["marks_min"] == [0.5, 1.0, 1.5]  # up to the shortest run (90 s)
    sync, stream, off = (summary["configs"][k] for k in ("sync", "streaming", "one_step_off"))
    assert sync["min_to_plus10"] == pytest.approx(1.0)
    assert sync["min_to_plus20"] == pytest.approx(2.0)
    assert stream["min_to_plus10"] == pytest.approx(0.5 * 10 / 15)
    assert stream["min_to_plus20"] == pytest.approx(0.5 + 1.0 * 5 / 10)
    assert off["min_to_plus10"] is None
    assert sync["acc_at_mark"]["1.5"] == pytest.approx(45.0)
    assert stream["acc_at_mark"]["1.0"] == pytest.approx(50.0)
    assert stream["vs_sync"]["samples_per_s"] == pytest.approx(120 / 90)
    se = 100 * math.sqrt(0.4 * 0.6 / 100)  # sync at 1 min: 40% of 100 problems
    cmp = off["vs_sync_at_mark"]["1.0"]
    assert cmp["se_pct"] == pytest.approx(se) and cmp["diff_pct"] == pytest.approx(-8.0)
    assert not cmp["not_lower"] and stream["vs_sync_at_mark"]["1.0"]["not_lower"]
    # within one standard error below sync: not lower
    close = bench.summarize([runs[0], _run("streaming", [30.0, 36.0, 46.0], [60.0, 120.0])], 2)
    assert close["configs"]["streaming"]["vs_sync_at_mark"]["1.0"]["not_lower"]
    record = {
        "command": "c",
        "args": {"repeats": 1},
        "nproc": 2,
        "cpu": "cpu",
        "load": [[0, 0, 0], [0, 0, 0]],
        "threads": {"sync": 2, "trainer": 1, "rollout": 1},
        "runs": runs,
        "summary": summary,
    }
    text = bench.format_report(record)
    assert "32.0 (-8.0 LOWER)" in text and "50.0 (+10.0 ok)" in text
    row = next(line for line in text.splitlines() if line.startswith("streaming "))
    assert row.split()[8:10] == [f"{0.5 * 10 / 15:.2f}", "1.00"]


def test_median_over_repeats_needs_half_of_them(bench):
    assert bench._median([1.0, 3.0, None]) == 2.0
    assert bench._median([1.0, None, None]) is None
    assert bench._median([None, 2.0]) == 2.0


# --------------------------------------------------------------------------- the command


@pytest.mark.slow
def test_the_command_runs_three_configurations_and_saves_json_table_and_png(tmp_path):
    out, png = tmp_path / "run.json", tmp_path / "acc.png"
    cmd = [sys.executable, str(BENCH / "bench_main_async.py"), *TINY, "--repeats", "1"]
    cmd += ["--plot", str(png), "--json-out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == record
    assert [r["config"] for r in record["runs"]] == ["sync", "one_step_off", "streaming"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for run in record["runs"]:
        assert run["trained_samples"] == 128 and len(run["validations"]) == 3
        row = next(
            line for line in proc.stdout.splitlines() if line.startswith(run["config"] + " ")
        )
        assert row.split()[2] == f"{run['wall_per_step_s']:.2f}"
    assert f"plot: {png}" in proc.stdout and "load average" in proc.stdout
    again = subprocess.run(
        [sys.executable, str(BENCH / "bench_main_async.py"), "--from-json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and again.stdout.strip() == bench_report_of(proc.stdout)


def bench_report_of(stdout: str) -> str:
    """The report part of the command's output (before the plot line and the JSON)."""
    return stdout.split("\nplot: ")[0].strip()
