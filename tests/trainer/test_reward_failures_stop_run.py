"""A reward function that breaks the run stops it with a clear error (issue 20, item 7):
a wrong signature before any worker starts, a failure rate above the threshold at the
first step, without saving a model."""

from __future__ import annotations

import pytest

from verl.rewards import RewardFailureError
from verl.trainer.rl.trainer import RLTrainer


def _reward_file(tmp_path, body: str) -> tuple[str, str]:
    path = tmp_path / "my_reward.py"
    path.write_text(body)
    return f"custom_reward_function.path={path}", "custom_reward_function.name=score"


def test_wrong_signature_fails_at_construction(rl_config, tmp_path):
    path, name = _reward_file(tmp_path, "def score(text):\n    return 1.0\n")
    with pytest.raises(TypeError, match=r"reward function score \(.*my_reward.py\) has signature"):
        RLTrainer(rl_config(path, name))


def test_reward_failing_on_every_call_stops_the_first_step(rl_config, tmp_path):
    path, name = _reward_file(
        tmp_path,
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1e39\n",
    )
    trainer = RLTrainer(rl_config(path, name, "trainer.val_before_train=false"))
    with pytest.raises(RewardFailureError, match=r"failed on 8 of 8 calls.*out_of_bound"):
        trainer.fit()
    assert trainer.history == []  # no step completed
    assert not (tmp_path / "huggingface").exists()  # no model saved from a broken run
