"""The schema is the one source: YAML defaults, docs table and Python objects all agree with it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import verl
from verl.cli.config_gen import default_yaml, with_tables
from verl.config import (
    ActorConfig,
    ActorRolloutRefConfig,
    DataConfig,
    FSDPConfig,
    MixedPrecisionConfig,
    OptimConfig,
    RolloutConfig,
    RunConfig,
    TrainerConfig,
    from_dict,
    load_config,
    to_dict,
    to_yaml,
)
from verl.config.load import iter_schema, load_yaml_text, section_class

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "config.md"


def leaf_paths() -> list[str]:
    return [p for p, _, tp in iter_schema(TrainerConfig) if section_class(tp) is None]


def test_defaults_load_and_equal_schema():
    cfg = load_config()
    assert cfg == TrainerConfig()
    assert cfg.data.train_batch_size == 8
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6
    assert cfg.critic.optim.lr == 1e-5
    assert cfg.actor_rollout_ref.rollout.val_kwargs.temperature == 0.0
    assert cfg.trainer.default_local_dir == "checkpoints/{project_name}/{experiment_name}"


def default_config_text() -> str:
    return (Path(__file__).parents[2] / "verl/trainer/config/ppo_trainer.yaml").read_text()


def test_committed_yaml_is_generated_from_schema():
    committed = default_config_text()
    assert committed == default_yaml(), (
        "verl/trainer/config/ppo_trainer.yaml is stale: run "
        "python -m verl.cli.config_gen yaml > verl/trainer/config/ppo_trainer.yaml"
    )
    assert load_yaml_text(committed) == to_dict(TrainerConfig())


def test_docs_table_is_generated_from_schema():
    doc = DOCS.read_text()
    assert doc == with_tables(doc), "run python -m verl.cli.config_gen docs docs/config.md"


def test_every_leaf_is_documented_and_commented():
    doc = DOCS.read_text()
    yaml_text = default_config_text()
    leaves = leaf_paths()
    assert len(leaves) > 140
    for path in leaves:
        assert f"`{path}`" in doc, path
    for path, f, _ in iter_schema(TrainerConfig):
        assert f.metadata["help"].strip(), f.name
        if ".mixed_precision." not in path:  # keys of a section that defaults to null
            assert f"# {f.metadata['help']}" in yaml_text


def test_top_level_imports():
    assert verl.TrainerConfig is TrainerConfig
    assert verl.load_config is load_config


def test_python_construction_equals_yaml(tmp_path: Path):
    py = TrainerConfig(
        data=DataConfig(train_batch_size=16, max_response_length=32),
        actor_rollout_ref=ActorRolloutRefConfig(
            actor=ActorConfig(
                ppo_mini_batch_size=8,
                optim=OptimConfig(lr=3e-6, warmup_style="cosine"),
                fsdp_config=FSDPConfig(mixed_precision=MixedPrecisionConfig(param_dtype="bf16")),
            ),
            rollout=RolloutConfig(n=4, temperature=0.7),
        ),
        trainer=RunConfig(experiment_name="py", logger=["console", "jsonl"]),
    )
    py.validate()
    user = tmp_path / "run.yaml"
    user.write_text(
        """
data: {train_batch_size: 16, max_response_length: 32}
actor_rollout_ref:
  actor:
    ppo_mini_batch_size: 8
    optim: {lr: 3e-6, warmup_style: cosine}
    fsdp_config: {mixed_precision: {param_dtype: bf16}}
  rollout: {n: 4, temperature: 0.7}
trainer: {experiment_name: py, logger: [console, jsonl]}
"""
    )
    assert load_config(user) == py


def test_round_trips():
    cfg = load_config(
        overrides=[
            "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
            "actor_rollout_ref.model.override_config={rope_theta: 10000.0, layers: [1, 2]}",
            "trainer.experiment_name='1e-6'",
            "reward_model.clip_range=[-1, 1]",
            "actor_rollout_ref.rollout.stop=['</answer>', 'yes']",
        ]
    )
    d = to_dict(cfg)
    assert d["reward_model"]["clip_range"] == [-1.0, 1.0]
    assert from_dict(d) == cfg
    assert from_dict(load_yaml_text(to_yaml(cfg))) == cfg
    assert from_dict(load_yaml_text(to_yaml(cfg, comments=True))) == cfg
    # to_dict is a deep copy
    d["actor_rollout_ref"]["rollout"]["stop"].append("x")
    assert cfg.actor_rollout_ref.rollout.stop == ["</answer>", "yes"]


def test_configs_own_their_mutable_defaults():
    a, b = TrainerConfig(), TrainerConfig()
    a.data.train_files.append("x")
    a.actor_rollout_ref.actor.optim.betas[0] = 0.5
    assert b.data.train_files == [] and b.actor_rollout_ref.actor.optim.betas == [0.9, 0.999]


def test_sections_are_plain_dataclasses():
    for _, _, tp in iter_schema(TrainerConfig):
        cls = section_class(tp)
        if cls is not None:
            assert dataclasses.is_dataclass(cls)
            cls()  # every section has full defaults


def test_yaml_has_no_stray_keys():
    # every "key:" line of the defaults file is a schema key
    names = {p.rsplit(".", 1)[-1] for p, _, _ in iter_schema(TrainerConfig)}
    keys = re.findall(r"^\s*([a-z_]+):", default_config_text(), flags=re.M)
    assert set(keys) <= names
    n_mixed_precision_keys = len(dataclasses.fields(MixedPrecisionConfig))
    assert len(keys) == len(list(iter_schema(TrainerConfig))) - 2 * n_mixed_precision_keys


@pytest.mark.parametrize("name", ["TrainerConfig", "load_config"])
def test_lazy_public_names(name: str):
    assert getattr(verl, name) is getattr(verl.config, name)


def test_gen_runs_as_a_module_without_a_runpy_warning():
    """Nothing imports config_gen on package import, so ``python -m`` runs it fresh."""
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-W",
            "error::RuntimeWarning",
            "-m",
            "verl.cli.config_gen",
            "yaml",
            "sft",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout == default_yaml("sft")
