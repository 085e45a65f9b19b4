"""The LLM judge: its parser on good and malformed verdicts, its template, the judge end to
end against a scripted OpenAI-compatible endpoint on 127.0.0.1 (deterministic), and a tiny
local model through the native rollout engine (plumbing)."""

from __future__ import annotations

import pytest
import torch

from verl.rewards import RewardFailureError
from verl.rewards.http import HttpSettings
from verl.rewards.judge import (
    HttpJudgeBackend,
    JudgeParser,
    JudgeScorer,
    ScriptedJudgeBackend,
    load_template,
)
from verl.rewards.sources import SourceReward

from .reward_loop_helpers import CharTokenizer, JsonServer, gen_batch, scripted_judge


@pytest.mark.parametrize(
    "reply, score",
    [
        ("VERDICT: correct", 1.0),
        ("VERDICT: incorrect", 0.0),
        ("verdict:   CORRECT.", 1.0),
        ("**VERDICT:** yes", 1.0),
        ("first VERDICT: correct, on reflection\nVERDICT: incorrect", 0.0),  # the last counts
        ("VERDICT: wrong", 0.0),
    ],
)
def test_verdict_parser_reads_verdicts(reply, score):
    assert JudgeParser("verdict")(reply) == (score, None)


@pytest.mark.parametrize("reply", ["I think it is right", "VERDICT: maybe", "", None])
def test_verdict_parser_reports_malformed_replies(reply):
    value, why = JudgeParser("verdict")(reply)
    assert value is None and why


def test_score_parser_scales_and_bounds():
    parser = JudgeParser("score", max_score=10)
    assert parser("SCORE: 7") == (0.7, None)
    assert parser("Score: 10.0") == (1.0, None)
    assert parser("SCORE: 11")[0] is None and "outside [0, 10]" in parser("SCORE: 11")[1]
    assert parser("no score here")[0] is None


def test_custom_pattern_with_named_group():
    parser = JudgeParser(pattern=r"GRADE=(?P<score>\d)", max_score=4)
    assert parser("GRADE=3") == (0.75, None)
    assert JudgeParser(pattern=r"\[\[(?P<verdict>\w+)\]\]")("[[pass]]") == (1.0, None)
    with pytest.raises(ValueError, match="named group 'verdict' or 'score'"):
        JudgeParser(pattern=r"GRADE=(\d)")
    with pytest.raises(ValueError, match="not a valid regex"):
        JudgeParser(pattern=r"(?P<score>")


def test_template_from_string_file_and_errors(tmp_path):
    assert "{response}" in load_template(None)
    assert "SCORE:" in load_template(None, "score", 5) and "to 5" in load_template(None, "score", 5)
    assert load_template("Q={question} R={response}") == "Q={question} R={response}"
    path = tmp_path / "judge.txt"
    path.write_text("grade {response} vs {reference}")
    assert load_template(str(path)) == "grade {response} vs {reference}"
    with pytest.raises(ValueError, match=r"names \['answer'\]"):
        load_template("{answer} {response}")
    with pytest.raises(ValueError, match=r"no \{response\} field"):
        load_template("{question} only")


def test_judge_scores_with_the_prompt_filled():
    backend = ScriptedJudgeBackend(
        lambda p: "VERDICT: correct" if "A: 42" in p or "is 42" in p else "VERDICT: no"
    )
    scorer = JudgeScorer(
        backend, CharTokenizer(), "Q: {question}\nA: {response}\nRef: {reference}", batch_size=2
    )
    batch = gen_batch(["it is 42", "it is 7", "42!"], [42, 42, 42], ["what?", "q2", "q3"])
    scores = scorer.score(batch)
    assert scores.scores.tolist() == [1.0, 0.0, 1.0]
    assert backend.prompts[0] == "Q: what?\nA: it is 42\nRef: 42"
    assert len(scores.latencies) == 2  # batches of 2 prompts: 2 calls


def test_http_judge_end_to_end_with_metrics_and_parse_failures():
    responses = ["the answer is 5", "the answer is 6", "MALFORMED reply", "5"]
    with JsonServer(scripted_judge) as server:
        backend = HttpJudgeBackend(f"{server.url}/v1", "judge-model", HttpSettings(timeout_s=5))
        reward = SourceReward(JudgeScorer(backend, CharTokenizer()), max_failure_rate=0.5)
        scores, metrics, extras = reward(gen_batch(responses, [5, 5, 5, 5]))
        reward.close()
        assert server.requests[0][1]["model"] == "judge-model"
        assert server.requests[0][1]["temperature"] == 0.0
    assert scores.sum(-1).tolist() == [1.0, 0.0, 0.0, 1.0]
    assert extras["failure"].tolist() == [None, None, "judge/parse_failures", None]
    assert metrics["judge/parse_failures"] == 1.0
    assert metrics["judge/mean_score"] == pytest.approx(2 / 3)
    assert metrics["judge/latency_s_mean"] > 0
    assert extras["acc"].tolist() == [1.0, 0.0, 0.0, 1.0]


def test_parse_failures_above_the_limit_stop_the_run():
    backend = ScriptedJudgeBackend(lambda p: "no verdict at all")
    reward = SourceReward(JudgeScorer(backend, CharTokenizer()), max_failure_rate=0.5)
    with pytest.raises(RewardFailureError, match=r"judge failed on 3 of 3.*judge/parse_failures"):
        reward(gen_batch(["a", "b", "c"], [1, 2, 3]))


def test_http_judge_endpoint_failure_is_counted_by_kind():
    with JsonServer(lambda path, body: (500, {"error": "down"})) as server:
        settings = HttpSettings(timeout_s=5, max_retries=1, backoff_s=0.0)
        backend = HttpJudgeBackend(server.url, "m", settings)
        scores = JudgeScorer(backend, CharTokenizer()).score(gen_batch(["x"], [1]))
        backend.close()
        assert len(server.requests) == 2  # one retry of a 500
    assert scores.failures.tolist() == ["judge/http_status"]


def test_local_judge_through_the_native_engine(tmp_path):
    """Plumbing: a tiny random model generates a reply for each prompt, greedily (the same
    reply twice), and unreadable replies are parse failures, not crashes."""
    from verl.models.tiny import save_tiny_model_dir
    from verl.trainer.rl.reward_loop import LocalJudgeBackend

    path = save_tiny_model_dir(tmp_path / "judge", hidden_size=32, num_layers=1)
    backend = LocalJudgeBackend.from_path(str(path), device="cpu", max_new_tokens=5)
    torch.manual_seed(0)
    replies, latencies = backend.complete(["grade this: 1+1=2", "grade: 3"])
    again, _ = backend.complete(["grade this: 1+1=2", "grade: 3"])
    assert [r.text for r in replies] == [r.text for r in again]  # greedy
    assert all(isinstance(r.text, str) for r in replies) and len(latencies) == 1
    reward = SourceReward(JudgeScorer(backend, CharTokenizer()), max_failure_rate=None)
    _, metrics, extras = reward(gen_batch(["2", "3"], [2, 3]))
    assert metrics["judge/parse_failures"] + (extras["failure"] == None).sum() == 2  # noqa: E711
