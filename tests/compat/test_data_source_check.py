"""A ``data_source`` without a scorer is refused when the trainer is built, before any model
loads, naming the data key, the file and the first row with that source.

The check applies when the rules score the rows (no ``custom_reward_function``, no reward
function passed in Python); the eager and the lazy (``dataloader_num_workers > 0``) datasets
are both read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl.config import load_config
from verl.models.tiny import save_tiny_model_dir
from verl.rewards import UnknownDataSourceError


class _ModelsWouldLoad(Exception):
    """Raised instead of building the roles: the point where the models load."""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", arch="qwen2")


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise _ModelsWouldLoad

    monkeypatch.setattr("verl.trainer.rl.trainer.build_roles", refuse)


def _rows(sources: list[str]) -> list[dict]:
    return [
        {
            "data_source": source,
            "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
        }
        for i, source in enumerate(sources)
    ]


def _write(path: Path, rows: list[dict]) -> Path:
    if path.suffix == ".parquet":
        from verl.data.io import write_records

        write_records(rows, path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _trainer(tiny_model: Path, tmp_path: Path, train: Path, val: Path, *extra: str):
    from verl.trainer.rl.trainer import RLTrainer

    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={tiny_model}",
            f"data.train_files=[{train}]",
            f"data.val_files=[{val}]",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "trainer.logger=[]",
            f"trainer.default_local_dir={tmp_path / 'run'}",
            f"trainer.log_dir={tmp_path / 'run'}",
            *extra,
        ]
    )
    return RLTrainer(cfg)


@pytest.mark.parametrize(
    ("suffix", "workers"), [(".parquet", 0), (".jsonl", 0), (".parquet", 1), (".jsonl", 1)]
)
def test_a_typod_train_source_is_named_with_its_file_and_row(tiny_model, tmp_path, suffix, workers):
    train = _write(tmp_path / f"train{suffix}", _rows(["gsm8k", "gsm8k", "gsm8kk", "gsm8kk"]))
    val = _write(tmp_path / f"val{suffix}", _rows(["gsm8k", "gsm8k"]))
    extra = [f"data.dataloader_num_workers={workers}"] if workers else []
    with pytest.raises(UnknownDataSourceError) as info:
        _trainer(tiny_model, tmp_path, train, val, *extra)
    unit = "row" if suffix == ".parquet" else "line"
    msg = str(info.value)
    assert msg.startswith(
        f"data.train_files: {train} {unit} 3 has data_source='gsm8kk' (did you mean 'gsm8k'?)"
    ), msg
    assert "register_scorer" in msg and "custom_reward_function.path" in msg


def test_a_typod_val_source_is_named(tiny_model, tmp_path):
    train = _write(tmp_path / "train.jsonl", _rows(["gsm8k", "arithmetic"]))
    val = _write(tmp_path / "val.jsonl", _rows(["gsm8k", "math", "no_such_task"]))
    with pytest.raises(UnknownDataSourceError, match=f"data.val_files: {val} line 3 has"):
        _trainer(tiny_model, tmp_path, train, val)


def test_known_sources_or_a_custom_reward_function_pass_on_to_the_models(tiny_model, tmp_path):
    train = _write(tmp_path / "train.jsonl", _rows(["gsm8k", "aime_2025", "math", "arithmetic"]))
    val = _write(tmp_path / "val.jsonl", _rows(["gsm8k", "gsm8k"]))
    with pytest.raises(_ModelsWouldLoad):
        _trainer(tiny_model, tmp_path, train, val)

    fn = tmp_path / "score.py"
    fn.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n")
    fn.write_text(fn.read_text() + "    return 0.0\n")
    typo = _write(tmp_path / "typo.jsonl", _rows(["my_task", "my_task"]))
    with pytest.raises(_ModelsWouldLoad):
        _trainer(tiny_model, tmp_path, typo, typo, f"custom_reward_function.path={fn}")
