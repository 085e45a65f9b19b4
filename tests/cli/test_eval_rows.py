"""`verl eval` on generations files a hand may write: a plain string is one response (not a
list of characters), and prompts with different numbers of responses each weigh one."""

from __future__ import annotations

import json

import pytest

from verl import cli
from verl.trainer.rl.evaluation import evaluate_rows, format_report, score_rows


def test_a_string_is_one_response(tmp_path, capsys):
    path = tmp_path / "gens.jsonl"
    rows = [
        {"data_source": "arithmetic", "ground_truth": "12", "responses": "12"},
        {"data_source": "arithmetic", "ground_truth": "5", "responses": ["5", "6"]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "m.json"
    assert cli.main(["eval", "--generations", str(path), "--json", str(out)]) == 0
    overall = json.loads(out.read_text())["overall"]
    # row 0: one response "12", right (read as "1", "2" it was two wrong ones)
    # row 1: "5" right, "6" wrong -> mean 0.5; overall mean over prompts (1 + 0.5) / 2
    assert (overall["n"], overall["n_max"]) == (1, 2)
    assert overall["acc/mean@1"] == pytest.approx(0.75)
    assert overall["pass@1"] == pytest.approx(0.75)
    assert score_rows([{"data_source": "arithmetic", "ground_truth": "7", "responses": "77"}])[0][
        "accs"
    ] == [0.0]  # "77" is one wrong answer, not two right "7"s


def test_different_numbers_of_responses_per_prompt():
    rows = [
        # 4 responses, 1 right: mean 1/4, pass@1 1/4, pass@2 = 1 - C(3,2)/C(4,2) = 1/2
        {"data_source": "a", "accs": [1.0, 0.0, 0.0, 0.0], "scores": [1.0, 0.0, 0.0, 0.0]},
        # 2 responses, both right: mean 1, pass@1 1, pass@2 1
        {"data_source": "b", "accs": [1.0, 1.0], "scores": [0.5, 0.5]},
        # 3 responses, 1 right: mean 1/3, pass@1 1/3, pass@2 = 1 - C(2,2)/C(3,2) = 2/3
        {"data_source": "b", "accs": [0.0, 1.0, 0.0], "scores": [0.0, 1.0, 0.0]},
    ]
    report = evaluate_rows(rows)
    overall = report["overall"]
    assert (overall["prompts"], overall["n"], overall["n_max"]) == (3, 2, 4)
    assert overall["acc/mean@2"] == pytest.approx((1 / 4 + 1 + 1 / 3) / 3)
    assert overall["score/mean@2"] == pytest.approx((1 / 4 + 0.5 + 1 / 3) / 3)
    assert overall["pass@1"] == pytest.approx((1 / 4 + 1 + 1 / 3) / 3)
    assert overall["pass@2"] == pytest.approx((1 / 2 + 1 + 2 / 3) / 3)
    b = report["by_source"]["b"]
    assert (b["n"], b["n_max"]) == (2, 3)
    assert b["acc/mean@2"] == pytest.approx((1 + 1 / 3) / 2)
    assert b["pass@2"] == pytest.approx((1 + 2 / 3) / 2)
    a = report["by_source"]["a"]
    assert (a["n"], a["n_max"], a["pass@2"]) == (4, 4, pytest.approx(0.5))
    # one set of columns for every group (a's own n is 4, the report's 2)
    table = format_report(report).splitlines()
    assert table[0].split()[3:] == ["acc/mean@2", "score/mean@2", "pass@1", "pass@2"]
    assert table[1].split()[:3] == ["a", "1", "4"]
    assert table[2].split()[:3] == ["b", "2", "2-3"]
    assert table[3].split()[:3] == ["overall", "3", "2-4"]
    # k above one row's n names that row
    with pytest.raises(ValueError, match=r"k=3: .* n=2 .*\(row 1, data_source 'b', has 2\)"):
        evaluate_rows(rows, ks=[3])


def test_rows_whose_columns_disagree_are_named():
    with pytest.raises(ValueError, match=r"row 1 \(a\): 3 responses but 2 accs"):
        evaluate_rows(
            [
                {"data_source": "a", "responses": ["x"], "accs": [1.0], "scores": [1.0]},
                {
                    "data_source": "a",
                    "responses": ["x", "y", "z"],
                    "accs": [1, 0],
                    "scores": [1, 0],
                },
            ]
        )
    with pytest.raises(ValueError, match=r"row 0 \(a\): 'accs' must be numbers"):
        evaluate_rows([{"data_source": "a", "accs": ["right"], "scores": [1.0]}])
    with pytest.raises(ValueError, match=r"row 0 \(a\) has no responses"):
        evaluate_rows([{"data_source": "a", "accs": [], "scores": []}])
