"""The agent loop on a scripted backend: exact ids across turns (prefix check), masks,
tool failures, timeouts, budgets and concurrency. The real loop runs; only the model's
turns are scripted (tests/rollout/test_agent_loop_native.py drives the native engine)."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from verl.rollout import SamplingParams
from verl.rollout.agent_loop import AgentLoop, TurnOutput, multi_turn_metrics
from verl.tools import Tool, tool_from_function
from verl.tools.calculator import calculator_tool

from .conftest import make_batch


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class ScriptedGenerator:
    """Turn ``k`` of the sample whose prompt is ``prompt`` is ``script[prompt][k]``; a turn
    without a tool call ends with eos. Records every context it is given."""

    def __init__(self, tokenizer, prompts: list[list[int]], scripts: list[list[str]], delay=0.0):
        self.tokenizer = tokenizer
        self.prompts = prompts
        self.scripts = scripts
        self.delay = delay
        self.contexts: list[list[list[int]]] = [[] for _ in prompts]
        self.batch_sizes: list[int] = []
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate_turns(self, contexts, budgets, params):
        self.batch_sizes.append(len(contexts))
        time.sleep(self.delay)
        outs = []
        for context, budget in zip(contexts, budgets):
            (i,) = [i for i, p in enumerate(self.prompts) if context[: len(p)] == p]
            turn = len(self.contexts[i])
            self.contexts[i].append(list(context))
            text = self.scripts[i][turn]
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            if "</tool_call>" not in text or text.endswith("<|im_end|>"):
                ids = self.tokenizer.encode(
                    text.removesuffix("<|im_end|>"), add_special_tokens=False
                )
                ids.append(self.eos)
            ids = ids[:budget]
            outs.append(TurnOutput(ids, [-0.01 * (k + 1) for k in range(len(ids))]))
        return outs


def run_loop(tokenizer, texts, scripts, tools, max_new=1000, delay=0.0, **loop_kwargs):
    batch = make_batch(tokenizer, texts)
    prompts = [
        row[m.bool()].tolist()
        for row, m in zip(batch.batch["input_ids"], batch.batch["attention_mask"])
    ]
    gen = ScriptedGenerator(tokenizer, prompts, scripts, delay=delay)
    loop = AgentLoop(gen, tokenizer, tools, **loop_kwargs)
    out = loop.run(batch, SamplingParams(n=1, max_new_tokens=max_new, do_sample=False))
    return out, gen, prompts


def real_ids(out, row):
    width = out.batch["responses"].shape[1]
    real = out.batch["attention_mask"][row, -width:].bool()
    return out.batch["responses"][row][real].tolist(), out.batch["response_mask"][row][real]


def test_every_turn_context_starts_with_all_earlier_ids(tokenizer):
    scripts = [
        [call("calculator", expression="12*34"), call("calculator", expression="408+1"), "409"],
        ["no tools needed"],
    ]
    out, gen, prompts = run_loop(
        tokenizer, ["what is 12*34+1", "hello"], scripts, [calculator_tool()]
    )
    assert [len(c) for c in gen.contexts] == [3, 1]
    for i, contexts in enumerate(gen.contexts):
        ids, _ = real_ids(out, i)
        full = prompts[i] + ids
        for k, context in enumerate(contexts):
            assert context == full[: len(context)], f"sample {i} turn {k} re-tokenized"
            if k:
                assert len(context) > len(contexts[k - 1])
    assert out.non_tensor_batch["num_turns"].tolist() == [3, 1]
    assert out.non_tensor_batch["num_tool_calls"].tolist() == [2, 0]
    tool_messages = [m for m in out.non_tensor_batch["messages"][0] if m["role"] == "tool"]
    assert [m["content"] for m in tool_messages] == ["408", "409"]


def test_masks_split_model_and_tool_tokens(tokenizer):
    scripts = [[call("calculator", expression="6*7"), "the answer is 42"]]
    out, _, _ = run_loop(tokenizer, ["6*7?"], scripts, [calculator_tool()])
    ids, mask = real_ids(out, 0)
    model_text = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    tool_text = tokenizer.decode([t for t, m in zip(ids, mask) if not m])
    assert model_text == call("calculator", expression="6*7") + "the answer is 42<|im_end|>"
    # The turn stopped on </tool_call>, so the template's closer comes first.
    assert tool_text == "<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    # Contiguous: model turn, tool delta, model turn; the trajectory ends on model tokens.
    changes = np.flatnonzero(np.diff(mask.numpy())).tolist()
    assert len(changes) == 2 and bool(mask[-1])
    lp = out.batch["rollout_log_probs"][0]
    width = out.batch["responses"].shape[1]
    real = out.batch["attention_mask"][0, -width:].bool()
    assert bool((lp[real][~mask.bool()] == 0).all()) and bool((lp[real][mask.bool()] < 0).all())
    assert int(out.batch["attention_mask"][0, -width:].sum()) == len(ids)
    assert int(out.batch["response_mask"][0].sum()) == int(mask.sum())


def test_a_turn_closed_by_the_model_is_not_closed_twice(tokenizer):
    """Qwen style: the model ends its tool-call turn with <|im_end|> itself; the appended
    delta then holds only the rest of the template's closer."""
    scripts = [[call("calculator", expression="6*7") + "<|im_end|>", "42"]]
    out, _, _ = run_loop(tokenizer, ["6*7?"], scripts, [calculator_tool()])
    ids, mask = real_ids(out, 0)
    tool_text = tokenizer.decode([t for t, m in zip(ids, mask) if not m])
    assert tool_text == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    text = tokenizer.decode(ids)
    assert text.count("<|im_end|>") == 3  # model turn, tool message, final turn


def test_failing_tools_become_error_messages_and_metrics(tokenizer):
    def boom(x: int) -> str:
        """Always fails.

        Args:
            x: anything
        """
        raise RuntimeError("kaput")

    def number(x: int) -> int:
        """Returns a number, not text.

        Args:
            x: anything
        """
        return x

    scripts = [
        [
            call("boom", x=1)
            + call("number", x=2)
            + call("nope")
            + "<tool_call>{not json</tool_call>",
            "done",
        ]
    ]
    tools = [tool_from_function(boom), tool_from_function(number)]
    out, _, _ = run_loop(tokenizer, ["try"], scripts, tools)
    contents = [m["content"] for m in out.non_tensor_batch["messages"][0] if m["role"] == "tool"]
    assert len(contents) == 4 and all(c.startswith("Error: ") for c in contents)
    assert "kaput" in contents[0] and "returned int" in contents[1]
    assert "unknown tool 'nope'" in contents[2] and "not valid JSON" in contents[3]
    metrics = multi_turn_metrics(out.non_tensor_batch)
    assert metrics["multi_turn/tool_errors"] == 4 and metrics["multi_turn/tool_calls"] == 4
    assert metrics["multi_turn/turns_mean"] == 2


def test_hanging_tool_is_stopped_by_its_timeout(tokenizer):
    release = threading.Event()

    def hang() -> str:
        """Never returns on its own."""
        release.wait(60)
        return "late"

    hang.schema = {
        "type": "function",
        "function": {"name": "hang", "description": "hangs", "parameters": {"type": "object"}},
    }
    scripts = [[call("hang"), "gave up"], [call("calculator", expression="1+1"), "2"]]
    try:
        start = time.monotonic()
        out, _, _ = run_loop(
            tokenizer,
            ["wait", "add"],
            scripts,
            [tool_from_function(hang), calculator_tool()],
            tool_timeout=0.3,
        )
        elapsed = time.monotonic() - start
    finally:
        release.set()
    assert elapsed < 5
    assert out.non_tensor_batch["num_tool_timeouts"].tolist() == [1, 0]
    assert out.non_tensor_batch["num_turns"].tolist() == [2, 2]
    hung = next(m for m in out.non_tensor_batch["messages"][0] if m["role"] == "tool")
    assert "timed out after 0.3 s" in hung["content"]
    # per-turn info for the reward: each model turn's tools and how each call ended
    info = out.non_tensor_batch["turn_info"]
    assert [t["tool_calls"] for t in info[0]] == [["hang"], []]
    assert info[0][0]["tool_status"] == ["timeout"]
    assert info[1][0]["tool_status"] == ["ok"] and "tool_status" not in info[1][1]
    assert all(t["model_tokens"] > 0 for t in info[0] + info[1])


def test_a_long_sample_does_not_hold_the_batch(tokenizer):
    """One sample of 5 turns (4 slow tool calls) and seven of 1 turn: the batch takes about
    the long sample's time, and later rounds generate only for the sample still running."""

    def slow(x: int) -> str:
        """Slow echo.

        Args:
            x: a number
        """
        time.sleep(0.2)
        return str(x)

    long_script = [call("slow", x=k) for k in range(4)] + ["finished"]
    texts = [f"question {k}" for k in range(8)]
    tools = [tool_from_function(slow)]

    start = time.monotonic()
    run_loop(tokenizer, texts[:1], [long_script], tools, delay=0.05, max_turns=5)
    alone = time.monotonic() - start

    start = time.monotonic()
    out, gen, _ = run_loop(
        tokenizer, texts, [long_script] + [["short"]] * 7, tools, delay=0.05, max_turns=5
    )
    together = time.monotonic() - start
    assert gen.batch_sizes == [8, 1, 1, 1, 1]
    assert out.non_tensor_batch["num_turns"].tolist() == [5] + [1] * 7
    # 5x the batch would be ~5 s; a loaded machine adds overhead, not whole turns
    assert together < 2.0 * alone, (together, alone)


def test_tool_calls_of_a_round_run_at_the_same_time(tokenizer):
    """Eight samples call a tool in the same round: all eight calls are in flight together
    (a barrier of 8 only opens if they are), so the round waits for one call, not eight."""
    barrier = threading.Barrier(8, timeout=10)
    passed: list[int] = []

    def meet(x: int) -> str:
        """Wait for the other calls.

        Args:
            x: a number
        """
        barrier.wait()  # raises BrokenBarrierError if the calls ran one after another
        passed.append(x)
        return str(x)

    texts = [f"question {k}" for k in range(8)]
    run_loop(
        tokenizer, texts, [[call("meet", x=k), "ok"] for k in range(8)], [tool_from_function(meet)]
    )
    assert sorted(passed) == list(range(8))


def test_budget_and_tool_response_limits(tokenizer):
    def long_text() -> str:
        """A long result."""
        return "word " * 500

    long_text.schema = {
        "type": "function",
        "function": {"name": "long_text", "description": "", "parameters": {"type": "object"}},
    }
    scripts = [[call("long_text"), "ok"]]
    out, _, _ = run_loop(
        tokenizer, ["go"], scripts, [tool_from_function(long_text)], max_tool_response_tokens=8
    )
    tool = next(m for m in out.non_tensor_batch["messages"][0] if m["role"] == "tool")
    assert tool["content"].endswith("...(truncated)") and len(tool["content"]) < 80

    # A tool result that leaves no room for another model token ends the sample before it.
    first = len(tokenizer.encode(call("calculator", expression="1+1"), add_special_tokens=False))
    out, gen, _ = run_loop(
        tokenizer, ["go"], [[call("calculator", expression="1+1"), "2"]], [calculator_tool()],
        max_new=first + 5,
    )  # fmt: skip
    ids, mask = real_ids(out, 0)
    assert len(gen.contexts[0]) == 1 and len(ids) == first and bool(mask.all())
    assert [m["role"] for m in out.non_tensor_batch["messages"][0]] == ["assistant"]

    # max_turns: the last turn's call is not run.
    out, gen, _ = run_loop(
        tokenizer,
        ["go"],
        [[call("calculator", expression="1+1")] * 3],
        [calculator_tool()],
        max_turns=2,
    )
    assert out.non_tensor_batch["num_turns"].tolist() == [2]
    assert out.non_tensor_batch["num_tool_calls"].tolist() == [1]


def test_bad_settings_are_named(tokenizer):
    gen = ScriptedGenerator(tokenizer, [], [])
    with pytest.raises(ValueError, match="max_turns=0"):
        AgentLoop(gen, tokenizer, [], max_turns=0)
    with pytest.raises(ValueError, match="tool_timeout"):
        AgentLoop(gen, tokenizer, [], tool_timeout=0)
    tool = calculator_tool()
    with pytest.raises(ValueError, match="two tools are named 'calculator'"):
        AgentLoop(gen, tokenizer, [tool, tool])
    with pytest.raises(ValueError, match="schema names the function"):
        Tool(name="calc", schema=tool.schema, fn=tool.fn)
