"""The entry points: ``python -m verl.trainer.main_ppo`` and the ``verl`` command."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from verl import cli
from verl.cli import ppo as main_ppo
from verl.config import TrainerConfig, from_dict
from verl.config.load import load_yaml_text

HEAVY = ("torch", "transformers", "ray", "numpy", "pyarrow")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_print_config_subprocess():
    proc = run(
        "-m",
        "verl.trainer.main_ppo",
        "--print-config",
        "data.train_batch_size=16",
        "actor_rollout_ref.rollout.n=2",
    )
    assert proc.returncode == 0, proc.stderr
    cfg = from_dict(load_yaml_text(proc.stdout))
    expected = TrainerConfig()
    expected.data.train_batch_size = 16
    expected.actor_rollout_ref.rollout.n = 2
    assert cfg == expected


def test_typo_exits_2_with_message_subprocess():
    proc = run(
        "-m",
        "verl.trainer.main_ppo",
        "actor_rollout_ref.actor.optim.lrr=1",
        "data.train_bach_size=4",
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "invalid config (2 problems):",
        "  - actor_rollout_ref.actor.optim.lrr: unknown key (override "
        "'actor_rollout_ref.actor.optim.lrr=1'); did you mean actor_rollout_ref.actor.optim.lr?",
        "  - data.train_bach_size: unknown key (override 'data.train_bach_size=4'); did you mean "
        "data.train_batch_size?",
    ]


def test_config_errors_and_validation_import_nothing_heavy():
    code = textwrap.dedent(
        f"""
        import sys
        from verl.cli.ppo import main
        assert main(["data.train_bach_size=4"]) == 2
        assert main(["--validate-only", "actor_rollout_ref.rollout.n=2"]) == 0
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
        print("HEAVY", heavy)
        """
    )
    proc = run("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout
    assert "config OK" in proc.stdout


def test_format_results_table():
    text = main_ppo.format_results(
        {
            "val_before": {"val/acc": 0.25, "val/acc/arithmetic": 0.25},
            "val_after": {"val/acc": 0.75, "val/acc/arithmetic": 0.75, "val/score": 0.75},
            "hf_dir": "/x/huggingface",
        },
        seconds=90.0,
    )
    assert "val/acc/arithmetic     0.250     0.750" in text
    assert "val/score" not in text
    assert "wall time: 1.5 min; actor saved to /x/huggingface" in text


def test_user_config_file_and_intermixed_flags(tmp_path, capsys: pytest.CaptureFixture[str]):
    user = tmp_path / "run.yaml"
    user.write_text("trainer: {experiment_name: from_file}\n")
    rc = main_ppo.main(["trainer.seed=3", "--config", str(user), "--print-config", "data.seed=5"])
    assert rc == 0
    cfg = from_dict(load_yaml_text(capsys.readouterr().out))
    assert (cfg.trainer.experiment_name, cfg.trainer.seed, cfg.data.seed) == ("from_file", 3, 5)


def test_cli(capsys: pytest.CaptureFixture[str]):
    assert cli.main(["config", "trainer.seed=9"]) == 0
    assert from_dict(load_yaml_text(capsys.readouterr().out)).trainer.seed == 9
    assert cli.main(["config", "trainer.sed=9"]) == 2
    assert "did you mean trainer.seed?" in capsys.readouterr().err
    assert cli.main(["bogus"]) == 2
    assert "unknown command 'bogus'" in capsys.readouterr().err
    assert cli.main([]) == 2
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in ("train", "sft", "dpo", "config"))


@pytest.mark.parametrize("command", ["sft", "dpo"])
def test_cli_offline_commands_validate_their_own_schema(command, capsys):
    assert cli.main([command, "--validate-only"]) == 0
    assert cli.main([command, "optim.lrr=1e-5"]) == 2
    err = capsys.readouterr().err
    assert "optim.lrr" in err and "did you mean optim.lr?" in err


def test_cli_module_subprocess():
    proc = run("-m", "verl.cli", "train", "--validate-only", "data.train_batch_size=x")
    assert proc.returncode == 2
    assert "data.train_batch_size=x: expected int, got a string" in proc.stderr


def test_hydra_config_path_and_name(tmp_path, monkeypatch, capsys: pytest.CaptureFixture[str]):
    """Upstream verl's scripts select a config with Hydra's --config-path / --config-name."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "mine.yaml").write_text("data:\n  train_batch_size: 12\n")
    monkeypatch.chdir(tmp_path)
    assert main_ppo.main(["--config-path=conf", "--config-name=mine", "--print-config"]) == 0
    assert from_dict(load_yaml_text(capsys.readouterr().out)).data.train_batch_size == 12
    # upstream's own spelling of the packaged defaults, beside the entry module
    argv = ["--config-path", "config", "--config-name", "ppo_trainer", "--print-config"]
    assert main_ppo.main(argv) == 0
    assert from_dict(load_yaml_text(capsys.readouterr().out)) == TrainerConfig()
    # a config this build does not ship, and the flags misused
    assert main_ppo.main(["--config-path=config", "--config-name=grpo_special"]) == 2
    err = capsys.readouterr().err
    assert "'grpo_special': no such file" in err and "packaged config is ppo_trainer" in err
    # upstream's Megatron config: the reason and what runs instead, not a missing file
    assert main_ppo.main(["--config-path=config", "--config-name=ppo_megatron_trainer"]) == 2
    err = capsys.readouterr().err
    assert "there is no Megatron engine here" in err and "strategy=fsdp2" in err
    assert main_ppo.main(["--config-path=conf"]) == 2
    assert "--config-path needs --config-name" in capsys.readouterr().err
    assert main_ppo.main(["--config=x.yaml", "--config-name=mine"]) == 2
    assert "give --config or --config-name, not both" in capsys.readouterr().err
    # the offline entry points read the same flags with their own packaged name
    from verl.cli import sft as main_sft

    argv = ["--config-path=config", "--config-name=sft_trainer", "--validate-only"]
    assert main_sft.main(argv) == 0


def test_a_run_error_is_one_line_and_exit_1(tmp_path, capsys: pytest.CaptureFixture[str]):
    """A run that cannot start or go on for a reason its message explains (here a run lock
    path someone made a directory) ends with that message, not a traceback."""
    (tmp_path / ".verl-run.lock").mkdir()
    rc = main_ppo.main(
        [
            f"trainer.default_local_dir={tmp_path}",
            f"trainer.log_dir={tmp_path}",
            "trainer.logger=[]",
        ]
    )
    err = capsys.readouterr().err
    assert rc == main_ppo.EXIT_RUN_ERROR == 1
    assert err.startswith("error: ") and ".verl-run.lock" in err
    assert "Traceback" not in err
