"""The arithmetic generator's other forms: negative answers, operators as words, phrasings;
and the scorer on them."""

from __future__ import annotations

import pytest

from verl.config import ConfigError, load_config
from verl.data.arithmetic import (
    PHRASINGS,
    make_arithmetic_rows,
    problem_space_size,
    sample_problems,
)
from verl.rewards.scorers.arithmetic import compute_score


def test_negative_subtraction_covers_both_orders():
    problems = sample_problems(100, 1, ["-"], seed=0, negative=True)
    assert len(set(problems)) == 100 == problem_space_size(1, ["-"], negative=True)
    answers = {a - b for a, _, b in problems}
    assert min(answers) == -9 and max(answers) == 9
    assert problem_space_size(1, ["-"]) == 55  # without: larger operand first


def test_rows_carry_negative_ground_truths_that_score():
    rows = make_arithmetic_rows(40, 1, ["-"], seed=3, negative=True)
    negative = [r for r in rows if r["reward_model"]["ground_truth"].startswith("-")]
    assert negative, "some answers must be negative"
    truth = negative[0]["reward_model"]["ground_truth"]
    assert compute_score(f"The answer is {truth}.", truth)["score"] == 1.0
    assert compute_score(f"The answer is {truth[1:]}.", truth)["score"] == 0.0


def test_phrasings_spell_operators_as_words_and_keep_the_problems():
    plain = make_arithmetic_rows(30, 1, ["+", "-", "*"], seed=5)
    mixed = make_arithmetic_rows(30, 1, ["+", "-", "*"], seed=5, phrasings=list(PHRASINGS))
    # the phrasing draw does not move the problem draw
    assert [r["extra_info"]["expression"] for r in plain] == [
        r["extra_info"]["expression"] for r in mixed
    ]
    assert {r["extra_info"]["phrasing"] for r in plain} == {"question"}
    assert {r["extra_info"]["phrasing"] for r in mixed} == set(PHRASINGS)
    for row in mixed:
        info, text = row["extra_info"], row["prompt"][0]["content"]
        word = {"+": "plus", "-": "minus", "*": "times"}[info["op"]]
        spelled = f"{info['a']} {word} {info['b']}"
        if info["phrasing"] in ("words", "calculate"):
            assert spelled in text
        else:
            assert info["expression"] in text
    row = next(r for r in mixed if r["extra_info"]["phrasing"] == "words")
    a = row["extra_info"]["a"]
    assert row["prompt"][0]["content"].startswith(f"What is {a} ")


def test_unknown_phrasing_and_phrasings_of_other_styles_are_refused():
    with pytest.raises(ValueError, match=r"phrasings=.*'riddle'.*choose one or more"):
        make_arithmetic_rows(2, 1, ["+"], phrasings=["riddle"])
    with pytest.raises(ValueError, match="apply to chat prompts"):
        make_arithmetic_rows(2, 1, ["+"], prompt_style="plain", phrasings=["words"])


def test_config_keys_reach_the_builtin_data(tmp_path):
    from verl.data.io import read_records
    from verl.trainer.lifecycle.setup import prepare_data_files

    cfg = load_config(
        overrides=[
            "data.arithmetic.ops=[-]",
            "data.arithmetic.negative=true",
            "data.arithmetic.phrasings=[words,compute]",
            "data.arithmetic.train_size=50",
            "data.arithmetic.val_size=10",
        ]
    )
    train, _ = prepare_data_files(cfg, tmp_path)
    rows = [record.data for record in read_records(train[0]).records]
    assert {r["extra_info"]["phrasing"] for r in rows} == {"words", "compute"}
    assert any(int(r["reward_model"]["ground_truth"]) < 0 for r in rows)
    with pytest.raises(ConfigError, match=r"data\.arithmetic\.phrasings"):
        load_config(overrides=["data.arithmetic.phrasings=[poem]"])
