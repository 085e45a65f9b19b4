"""The reward-source keys (reward_model.judge / remote / mixture / overlap): what
validation refuses, and what the run builds from them."""

from __future__ import annotations

import pytest

from verl.config import ConfigError, load_config
from verl.rewards import RewardManager
from verl.rewards.judge import HttpJudgeBackend, JudgeScorer
from verl.rewards.mixture import MixtureScorer
from verl.rewards.remote import RemoteScorer
from verl.rewards.sources import SourceReward
from verl.trainer.rl.reward_loop import build_overlap, build_training_reward, uses_rules

from .reward_loop_helpers import CharTokenizer


def messages(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    return [p.message for p in info.value.problems]


def test_defaults_are_the_rules_alone():
    cfg = load_config()
    rm = cfg.reward_model
    assert (rm.judge.enable, rm.remote.url, rm.mixture, rm.overlap.num_chunks) == (
        False,
        None,
        {},
        1,
    )
    rules = RewardManager(CharTokenizer())
    assert build_training_reward(cfg, CharTokenizer(), rules) is rules
    assert build_overlap(cfg, rules) is None and uses_rules(cfg)


def test_invalid_source_settings_are_named():
    assert messages(["reward_model.judge.enable=true"]) == [
        "reward_model.judge.backend=local needs reward_model.judge.model_path (a HF causal LM "
        "directory)"
    ]
    assert sorted(
        messages(["reward_model.judge.enable=true", "reward_model.judge.backend=http"])
    ) == [
        "reward_model.judge.backend=http needs reward_model.judge.base_url",
        "reward_model.judge.backend=http needs reward_model.judge.model",
    ]
    (msg,) = messages(["reward_model.remote.url=ftp://x"])
    assert "must be an http(s):// URL" in msg
    (msg,) = messages(["reward_model.mixture={rules: 1.0, critic: 1.0}"])
    assert "names 'critic'" in msg
    (msg,) = messages(["reward_model.mixture={rules: 1.0, judge: 1.0}"])
    assert "weighs 'judge', which is not configured: set reward_model.judge.enable=true" in msg
    (msg,) = messages(
        [
            "reward_model.judge.enable=true",
            "reward_model.judge.model_path=x",
            "reward_model.remote.url=http://127.0.0.1:1/s",
        ]
    )
    assert "judge and remote are all configured" in msg and "{judge: 0.5, remote: 0.5}" in msg
    (msg,) = messages(["reward_model.overlap.num_chunks=4"])
    assert "overlap scores the judge, remote and mixture rewards" in msg


def test_the_run_builds_the_configured_sources(monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", "k")
    cfg = load_config(
        overrides=[
            "reward_model.judge.enable=true",
            "reward_model.judge.backend=http",
            "reward_model.judge.base_url=http://127.0.0.1:1/v1",
            "reward_model.judge.model=m",
            "reward_model.judge.api_key_env=JUDGE_KEY",
            "reward_model.remote.url=http://127.0.0.1:1/score",
            "reward_model.mixture={rules: 0.2, judge: 0.5, remote: 0.3}",
            "reward_model.overlap.num_chunks=2",
            "reward_model.max_failure_rate=0.25",
        ]
    )
    assert not uses_rules(load_config(overrides=["reward_model.remote.url=http://h/s"]))
    rules = RewardManager(CharTokenizer())
    reward = build_training_reward(cfg, CharTokenizer(), rules)
    assert isinstance(reward, SourceReward) and reward.shaper is rules
    assert reward.max_failure_rate == 0.25
    mixture = reward.scorer
    assert isinstance(mixture, MixtureScorer)
    assert {n: w for n, (_, w) in mixture.sources.items()} == {
        "rules": 0.2,
        "judge": 0.5,
        "remote": 0.3,
    }
    judge = mixture.sources["judge"][0]
    assert isinstance(judge, JudgeScorer) and isinstance(judge.backend, HttpJudgeBackend)
    assert judge.backend.poster.settings.headers == {"Authorization": "Bearer k"}
    assert isinstance(mixture.sources["remote"][0], RemoteScorer)
    overlap = build_overlap(cfg, reward)
    assert overlap.num_chunks == 2
    overlap.close()
    reward.close()
