"""Trackers: jsonl rows and generation tables, mlflow runs read back by mlflow's own client,
and a missing optional package that names its extra."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest

from verl.config import ConfigError
from verl.trainer.lifecycle.tracking import Tracker, markdown_table
from verl.trainer.rl.trainer import RLTrainer

SAMPLES = [
    {"data_source": "arith", "prompt": "1+2=", "response": "3", "score": 1.0},
    {"data_source": "arith", "prompt": "2+2=", "response": "a|b\nc", "score": 0.0},
]


def test_jsonl_metrics_and_generations_in_separate_files(tmp_path):
    tracker = Tracker(["jsonl"], log_dir=tmp_path)
    tracker.log({"critic/score/mean": 0.5, "x": float("nan")}, step=1)
    tracker.log_generations(SAMPLES, step=1)
    tracker.log_generations([], step=2)  # nothing to write: no row
    tracker.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"step": 1, "critic/score/mean": 0.5, "x": "nan"}]
    gens = [json.loads(line) for line in (tmp_path / "generations.jsonl").read_text().splitlines()]
    assert gens == [{"step": 1, **s} for s in SAMPLES]


def test_rewind_drops_later_generation_rows_too(tmp_path):
    tracker = Tracker(["jsonl"], log_dir=tmp_path)
    for step in (1, 2, 3):
        tracker.log({"a": float(step)}, step=step)
        tracker.log_generations(SAMPLES[:1], step=step)
    tracker.rewind(1)
    tracker.close()
    steps = [json.loads(line)["step"] for line in (tmp_path / "generations.jsonl").open()]
    assert steps == [1]


def test_markdown_table_escapes_cells():
    table = markdown_table(SAMPLES).splitlines()
    assert table[0] == "| data_source | prompt | response | score |"
    assert table[1] == "|---|---|---|---|"
    assert table[3] == "| arith | 2+2= | a\\|b<br>c | 0.0 |"


def test_unknown_backend_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"unknown logger\(s\) \['mlflw'\]"):
        Tracker(["mlflw"], log_dir=tmp_path)


def test_missing_mlflow_names_the_extra(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_mlflow(name, *args, **kwargs):
        if name == "mlflow" or name.startswith("mlflow."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mlflow)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    with pytest.raises(ImportError, match=r"pip install 'verl\[mlflow\]'"):
        Tracker(["mlflow"], log_dir=tmp_path)


def test_mlflow_run_is_read_back_by_mlflows_client(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    tracker = Tracker(
        ["mlflow"],
        log_dir=tmp_path,
        project="proj",
        experiment="exp1",
        config={"trainer": {"total_training_steps": 3}, "data": {"train_batch_size": 4}},
    )
    for step in (1, 2, 3):
        tracker.log({"critic/score/mean": step / 10, "pass@4": 1.0, "note": "text"}, step=step)
    tracker.log({"val/acc": 0.75, "val/acc/x": 0.5}, step=3)
    tracker.log_generations(SAMPLES, step=3)
    run_id = tracker.mlflow_run_id
    tracker.close()

    store = tmp_path / "mlruns"
    assert store.is_dir()
    assert tracker.mlflow_tracking_uri == store.resolve().as_uri()
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "exp1"
    assert client.get_experiment(run.info.experiment_id).name == "proj"
    assert run.data.params == {"trainer.total_training_steps": "3", "data.train_batch_size": "4"}
    # the file store keeps names as paths: '/' -> '.', so val/acc and val/acc/x can coexist
    assert set(run.data.metrics) == {"critic.score.mean", "val.acc", "val.acc.x", "pass_4"}
    history = client.get_metric_history(run_id, "critic.score.mean")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "val.acc")] == [(3, 0.75)]
    assert run.data.metrics["pass_4"] == 1.0  # '@' is not allowed in an mlflow key
    local = client.download_artifacts(run_id, "val_generations/step_000003.json", str(tmp_path))
    table = json.loads(Path(local).read_text())
    assert table["columns"] == ["data_source", "prompt", "response", "score"]
    assert table["data"][1] == ["arith", "2+2=", "a|b\nc", 0.0]


def test_mlflow_respects_tracking_uri(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    elsewhere = (tmp_path / "elsewhere").resolve().as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", elsewhere)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    tracker = Tracker(["mlflow"], log_dir=tmp_path / "run")
    tracker.log({"a": 1.0}, step=5)
    tracker.close()
    assert not (tmp_path / "run" / "mlruns").exists()
    history = MlflowClient(tracking_uri=elsewhere).get_metric_history(tracker.mlflow_run_id, "a")
    assert [(m.step, m.value) for m in history] == [(5, 1.0)]


def test_negative_log_val_generations_is_rejected(rl_config):
    with pytest.raises(ConfigError, match=r"trainer\.log_val_generations"):
        rl_config("trainer.log_val_generations=-1")


@pytest.mark.slow
def test_rl_run_logs_validation_table_and_mlflow_metrics(rl_config, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    cfg = rl_config(
        "trainer.logger=[jsonl,mlflow]", "trainer.log_val_generations=3", "trainer.test_freq=2"
    )
    trainer = RLTrainer(cfg)
    trainer.fit()
    rows = [json.loads(line) for line in (tmp_path / "generations.jsonl").open()]
    assert [r["step"] for r in rows] == [0, 0, 0, 2, 2, 2]  # before training, after step 2
    for row in rows:
        assert set(row) == {"step", "data_source", "prompt", "response", "ground_truth", "score"}
        assert row["prompt"] and isinstance(row["score"], float)
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    run_id = trainer.tracker.mlflow_run_id
    score = client.get_metric_history(run_id, "critic.score.mean")
    assert [(m.step, m.value) for m in score] == [
        (k, pytest.approx(h["critic/score/mean"])) for k, h in enumerate(trainer.history, 1)
    ]
    assert sorted(m.step for m in client.get_metric_history(run_id, "val.acc")) == [0, 2]
    assert sorted(m.step for m in client.get_metric_history(run_id, "val.acc.arithmetic")) == [0, 2]
    artifacts = [a.path for a in client.list_artifacts(run_id, "val_generations")]
    assert artifacts == ["val_generations/step_000000.json", "val_generations/step_000002.json"]
