"""Dotted overrides and user YAML files: value parsing, typos, unknown keys, merging."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl.config import ConfigError, load_config
from verl.config.load import parse_value


def problems_of(overrides: list[str], path: str | Path | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    assert isinstance(info.value, ValueError)
    return [p.message for p in info.value.problems]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e-6", 1e-6),
        ("-2.5E3", -2500.0),
        ("0.5", 0.5),
        ("8", 8),
        ("-1", -1),
        ("true", True),
        ("False", False),
        ("yes", "yes"),
        ("off", "off"),
        ("null", None),
        ("[1, 2]", [1, 2]),
        ("[a.parquet,b.parquet]", ["a.parquet", "b.parquet"]),
        ("'8'", "8"),
        ('"1e-6"', "1e-6"),
        ("{a: 1}", {"a": 1}),
        ("", ""),
        ("data/train.parquet", "data/train.parquet"),
    ],
)
def test_parse_value(text: str, value: object):
    parsed = parse_value(text)
    assert parsed == value and type(parsed) is type(value)


def test_overrides_of_each_type(data_files: tuple[str, str]):
    train, val = data_files
    cfg = load_config(
        overrides=[
            "actor_rollout_ref.actor.optim.lr=1e-6",
            "actor_rollout_ref.actor.optim.weight_decay=0",  # int accepted for float
            "data.train_batch_size=16",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.use_kl_loss=true",
            f"data.train_files=[{train}]",
            f"data.val_files={val}",  # a single string for a list
            "data.val_batch_size=4",
            "data.val_batch_size=null",  # later wins
            "actor_rollout_ref.actor.clip_ratio_high=0.28",
            "trainer.logger=[console,jsonl]",
            "trainer.experiment_name=2024",  # a number for a string
            "critic.optim.betas=[0.8, 0.99]",
            "actor_rollout_ref.model.override_config.attn_implementation=eager",
            "+trainer.seed=7",  # existing key: a plain override
        ]
    )
    actor = cfg.actor_rollout_ref.actor
    assert actor.optim.lr == 1e-6 and isinstance(actor.optim.lr, float)
    assert actor.optim.weight_decay == 0.0 and isinstance(actor.optim.weight_decay, float)
    assert cfg.data.train_batch_size == 16
    assert cfg.actor_rollout_ref.rollout.n == 4
    assert actor.use_kl_loss is True
    assert cfg.data.train_files == [train] and cfg.data.val_files == [val]
    assert cfg.data.val_batch_size is None
    assert actor.clip_ratio_high == 0.28
    assert cfg.trainer.logger == ["console", "jsonl"]
    assert cfg.trainer.experiment_name == "2024"
    assert cfg.critic.optim.betas == [0.8, 0.99]
    assert cfg.actor_rollout_ref.model.override_config == {"attn_implementation": "eager"}
    assert cfg.trainer.seed == 7


def test_override_inside_null_section_creates_it_with_defaults():
    cfg = load_config(
        overrides=[
            "actor_rollout_ref.actor.strategy=fsdp2",
            "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
        ]
    )
    mp = cfg.actor_rollout_ref.actor.fsdp_config.mixed_precision
    assert (mp.param_dtype, mp.reduce_dtype, mp.buffer_dtype) == ("bf16", "fp32", "fp32")
    assert cfg.critic.fsdp_config.mixed_precision is None


def test_typo_in_leaf_suggests_closest_key():
    (msg,) = problems_of(["actor_rollout_ref.actor.optim.lrr=1"])
    assert msg.startswith("actor_rollout_ref.actor.optim.lrr: unknown key")
    assert "did you mean actor_rollout_ref.actor.optim.lr?" in msg
    (msg,) = problems_of(["data.train_bach_size=4"])
    assert "did you mean data.train_batch_size?" in msg


def test_key_in_wrong_section_points_to_its_section():
    (msg,) = problems_of(["data.ppo_mini_batch_size=4"])
    assert (
        "did you mean actor_rollout_ref.actor.ppo_mini_batch_size or critic.ppo_mini_batch_size?"
        in msg
    )


def test_typo_in_section_name():
    (msg,) = problems_of(["actor_rollout_ref.acter.ppo_epochs=2"])
    assert "actor_rollout_ref.acter: unknown key" in msg
    assert "did you mean actor_rollout_ref.actor?" in msg


def test_plus_cannot_add_keys():
    (msg,) = problems_of(["+new.key=1"])
    assert msg.startswith("new: unknown key (override '+new.key=1')")
    assert "'+' cannot add keys" in msg and "plain override" in msg
    (msg,) = problems_of(["+trainer.new_key=1"])
    assert "trainer.new_key: unknown key" in msg


def test_malformed_overrides():
    msgs = problems_of(
        ["no_equals_sign", "~trainer.seed", "data.train_batch_size=[1", "data.seed.x=1"]
    )
    assert msgs[0] == "override 'no_equals_sign': expected key=value"
    assert "deleting keys is not supported" in msgs[1]
    assert "value is not valid YAML" in msgs[2]
    assert "data.seed is a value, not a section" in msgs[3]


def test_type_errors_name_key_value_and_fix():
    msgs = problems_of(
        [
            "data.train_batch_size='8'",
            "data.max_prompt_length=1.5",
            "data.shuffle=yes",
            "trainer.device=gpu",
            "trainer.logger=[console, tb]",
            "critic.optim=3",
            "data.prompt_key=null",
        ]
    )
    assert sorted(msgs) == sorted(
        [
            "data.train_batch_size='8': expected int, got a string (write the number without quotes)",
            "data.max_prompt_length=1.5: expected int, got a float (use a whole number, e.g. 8 not 8.0)",
            "data.shuffle=yes: expected bool, got a string (use true or false)",
            "trainer.device=gpu: must be one of auto, cpu, cuda; did you mean cpu?",
            "trainer.logger[1]=tb: must be one of console, jsonl, tensorboard, wandb, mlflow",
            "critic.optim=3: expected a mapping of keys (a section)",
            "data.prompt_key=null: not allowed; expected str",
        ]
    )


def test_multiple_problems_in_one_error():
    with pytest.raises(ConfigError) as info:
        load_config(
            overrides=[
                "data.train_bach_size=4",
                "actor_rollout_ref.rollout.top_p=0",
                "actor_rollout_ref.rollout.temperature=-1",
                "actor_rollout_ref.actor.ppo_mini_batch_size=3",
            ]
        )
    err = info.value
    assert len(err.problems) == 4
    text = str(err)
    assert text.startswith("invalid config (4 problems):\n  - data.train_bach_size: unknown key")
    assert "actor_rollout_ref.rollout.top_p=0.0: must be in (0, 1]" in text
    assert "actor_rollout_ref.rollout.temperature=-1.0: must be >= 0" in text
    assert "ppo_mini_batch_size=3: does not divide data.train_batch_size=8" in text


def test_user_yaml_merges_then_overrides_win(tmp_path: Path):
    user = tmp_path / "run.yaml"
    user.write_text("data:\n  train_batch_size: 16\n  max_prompt_length: 256\ntrainer: {seed: 1}\n")
    cfg = load_config(user, ["data.train_batch_size=32"])
    assert cfg.data.train_batch_size == 32  # override beats file
    assert cfg.data.max_prompt_length == 256  # file beats default
    assert cfg.data.max_response_length == 64  # untouched default
    assert cfg.trainer.seed == 1


def test_user_yaml_errors(tmp_path: Path):
    missing = tmp_path / "missing.yaml"
    (msg,) = problems_of([], missing)
    assert msg == f"config file {str(missing)!r} does not exist"
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [1\n")
    (msg,) = problems_of([], bad)
    assert "is not valid YAML" in msg
    typo = tmp_path / "typo.yaml"
    typo.write_text("data:\n  train_bach_size: 4\nalgorithm:\n  kl_ctrl: {kl_coeff: 0.1}\n")
    msgs = problems_of([], typo)
    assert msgs == [
        "data.train_bach_size: unknown key in data; did you mean data.train_batch_size?",
        "algorithm.kl_ctrl.kl_coeff: unknown key in algorithm.kl_ctrl; "
        "did you mean algorithm.kl_ctrl.kl_coef?",
    ]


def test_interpolation_is_refused_naming_the_key(tmp_path: Path):
    """No OmegaConf: a ``${...}`` value is an error, not a literal string."""
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  experiment_name: ${trainer.project_name}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "trainer.experiment_name" in str(err.value)
    assert "interpolation is not supported" in str(err.value)


def test_defaults_come_from_the_dataclasses_not_the_yaml(monkeypatch, tmp_path: Path):
    """The generated ppo_trainer.yaml is documentation: loading never reads it."""
    read_text = Path.read_text

    def read_but_not_generated(self: Path, *args: object) -> str:
        assert self.name != "ppo_trainer.yaml", "the loader read the generated YAML"
        return read_text(self, *args)

    monkeypatch.setattr(Path, "read_text", read_but_not_generated)
    path = tmp_path / "run.yaml"
    # a partial section keeps the defaults of its parent field (critic.optim.lr is 1e-5,
    # not OptimConfig's 1e-6)
    path.write_text("critic:\n  optim:\n    weight_decay: 0.0\n")
    cfg = load_config(path, ["actor_rollout_ref.actor.optim.eps=1e-7"])
    assert cfg.critic.optim.lr == 1e-5 and cfg.critic.optim.weight_decay == 0.0
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6
    assert cfg.actor_rollout_ref.actor.optim.eps == 1e-7


def test_offline_loaders_take_the_dataclass_defaults(tmp_path: Path):
    """SFT/DPO loading starts from SFTConfig()/DPOConfig(), not from their generated YAML."""
    from verl.config import DPOConfig, SFTConfig, load_dpo_config, load_sft_config

    assert load_sft_config() == SFTConfig()
    assert load_dpo_config() == DPOConfig()
    path = tmp_path / "sft.yaml"
    path.write_text("optim:\n  weight_decay: 0.0\n")
    cfg = load_sft_config(path)
    assert cfg.optim.weight_decay == 0.0 and cfg.optim.lr == SFTConfig().optim.lr
