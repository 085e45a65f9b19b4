"""The agent loop's interaction hook on a scripted backend: the environment's reply is a
user turn appended as a template delta (exact ids across it, mask 0 on it), counted in the
metrics; returning None ends the sample; bad interactions are named."""

from __future__ import annotations

import pytest

from verl.rollout.agent_loop import AgentLoop, multi_turn_metrics
from verl.rollout.base import SamplingParams
from verl.tools.calculator import calculator_tool
from verl.tools.interaction import RETRY_MESSAGE, arithmetic_retry, load_interaction

from .conftest import make_batch
from .test_agent_loop import ScriptedGenerator, call, real_ids


def run(tokenizer, texts, scripts, interaction, max_new=1000, **non_tensors):
    batch = make_batch(tokenizer, texts, **non_tensors)
    prompts = [
        row[m.bool()].tolist()
        for row, m in zip(batch.batch["input_ids"], batch.batch["attention_mask"])
    ]
    gen = ScriptedGenerator(tokenizer, prompts, scripts)
    loop = AgentLoop(gen, tokenizer, [calculator_tool()], max_turns=4, interaction=interaction)
    out = loop.run(batch, SamplingParams(n=1, max_new_tokens=max_new, do_sample=False))
    return out, gen, prompts


def test_retry_turn_keeps_ids_and_is_masked(tokenizer):
    # Sample 0 answers wrong, is told to retry, calls the calculator and answers right;
    # sample 1 answers right at once and is not asked again.
    scripts = [["41", call("calculator", expression="6*7"), "42"], ["42"]]
    raw = [[{"role": "user", "content": "6*7?"}], [{"role": "user", "content": "6*7 again?"}]]
    out, gen, prompts = run(
        tokenizer,
        ["6*7?", "6*7 again?"],
        scripts,
        arithmetic_retry,
        raw_prompt=raw,
        ground_truth=["42", "42"],
    )
    assert [len(c) for c in gen.contexts] == [3, 1]
    for i, contexts in enumerate(gen.contexts):
        ids, _ = real_ids(out, i)
        full = prompts[i] + ids
        for k, context in enumerate(contexts):
            assert context == full[: len(context)], f"sample {i} turn {k} re-tokenized"
    ids, mask = real_ids(out, 0)
    model_text = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert model_text == "41<|im_end|>" + call("calculator", expression="6*7") + "42<|im_end|>"
    # The first masked span is the reply: the model closed its turn with <|im_end|>, so the
    # delta is the rest of the closer, the user turn and the next generation prompt.
    flags = mask.tolist()
    start = flags.index(0)
    first_gap = ids[start : flags.index(1, start)]
    assert tokenizer.decode(first_gap) == (
        f"\n<|im_start|>user\n{RETRY_MESSAGE}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert out.non_tensor_batch["num_turns"].tolist() == [3, 1]
    assert out.non_tensor_batch["num_interaction_turns"].tolist() == [1, 0]
    assert out.non_tensor_batch["num_tool_calls"].tolist() == [1, 0]
    roles = [m["role"] for m in out.non_tensor_batch["messages"][0]]
    assert roles == ["assistant", "user", "assistant", "tool", "assistant"]
    info = out.non_tensor_batch["turn_info"][0]
    assert info[0]["feedback"] == RETRY_MESSAGE and info[0]["tool_calls"] == []
    assert info[1]["tool_calls"] == ["calculator"] and info[1]["tool_status"] == ["ok"]
    assert "feedback" not in info[2]
    metrics = multi_turn_metrics(out.non_tensor_batch)
    assert metrics["multi_turn/interaction_turns"] == 1.0
    assert metrics["multi_turn/interaction_turns_mean"] == 0.5
    assert metrics["multi_turn/turns_mean"] == 2.0
    lp = out.batch["rollout_log_probs"][0]
    width = out.batch["responses"].shape[1]
    real = out.batch["attention_mask"][0, -width:].bool()
    assert bool((lp[real][~mask.bool()] == 0).all())


def test_none_ends_the_episode_and_replies_continue_it(tokenizer):
    seen = []

    def judge(messages, *, data_source, ground_truth, extra_info, num_replies):
        seen.append((len(messages), data_source, ground_truth, extra_info, num_replies))
        return None if ground_truth == "stop" else f"again {num_replies}"

    scripts = [["a", "b", "c", "d", "e"], ["x"]]
    out, gen, _ = run(
        tokenizer,
        ["keep going", "stop now"],
        scripts,
        judge,
        raw_prompt=[[{"role": "user", "content": "keep going"}], "stop now"],
        data_source=["game", "game"],
        ground_truth=["go", "stop"],
        extra_info=[{"i": 0}, {"i": 1}],
    )
    # "stop": one turn, one call; "go": replies until max_turns=4 (no reply to the last).
    assert out.non_tensor_batch["num_turns"].tolist() == [4, 1]
    assert out.non_tensor_batch["num_interaction_turns"].tolist() == [3, 0]
    assert [len(c) for c in gen.contexts] == [4, 1]
    go = [s for s in seen if s[2] == "go"]
    assert [s[4] for s in go] == [0, 1, 2]
    # the prompt's message, then the conversation so far: assistant (+ user, assistant)...
    assert [s[0] for s in go] == [2, 4, 6]
    assert go[0][1:4] == ("game", "go", {"i": 0})
    assert [s for s in seen if s[2] == "stop"] == [(2, "game", "stop", {"i": 1}, 0)]
    users = [m["content"] for m in out.non_tensor_batch["messages"][0] if m["role"] == "user"]
    assert users == ["again 0", "again 1", "again 2"]


def test_a_reply_without_room_for_an_answer_ends_the_sample(tokenizer):
    out, _, _ = run(tokenizer, ["q"], [["1", "2"]], lambda m, **kw: "no " * 50, max_new=40)
    assert out.non_tensor_batch["num_turns"].tolist() == [1]
    assert out.non_tensor_batch["num_interaction_turns"].tolist() == [0]
    _, mask = real_ids(out, 0)
    assert bool(mask.all())  # nothing but the model's turn


def test_a_reply_that_is_not_text_is_an_error(tokenizer):
    def bad(messages, **kw):
        return 42

    with pytest.raises(TypeError, match="interaction 'bad' returned int"):
        run(tokenizer, ["q"], [["1", "2"]], bad)


def test_arithmetic_retry_gives_one_retry():
    wrong = [{"role": "user", "content": "6*7?"}, {"role": "assistant", "content": "41"}]
    right = [*wrong, {"role": "user", "content": RETRY_MESSAGE}]
    right.append({"role": "assistant", "content": "The answer is 42."})
    assert arithmetic_retry(wrong, ground_truth="42", num_replies=0) == RETRY_MESSAGE
    assert arithmetic_retry(wrong, ground_truth="42", num_replies=1) is None
    assert arithmetic_retry(right, ground_truth="42", num_replies=0) is None
    assert arithmetic_retry(wrong, ground_truth=None, num_replies=0) is None


def test_load_interaction_names_bad_config(tmp_path):
    assert load_interaction("builtin", "arithmetic_retry") is arithmetic_retry
    with pytest.raises(AttributeError, match=r"built-in interactions: \['arithmetic_retry'\]"):
        load_interaction("builtin", "nope")
    with pytest.raises(FileNotFoundError, match=r"interaction file not found.*multi_turn"):
        load_interaction(str(tmp_path / "env.py"), "judge")
    env = tmp_path / "env.py"
    env.write_text("def judge(messages, **kw):\n    return None\nLIMIT = 3\n")
    assert load_interaction(str(env), "judge")([]) is None
    with pytest.raises(AttributeError, match=r"defines no 'other'.*\['judge'\]"):
        load_interaction(str(env), "other")
    with pytest.raises(TypeError, match=r"'LIMIT' in interaction file .* is a int"):
        load_interaction(str(env), "LIMIT")
