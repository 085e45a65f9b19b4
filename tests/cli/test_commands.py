"""`verl` subcommands other than generate/eval: help, config --reference, plot, data, merge."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from verl import cli
from verl.cli.config_gen import default_yaml, iter_rows
from verl.config.load import get_path
from verl.config.schema import TrainerConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_command_has_a_complete_help(command, capsys):
    assert cli.main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: verl {command}")
    assert cli.COMMANDS[command][2] in cli.USAGE
    if command not in ("data",):  # data's help lists its tools instead of options
        assert "-h, --help" in out


def test_top_level_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("train", "sft", "dpo", "export", "merge", "config", "generate", "eval"):
        assert f"\n  {command} " in out
    assert cli.main(["plto"]) == 2
    assert "unknown command 'plto'" in capsys.readouterr().err


# ---------------------------------------------------------------------- config --reference


def test_config_reference_is_every_key_with_its_comment(capsys):
    assert cli.main(["config", "--reference"]) == 0
    out = capsys.readouterr().out
    assert out == default_yaml()
    assert out == (ROOT / "verl/trainer/config/ppo_trainer.yaml").read_text()
    lines = out.splitlines()
    defaults = TrainerConfig()
    checked = 0
    for path, _, _, help_text in iter_rows(TrainerConfig):
        parent = path.rsplit(".", 1)[0] if "." in path else None
        if parent is not None and get_path(defaults, parent) is None:
            continue  # a null section is one YAML line; the table has its keys
        name, indent = path.rsplit(".", 1)[-1], "  " * path.count(".")
        at = [i for i, line in enumerate(lines) if line.startswith(f"{indent}{name}:")]
        assert any(lines[i - 1] == f"{indent}# {help_text}" for i in at), path
        checked += 1
    assert checked > 150  # 176 keys when written


def test_config_reference_table_has_every_key(capsys):
    assert cli.main(["config", "--reference", "--format", "table"]) == 0
    out = capsys.readouterr().out
    for path, _, _, help_text in iter_rows(TrainerConfig):
        assert f"| `{path}` |" in out, path
        assert help_text.replace("|", "\\|") in out, path
    assert "| `trainer.log_val_generations` | int | `0` |" in out


def test_config_reference_of_sft_and_bad_arguments(capsys):
    assert cli.main(["config", "--reference", "--trainer", "sft"]) == 0
    assert capsys.readouterr().out == (ROOT / "verl/trainer/config/sft_trainer.yaml").read_text()
    assert cli.main(["config", "--reference", "trainer.seed=3"]) == 2
    assert "takes no --config or key=value" in capsys.readouterr().err
    assert cli.main(["config", "--trainer", "ppp"]) == 2
    assert "invalid choice: 'ppp'" in capsys.readouterr().err


def test_config_resolves_overrides_for_each_trainer(capsys):
    assert cli.main(["config", "trainer.seed=9"]) == 0
    assert "seed: 9" in capsys.readouterr().out
    assert cli.main(["config", "--trainer", "dpo", "trainer.seed=11"]) == 0
    assert "seed: 11" in capsys.readouterr().out


# ---------------------------------------------------------------------- plot


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_plot_two_runs(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        rows = [{"step": s, "critic/score/mean": s / 10, "val/acc": 0.5} for s in (1, 2, 3)]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "both.png"
    assert cli.main(["plot", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(out)
    assert "not in the log: KL" in captured.err
    assert _png_size(out) == (1600, 400)  # reward, val acc, legend: one row
    assert cli.main(["plot", str(tmp_path / "a")]) == 0  # default: beside the log
    assert _png_size(tmp_path / "a" / "metrics.png") == (1600, 400)


def test_plot_bad_run_directory(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    assert cli.main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "verl plot: error:" in err and "has no metrics.jsonl" in err and str(tmp_path) in err


# ---------------------------------------------------------------------- data


def test_data_list_and_arithmetic(tmp_path, capsys):
    assert cli.main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "arithmetic  generator" in out and "gsm8k       converter" in out
    rc = cli.main(
        [
            "data",
            "arithmetic",
            "--out",
            str(tmp_path),
            "--train-size",
            "7",
            "--val-size",
            "3",
            "--format",
            "jsonl",
        ]
    )
    assert rc == 0
    assert len((tmp_path / "train.jsonl").read_text().splitlines()) == 7
    assert len((tmp_path / "test.jsonl").read_text().splitlines()) == 3


def test_data_gsm8k_converts(tmp_path, capsys):
    src = tmp_path / "gsm.jsonl"
    src.write_text(json.dumps({"question": "2+3?", "answer": "2+3=5\n#### 5"}) + "\n")
    out = tmp_path / "gsm.parquet"
    assert cli.main(["data", "gsm8k", "--input", str(src), "--out", str(out)]) == 0
    assert f"wrote 1 rows to {out}" in capsys.readouterr().out
    import pyarrow.parquet as pq

    row = pq.read_table(out).to_pylist()[0]
    assert row["reward_model"]["ground_truth"] == "5"


def test_data_bad_input(tmp_path, capsys):
    assert cli.main(["data", "mnist"]) == 2
    assert "unknown tool 'mnist'" in capsys.readouterr().err
    assert cli.main(["data", "arithmetic", "--out", str(tmp_path), "--digits", "0"]) == 2
    assert "--digits 0: must be >= 1" in capsys.readouterr().err


# ---------------------------------------------------------------------- merge


def test_merge_takes_upstream_flags_and_equals_export(tiny_model_dir, tmp_path, capsys):
    from safetensors.torch import load_file

    from verl.config import load_config
    from verl.trainer.rl.trainer import RLTrainer

    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            "data.train_batch_size=2",
            "data.max_response_length=4",
            "data.arithmetic.train_size=4",
            "data.arithmetic.val_size=2",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device=2",
            "trainer.total_training_steps=1",
            "trainer.logger=[]",
            f"trainer.default_local_dir={tmp_path / 'run'}",
            f"trainer.log_dir={tmp_path / 'run'}",
        ]
    )
    trainer = RLTrainer(cfg)
    try:
        trainer.global_step = 1
        trainer.train_step(next(iter(trainer.train_loader)))
        checkpoint = trainer.save_checkpoint()
    finally:
        trainer.close()
    merged, exported = tmp_path / "merged", tmp_path / "exported"
    rc = cli.main(
        [
            "merge",
            "merge",
            "--backend",
            "fsdp",
            "--local_dir",
            str(checkpoint / "actor"),
            "--target_dir",
            str(merged),
        ]
    )
    assert rc == 0
    assert cli.main(["export", "--checkpoint", str(checkpoint), "--out", str(exported)]) == 0
    a = load_file(merged / "model.safetensors")
    b = load_file(exported / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_merge_bad_input(tmp_path, capsys):
    assert cli.main(["merge", "--local_dir", str(tmp_path / "nope"), "--target_dir", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert (
        cli.main(["merge", "--backend", "megatron", "--local_dir", "a", "--target_dir", "b"]) == 2
    )
    assert "invalid choice: 'megatron'" in capsys.readouterr().err
