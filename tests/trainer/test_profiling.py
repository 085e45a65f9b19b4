"""Profiling: ``trainer.profile_steps`` writes torch profiler traces of those steps into the
run's log directory; every step logs its stage table and the loop's own overhead."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from verl.trainer.lifecycle.profiling import StepProfiler, add_overhead, timing_table
from verl.trainer.lifecycle.tracking import Tracker
from verl.trainer.rl.trainer import RLTrainer


def test_stage_table_and_overhead():
    metrics = {"timing_s/gen": 1.0, "timing_s/update_actor": 2.5, "timing_s/step": 4.0, "x": 7}
    add_overhead(metrics)
    assert metrics["timing_s/other"] == pytest.approx(0.5)
    table = timing_table(metrics)
    assert table == "gen 1.00s (25%) | update_actor 2.50s (62%) | other 0.50s (12%) | step 4.00s"


def test_profiled_step_writes_a_chrome_trace(tmp_path):
    profiler = StepProfiler([2], tmp_path)

    def work():
        torch.ones(64, 64) @ torch.ones(64, 64)
        return {"timing_s/step": 0.1}

    profiler.run(1, work)
    assert not list(tmp_path.iterdir())
    metrics = profiler.run(2, work)
    trace = tmp_path / "profile_step_2.json"
    assert profiler.traces == [trace]
    events = json.loads(trace.read_text())["traceEvents"]
    assert any("mm" in str(e.get("name", "")) for e in events)
    assert "timing_s/other" in metrics


@pytest.mark.parametrize("steps", [[0], [-1], ["2"], [True]])
def test_bad_profile_steps_are_refused_by_name(tmp_path, steps):
    with pytest.raises(ValueError, match=r"trainer\.profile_steps"):
        StepProfiler(steps, tmp_path)


def test_training_run_profiles_the_chosen_step_and_logs_stages(rl_config, tmp_path, caplog):
    cfg = rl_config("trainer.profile_steps=[2]", "trainer.val_before_train=false")
    trainer = RLTrainer(cfg, tracker=Tracker([]))
    with caplog.at_level(logging.INFO, logger="verl.trainer.lifecycle.profiling"):
        trainer.fit()
    assert [p.name for p in trainer.profiler.traces] == ["profile_step_2.json"]
    assert trainer.profiler.traces[0].parent == trainer.run_dir
    assert trainer.profiler.traces[0].stat().st_size > 0
    lines = [r.getMessage() for r in caplog.records if r.name == "verl.trainer.lifecycle.profiling"]
    for step in (1, 2):
        assert any(m.startswith(f"step {step}: gen ") and "update_actor" in m for m in lines)
    assert all(row["timing_s/other"] >= 0 for row in trainer.history)
