"""Upstream's scorer module paths (``verl.utils.reward_score.*``) import with upstream's call
signatures and return values, backed by the native scorers; ``math_dapo`` and ``aime*``
data sources have a scorer; ``main_eval`` calls a reward function by position, as
upstream's evaluation does; ``--config-name ppo_megatron_trainer`` says what runs instead."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl.rewards.scorers import get_scorer, known_data_sources
from verl.rewards.scorers.math_dapo import compute_score as dapo_native
from verl.utils.reward_score import (
    default_compute_score,
    gsm8k,
    math,
    math_dapo,
    math_reward,
    prime_math,
)


def test_gsm8k_module_signature_and_values():
    assert gsm8k.compute_score("so #### 72", "72") == 1.0
    assert gsm8k.compute_score("so #### 71", "72", format_score=0.1) == 0.1
    assert gsm8k.compute_score("no marker", "72", format_score=0.1) == 0.0
    assert gsm8k.compute_score("it is 72", "72", method="flexible", score=2.0) == 2.0
    assert gsm8k.extract_solution("x #### 3") == "3"


def test_math_modules_signature_and_values():
    for module in (math, math_reward):
        assert module.compute_score("thus \\boxed{\\frac{1}{2}}", "0.5") == 1.0
        assert module.compute_score("thus \\boxed{3}", "4") == 0.0
    assert math_reward.last_boxed_only_string("a \\boxed{x+1} b") == "\\boxed{x+1}"
    assert math_reward.remove_boxed("\\boxed{x+1}") == "x+1"
    assert prime_math.compute_score("\\boxed{2}", "2") == (True, True, "2")
    assert prime_math.compute_score("no box", "2")[:2] == (False, False)


@pytest.mark.parametrize(
    "response, truth, score",
    [
        ("...\nAnswer: 42", "42", 1.0),
        ("...\nAnswer: $x = 42$", "42", 1.0),
        ("...\nanswer: 41", "42", -1.0),
        ("the result is \\boxed{\\dfrac{3}{4}}", "0.75", 1.0),
        ("no final answer", "42", -1.0),
        ("...\nAnswer: 1,000", "1000", 1.0),
    ],
)
def test_math_dapo_scores_one_or_minus_one(response, truth, score):
    result = math_dapo.compute_score(response, truth)
    assert result["score"] == score and result["acc"] is (score == 1.0)
    assert dapo_native(response, truth)["score"] == score


def test_math_dapo_strict_box_verify():
    assert math_dapo.compute_score("x \\boxed{42}", "42", strict_box_verify=True)["score"] == 1.0
    assert math_dapo.compute_score("Answer: 42", "42", strict_box_verify=True)["score"] == -1.0
    assert math_dapo.normalize_final_answer("\\boxed{\\text{5}}") == "5"


@pytest.mark.parametrize("source", ["math_dapo", "aime24", "aime2025", "aime_2026_i"])
def test_dapo_data_sources_have_a_scorer(source):
    assert get_scorer(source)("Answer: 7", "7", None)["score"] == 1.0
    result = default_compute_score(source, "Answer: 7", "8")
    assert result["score"] == -1.0
    assert "math_dapo" in known_data_sources()


def test_default_compute_score_takes_upstreams_arguments():
    out = default_compute_score(
        "openai/gsm8k", "#### 3", "3", None, sandbox_fusion_url=None, memory_limit_mb=1024
    )
    assert out["score"] == 1.0
    with pytest.raises(ValueError, match="no reward scorer for data_source='nope'"):
        default_compute_score("nope", "x", "y")


def test_main_eval_calls_a_reward_function_by_position(tmp_path, capsys):
    """Upstream's recipe reward function names its parameters as it likes and takes three
    positional arguments (upstream calls reward_fn(data_source, response, ground_truth))."""
    from verl.cli import upstream_eval as main_eval

    reward = tmp_path / "reward.py"
    reward.write_text(
        "def reward_func(source, response, answer):\n"
        "    return 1.0 if response.strip().endswith(answer) else 0.0\n"
    )
    rows = [
        {"data_source": "mine", "responses": ["= 5", "= 4"], "reward_model": {"ground_truth": "5"}}
    ]
    path = tmp_path / "gens.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    argv = [
        f"data.path={path}",
        f"custom_reward_function.path={reward}",
        "custom_reward_function.name=reward_func",
    ]
    assert main_eval.main(argv) == 0, capsys.readouterr().err
    assert "test_score/mine: 0.5000" in capsys.readouterr().out


def test_megatron_config_name_says_what_runs_instead(capsys):
    from verl.cli import ppo as main_ppo

    assert main_ppo.main(["--config-name", "ppo_megatron_trainer", "--validate-only"]) == 2
    err = capsys.readouterr().err
    assert "no Megatron engine" in err and "strategy=fsdp2" in err
