"""`verl plot`'s engine: a PNG of the expected size from sample logs, notes for missing
metrics, errors naming a bad run directory; the main job's end-of-run plot."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from verl.cli import ppo as main_ppo
from verl.config import to_yaml
from verl.trainer.lifecycle.plot import PANELS, plot_after_run, plot_runs, read_run

pytest.importorskip("matplotlib")


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def write_log(run_dir: Path, rows: list[dict]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return run_dir


def full_rows(scale: float) -> list[dict]:
    rows: list[dict] = [{"step": 0, "val/acc": 0.25}]
    for step in range(1, 6):
        rows.append(
            {
                "step": step,
                "critic/score/mean": scale * step,
                "actor/kl_loss": 0.01 * step,
                "actor/entropy": 1.0 - 0.1 * step,
                "response_length/mean": 5.0,
                "actor/grad_norm": 1.0,
                "timing_s/step": 2.0,
                "training/epoch": 0,
            }
        )
    rows[-1]["val/acc"] = 0.75
    return rows


def test_two_runs_overlaid_give_a_1600x800_png(tmp_path):
    a = write_log(tmp_path / "run_a", full_rows(0.1))
    b = write_log(tmp_path / "run_b", full_rows(0.2))
    out, notes = plot_runs([a, b], tmp_path / "plots" / "both.png")
    assert out == tmp_path / "plots" / "both.png"
    assert png_size(out) == (1600, 800)
    assert notes == []


def test_missing_metrics_are_skipped_with_a_note(tmp_path):
    run = write_log(tmp_path / "sparse", [{"step": 1, "critic/score/mean": 0.5}])
    out, notes = plot_runs([run / "metrics.jsonl"], tmp_path / "sparse.png")
    assert png_size(out) == (1600, 400)  # one row: the reward panel and the legend
    assert len(notes) == len(PANELS) - 1
    assert any(note.startswith("KL (actor/kl_loss") for note in notes)


def test_read_run_keeps_numbers_last_row_wins_and_skips_torn_lines(tmp_path):
    path = tmp_path / "r" / "metrics.jsonl"
    path.parent.mkdir()
    path.write_text(
        '{"step": 1, "critic/score/mean": 0.5, "note": "x", "bad": "nan"}\n'
        '{"step": 1, "val/acc": 0.5}\n{"step": 1, "val/acc": 0.7}\n'
        '{"step": 2, "critic/sc'
    )
    run = read_run(tmp_path / "r")
    assert run.label == "r"
    assert run.series == {"critic/score/mean": {1: 0.5}, "val/acc": {1: 0.7}}
    assert run.skipped_lines == 1


def test_bad_run_directories_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"'.*nowhere' does not exist"):
        plot_runs([tmp_path / "nowhere"], tmp_path / "x.png")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty' has no metrics.jsonl.*jsonl"):
        plot_runs([tmp_path / "empty"], tmp_path / "x.png")
    write_log(tmp_path / "sft", [{"step": 1, "train/loss": 2.0}])
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_runs([tmp_path / "sft"], tmp_path / "x.png")
    with pytest.raises(ValueError, match="no run to plot"):
        plot_runs([], tmp_path / "x.png")


def test_plot_after_run_writes_metrics_png_beside_the_log(tmp_path):
    run = write_log(tmp_path / "run", full_rows(0.1))
    assert plot_after_run(run / "metrics.jsonl") == run / "metrics.png"
    assert png_size(run / "metrics.png") == (1600, 800)
    assert plot_after_run(None) is None


@pytest.mark.slow
def test_main_job_plots_the_run_and_prints_its_path(rl_config, tmp_path, capsys):
    config_file = tmp_path / "run.yaml"
    config_file.write_text(to_yaml(rl_config("trainer.logger=[console,jsonl]")))
    assert main_ppo.main(["--config", str(config_file)]) == 0
    out = capsys.readouterr().out
    assert f"metrics plotted to {tmp_path / 'metrics.png'}" in out
    assert png_size(tmp_path / "metrics.png") == (1600, 800)
