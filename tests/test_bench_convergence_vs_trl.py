"""bench/bench_convergence_vs_trl.py without TRL and without training: arguments and marks,
the alternation plan, the task read from the presets, the time-to-threshold interpolation,
the table and the plot on fake runs; the training clock of bench/_budget_clock.py on a fake
time source; verl's arithmetic scorer loaded by path (TRL's side) against verl's own."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from verl.config import load_config

BENCH = Path(__file__).resolve().parents[1] / "bench"
EXAMPLES = BENCH.parent / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    # the bench scripts import their helpers as `from _common import ...`
    sys.path.insert(0, str(BENCH))
    try:
        yield _load("bench_convergence_vs_trl")
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def clock_module():
    return _load("_budget_clock")


# --------------------------------------------------------------------------- arguments


def test_defaults_are_the_main_job_ten_minutes_ten_marks(bench):
    args = bench.parse_args([])
    assert args.config == EXAMPLES / "grpo_smollm2_arithmetic.yaml"
    assert args.budget_min == 10.0
    assert args.marks == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert args.repeats == 1 and args.threads is None
    assert args.verl_override == [] and args.trl_arg == []


def test_quick_is_the_quick_preset_one_minute_two_marks(bench):
    args = bench.parse_args(["--quick"])
    assert args.config == EXAMPLES / "grpo_smollm2_arithmetic_quick.yaml"
    assert args.budget_min == 1.0 and args.marks == [0.5, 1.0]
    # a budget of its own: the default marks again
    assert bench.parse_args(["--quick", "--budget-min", "2"]).marks[-1] == 2.0
    assert len(bench.parse_args(["--quick", "--budget-min", "2"]).marks) == 10


def test_marks_get_the_budget_and_bad_marks_are_refused(bench):
    assert bench.parse_args(["--budget-min", "20", "--marks", "2", "5"]).marks == [2.0, 5.0, 20.0]
    assert bench.parse_args(["--budget-min", "4", "--marks", "1", "4"]).marks == [1.0, 4.0]
    assert bench.mark_minutes(5.0, None) == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0]
    for bad in (["--marks", "3", "2"], ["--marks", "0", "2"], ["--marks", "11"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    with pytest.raises(ValueError, match="strictly ascending"):
        bench.mark_minutes(10.0, [1.0, 1.0])
    with pytest.raises(SystemExit):
        bench.parse_args(["--budget-min", "0"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--repeats", "0"])


def test_extra_keys_are_collected_and_checked(bench):
    args = bench.parse_args(["--trl-arg", "epsilon_high=0.28", "--verl-override", "a.b=1"])
    assert args.trl_arg == ["epsilon_high=0.28"] and args.verl_override == ["a.b=1"]
    for flag, bad in (("--trl-arg", "epsilon_high"), ("--verl-override", "=1")):
        with pytest.raises(SystemExit):
            bench.parse_args([flag, bad])


def test_run_plan_alternates_which_side_goes_first(bench):
    assert bench.run_plan(1) == [(0, "verl"), (0, "trl")]
    assert bench.run_plan(3) == [
        (0, "verl"),
        (0, "trl"),
        (1, "trl"),
        (1, "verl"),
        (2, "verl"),
        (2, "trl"),
    ]


# --------------------------------------------------------------------------- the task


def test_task_is_read_from_the_presets(bench):
    main = bench.task_spec(load_config(str(EXAMPLES / "grpo_smollm2_arithmetic.yaml"), []))
    assert main == {
        "prompts": 8,
        "n": 8,
        "max_new_tokens": 16,
        "temperature": 1.0,
        "lr": 2e-5,
        "seed": 42,
        "train_size": 1024,
        "val_size": 192,
    }
    quick = load_config(str(EXAMPLES / "grpo_smollm2_arithmetic_quick.yaml"), [])
    assert bench.task_spec(quick)["n"] == 4 and bench.task_spec(quick)["max_new_tokens"] == 8
    # an override of the preset moves the shared keys with it
    cfg = load_config(
        str(EXAMPLES / "grpo_smollm2_arithmetic.yaml"), ["actor_rollout_ref.actor.optim.lr=1e-5"]
    )
    assert bench.task_spec(cfg)["lr"] == 1e-5


def test_task_refuses_kl_warmup_and_other_data(bench, tmp_path):
    path = str(EXAMPLES / "grpo_smollm2_arithmetic.yaml")
    own = tmp_path / "own.jsonl"
    own.write_text(json.dumps({"prompt": [{"role": "user", "content": "1+1"}]}) + "\n")
    cases = {
        "KL term": ["actor_rollout_ref.actor.use_kl_loss=true"],
        "not constant": ["actor_rollout_ref.actor.optim.lr_warmup_steps=5"],
        "built-in arithmetic": [f"data.train_files=[{own}]"],
    }
    for message, overrides in cases.items():
        with pytest.raises(ValueError, match=message):
            bench.task_spec(load_config(path, overrides))


def test_task_data_is_the_presets_own_rows(bench, tmp_path):
    from verl.data import write_arithmetic_dataset

    cfg = load_config(str(EXAMPLES / "grpo_smollm2_arithmetic_quick.yaml"), [])
    train, val = bench.write_task_data(cfg, tmp_path / "bench")
    # what the preset's run generates for itself (verl.trainer.lifecycle.setup)
    a = cfg.data.arithmetic
    ref_train, ref_val = write_arithmetic_dataset(
        tmp_path / "ref", a.train_size, a.val_size, a.digit_range, list(a.ops), cfg.data.seed,
        fmt="jsonl",
    )  # fmt: skip
    assert train.read_text() == Path(ref_train).read_text()
    assert val.read_text() == Path(ref_val).read_text()
    assert len(val.read_text().splitlines()) == 64


def test_verl_overrides_name_the_data_model_and_no_schedule(bench, tmp_path):
    row = json.dumps({"prompt": [{"role": "user", "content": "1+1"}]}) + "\n"
    for name in ("t.jsonl", "v.jsonl"):
        (tmp_path / name).write_text(row)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    model = str(tmp_path / "m")
    data = bench.verl_data_overrides(tmp_path / "t.jsonl", tmp_path / "v.jsonl", model)
    assert f"data.train_files=[{tmp_path / 't.jsonl'}]" in data
    assert "data.shuffle=false" in data and f"actor_rollout_ref.model.path={model}" in data
    train = bench.verl_train_overrides(tmp_path / "run")
    assert "trainer.test_freq=-1" in train and "trainer.save_freq=-1" in train
    path = str(EXAMPLES / "grpo_smollm2_arithmetic.yaml")
    cfg = load_config(path, [*data, *train])  # all of them are keys of the schema
    assert cfg.trainer.total_training_steps == 1_000_000
    assert cfg.data.val_files == [str(tmp_path / "v.jsonl")]


def test_graft_copies_the_initial_models_files_but_not_its_weights(bench, tmp_path):
    base, snap = tmp_path / "base", tmp_path / "snap"
    base.mkdir()
    snap.mkdir()
    for name in ("config.json", "tokenizer.json", "chat_template.jinja", "verl_embedded.json"):
        (base / name).write_text(f"base {name}")
    (base / "model.safetensors").write_text("base weights")
    (snap / "model.safetensors").write_text("trained weights")
    (snap / "config.json").write_text("saved config")
    bench.graft_model_files(snap, base)
    assert (snap / "model.safetensors").read_text() == "trained weights"
    assert (snap / "config.json").read_text() == "base config.json"
    assert (snap / "chat_template.jinja").read_text() == "base chat_template.jinja"
    assert not (snap / "verl_embedded.json").exists()


# --------------------------------------------------------------------------- results


def test_time_to_threshold_interpolates_between_the_crossing_points(bench):
    points = [(0.0, 30.0), (1.0, 35.0), (2.0, 45.0), (3.0, 40.0), (4.0, 55.0)]
    assert bench.time_to_threshold(points, 40.0) == pytest.approx(1.5)
    assert bench.time_to_threshold(points, 45.0) == pytest.approx(2.0)  # a point on it
    # the dip at 3 min does not move the first crossing; 50 is crossed after it
    assert bench.time_to_threshold(points, 50.0) == pytest.approx(3.0 + 10.0 / 15.0)
    assert bench.time_to_threshold(points, 56.0) is None
    assert bench.time_to_threshold(points, 30.0) == 0.0
    assert bench.time_to_threshold([], 1.0) is None


def test_value_at_reads_the_curve_between_its_points(bench):
    points = [(0.0, 30.0), (1.0, 35.0), (3.0, 45.0)]
    assert bench.value_at(points, 2.0) == pytest.approx(40.0)
    assert bench.value_at(points, 1.0) == pytest.approx(35.0)
    assert bench.value_at(points, 3.0) == pytest.approx(45.0)
    assert bench.value_at(points, 3.5) is None
    assert bench.value_at([(0.0, 30.0)], 0.0) == 30.0


def _run(side: str, repeat: int, accs: list[float], times_s: list[float]) -> dict:
    return {
        "side": side,
        "repeat": repeat,
        "setup_s": 9.5,
        "steps": [{"step": i + 1} for i in range(7)],
        "snapshots": [
            {"train_s": t, "acc_pct": a, "dir": f"/s/{side}_{t}"}
            for t, a in zip(times_s, accs, strict=True)
        ],
    }


def test_summary_and_table_of_two_runs(bench):
    verl = _run("verl", 0, [40.0, 50.0, 52.0], [62.0, 125.0, 181.0])
    trl = _run("trl", 0, [33.0, 38.0, 41.0], [70.0, 130.0, 190.0])
    sv, st = bench.run_summary(verl, 30.0, 3.0), bench.run_summary(trl, 30.0, 3.0)
    assert sv["min_to_plus10"] == pytest.approx(62.0 / 60.0, abs=1e-3)
    # +20 = 50% at the second snapshot exactly
    assert sv["min_to_plus20"] == pytest.approx(125.0 / 60.0, abs=1e-3)
    assert sv["end_pct"] == 52.0 and sv["end_min"] == pytest.approx(181.0 / 60.0, abs=1e-3)
    assert st["min_to_plus10"] == pytest.approx(130 / 60 + (190 - 130) / 60 * 2 / 3, abs=1e-3)
    assert st["min_to_plus20"] is None
    # at the budget (3 min): between 125 s (50%) and 181 s (52%); TRL's 130 s and 190 s
    assert sv["budget_pct"] == pytest.approx(50.0 + 2.0 * 55.0 / 56.0, abs=0.01)
    assert st["budget_pct"] == pytest.approx(38.0 + 3.0 * 50.0 / 60.0, abs=0.01)
    table = bench.format_table([sv, st], 3.0).splitlines()
    assert "min to +10" in table[0] and "acc at 3 min %" in table[0]
    assert table[2].split() == [
        "verl", "1", "|", "30.0", "|", "1.03", "|", "2.08", "|", "52.0", "|", "52.0", "(3.02",
        "min)", "|", "7", "|", "9.5",
    ]  # fmt: skip
    assert table[3].split()[5:10] == ["2.83", "|", "-", "|", "40.5"]


def test_report_writes_the_png_and_lists_failures(bench, tmp_path):
    summary = {
        "start_pct": 30.0,
        "budget_min": 3.0,
        "runs": [
            _run("verl", 0, [40.0, 50.0], [62.0, 181.0]),
            _run("trl", 0, [35.0, 41.0], [70.0, 190.0]),
            _run("trl", 1, [36.0, 42.0], [65.0, 185.0]),
            {"side": "verl", "repeat": 1, "error": "verl failed (-9); log: /x/run.log"},
        ],
    }
    text = bench.report(summary, tmp_path / "out" / "curve.png")
    png = tmp_path / "out" / "curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert f"plot: {png}" in text
    assert "verl    2 | failed: verl failed (-9); log: /x/run.log" in text
    assert "verl    1 | min:acc% 0.00:30.0 1.03:40.0 3.02:50.0" in text
    # the JSON of a run prints again without training
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps(summary))
    assert bench.report(json.loads(saved.read_text()), tmp_path / "again.png") == text.replace(
        str(png), str(tmp_path / "again.png")
    )


# --------------------------------------------------------------------------- the clock


class FakeTime:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_clock_excludes_pauses_and_hands_out_each_mark_once(clock_module):
    now = FakeTime()
    clock = clock_module.BudgetClock(60.0, [20.0, 40.0, 60.0], now=now)
    assert clock.elapsed() == 0.0 and clock.due_marks() == []  # not started
    clock.start()
    now.t += 25.0
    assert clock.due_marks() == [20.0] and clock.due_marks() == []
    with clock.paused():
        now.t += 100.0  # a snapshot's save: no training time
    assert clock.elapsed() == pytest.approx(25.0) and clock.paused_s == pytest.approx(100.0)
    now.t += 40.0  # one long step passes two marks
    assert clock.due_marks() == [40.0, 60.0]
    assert clock.done() and clock.elapsed() == pytest.approx(65.0)


def test_clock_refuses_bad_marks_and_budgets(clock_module):
    with pytest.raises(ValueError, match="positive"):
        clock_module.BudgetClock(0.0, [])
    with pytest.raises(ValueError, match="ascending"):
        clock_module.BudgetClock(60.0, [30.0, 20.0])
    with pytest.raises(ValueError, match=r"\(0, budget_s=60.0\]"):
        clock_module.BudgetClock(60.0, [30.0, 90.0])


# --------------------------------------------------------------------------- the reward


def test_trl_sides_scorer_is_verls_arithmetic_scorer():
    from verl.rewards.scorers import arithmetic, extract

    by_path = _load("_arithmetic_scorer").load_compute_score()
    assert by_path is not arithmetic.compute_score  # executed from the file, not imported
    assert sys.modules["verl.rewards.scorers.extract"] is extract  # the stand-in is gone
    for text, truth in [
        ("42", "42"),
        (" 42<|im_end|>", "42"),
        ("The answer is 41.", "42"),
        ("7 * 6 = 42", "42"),
        ("\\boxed{1,024}", "1024"),
        ("no number", "3"),
        ("-5", "-5"),
    ]:
        assert by_path(text, truth) == arithmetic.compute_score(text, truth), text


def test_snapshots_are_evaluated_with_the_initial_models_files_then_lose_weights(
    bench, tmp_path, monkeypatch
):
    base = tmp_path / "base"
    base.mkdir()
    (base / "tokenizer.json").write_text("base tokenizer")
    (base / "model.safetensors").write_text("base weights")
    record = {"side": "trl", "snapshots": []}
    for i in range(2):
        snap = tmp_path / f"trl_t{i}"
        snap.mkdir()
        (snap / "model.safetensors").write_text(f"weights {i}")
        record["snapshots"].append({"dir": str(snap), "train_s": 60.0 * (i + 1)})
    seen = {}

    def fake_evaluate(args, models, overrides, out):
        for m in models:  # what the evaluator gets: trained weights, the base's tokenizer
            seen[str(m)] = (
                (m / "model.safetensors").read_text(),
                (m / "tokenizer.json").read_text(),
            )
        return {str(m): {"val/acc": 0.25 * (i + 1)} for i, m in enumerate(models)}

    monkeypatch.setattr(bench, "evaluate", fake_evaluate)
    args = bench.parse_args([])
    bench.evaluate_snapshots(args, record, base, [], tmp_path / "eval")
    assert [s["acc_pct"] for s in record["snapshots"]] == [25.0, 50.0]
    assert seen[str(tmp_path / "trl_t1")] == ("weights 1", "base tokenizer")
    assert not list(tmp_path.glob("trl_t*/model.safetensors"))  # removed after evaluation
    assert (tmp_path / "trl_t0" / "tokenizer.json").exists()
    args.keep_snapshots = True
    (tmp_path / "trl_t0" / "model.safetensors").write_text("weights 0")
    record["snapshots"] = record["snapshots"][:1]
    bench.evaluate_snapshots(args, record, base, [], tmp_path / "eval")
    assert (tmp_path / "trl_t0" / "model.safetensors").read_text() == "weights 0"
