"""Agent programs as rollouts: the OpenAI endpoint with the ``openai`` client, exact ids
across turns, log-probs against the trainer's, failures, keys and clean shutdown."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np
import openai
import pytest
import torch
from openai import OpenAI

from verl.kernels.torch_functional import compute_response_log_probs
from verl.protocol import DataProto
from verl.rewards.results import ERROR
from verl.rollout import SamplingParams, build_rollout
from verl.rollout.agent_loop import TurnOutput
from verl.rollout.agent_program import AgentProgramRollout
from verl.rollout.agent_rewards import AgentRewardManager, agent_program_metrics
from verl.rollout.agent_runs import load_agent

WIDTH = 96  # prompt width: room for an agent's own system message


def chat_batch(tokenizer, questions: list[str], answers: list[str] | None = None) -> DataProto:
    """Prompts as the dataset gives them: chat-templated ids left-padded, ``raw_prompt``."""
    messages = [[{"role": "user", "content": q}] for q in questions]
    ids = torch.full((len(questions), WIDTH), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(questions), WIDTH), dtype=torch.long)
    for row, m in enumerate(messages):
        text = tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
        row_ids = tokenizer.encode(text, add_special_tokens=False)
        ids[row, WIDTH - len(row_ids) :] = torch.tensor(row_ids)
        mask[row, WIDTH - len(row_ids) :] = 1
    raw = np.empty(len(questions), dtype=object)
    for row, m in enumerate(messages):
        raw[row] = m
    non = {"raw_prompt": raw, "data_source": np.array(["arithmetic"] * len(questions), object)}
    non["ground_truth"] = np.array(answers or ["0"] * len(questions), dtype=object)
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask},
        non_tensors=non,
        meta_info={"step": 3},
    )


def agent_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("verl-")]


class Scripted:
    """A TurnGenerator answering every context with ``reply(context)`` (log-prob -0.25
    per token), recording each call's batch size."""

    def __init__(self, reply):
        self.reply = reply
        self.batches: list[int] = []

    def generate_turns(self, contexts, budgets, params):
        self.batches.append(len(contexts))
        outs = []
        for context, budget in zip(contexts, budgets):
            ids = list(self.reply(context))[:budget]
            outs.append(TurnOutput(ids, [-0.25 - 0.01 * i for i in range(len(ids))]))
        return outs


@pytest.fixture
def engine(model, tokenizer):
    return build_rollout("native", model, tokenizer)


# ---------------------------------------------------------------------------- the endpoint
def test_chat_and_completions_through_the_openai_client(engine, tokenizer):
    seen: dict[str, object] = {}

    def agent(base_url, api_key, task):
        client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        seen["models"] = [m.id for m in client.models.list()]
        chat = client.chat.completions.create(
            model="policy",
            messages=task["messages"],
            max_tokens=6,
            logprobs=True,
            extra_body={"return_token_ids": True},
        )
        seen["chat"] = chat
        chunks = list(
            client.chat.completions.create(
                model="policy",
                messages=task["messages"],
                max_tokens=5,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        seen["chat_stream"] = chunks
        seen["completion"] = client.completions.create(
            model="policy", prompt="1+2=", max_tokens=4, logprobs=1
        )
        seen["completion_stream"] = list(
            client.completions.create(model="policy", prompt="1+2=", max_tokens=4, stream=True)
        )
        try:  # alternatives are not reported: refused, not answered with empty lists
            client.chat.completions.create(
                model="policy", messages=task["messages"], logprobs=True, top_logprobs=3
            )
        except openai.BadRequestError as exc:
            seen["top_logprobs_refused"] = str(exc)
        return 0.5

    rollout = AgentProgramRollout(engine, tokenizer, agent, timeout_s=60)
    try:
        out = rollout.run(chat_batch(tokenizer, ["1+2="]), SamplingParams(n=1, max_new_tokens=8))
        assert out.non_tensor_batch["agent_status"].tolist() == ["ok"]
        assert out.non_tensor_batch["agent_requests"].tolist() == [4]
        assert out.non_tensor_batch["extra_info"][0]["agent_reward"] == 0.5
    finally:
        rollout.close()
    assert seen["models"] == ["policy"]
    chat = seen["chat"]
    choice = chat.choices[0]
    ids = choice.token_ids  # returned with return_token_ids, as vLLM's server does
    assert 1 <= len(ids) <= 6 and chat.usage.completion_tokens == len(ids)
    assert choice.message.role == "assistant"
    assert choice.message.content == tokenizer.decode(ids, skip_special_tokens=True)
    assert chat.usage.prompt_tokens == len(chat.prompt_token_ids)
    assert tokenizer.decode(chat.prompt_token_ids).endswith("<|im_start|>assistant\n")
    assert choice.finish_reason in ("stop", "length")
    assert len(choice.logprobs.content) == len(ids)
    assert all(t.logprob <= 0 for t in choice.logprobs.content)
    # streaming: a role chunk, text chunks that add up, the finish reason, then the usage
    chunks = seen["chat_stream"]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert len(finish) == 1 and chunks[-1].usage.completion_tokens >= 1
    assert not chunks[-1].choices
    assert isinstance(text, str)
    completion = seen["completion"]
    assert completion.object == "text_completion"
    lp = completion.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == completion.usage.completion_tokens
    assert "".join(lp.tokens) == tokenizer.decode(
        tokenizer.encode("".join(lp.tokens), add_special_tokens=False)
    )
    assert rollout.endpoint.counters["top_logprobs_unavailable"] == 1  # the logprobs=1 above
    assert "top_logprobs=3" in seen["top_logprobs_refused"]
    streamed = "".join(c.choices[0].text for c in seen["completion_stream"] if c.choices)
    assert seen["completion_stream"][-1].choices[0].finish_reason in ("stop", "length")
    assert isinstance(streamed, str)
    assert not agent_threads()


def test_streamed_text_is_the_non_streamed_text(tokenizer):
    """Same sampled ids, stream off and on: the same text, chunk by chunk."""
    words = tokenizer.encode(" the cat has 5 apples", add_special_tokens=False)
    scripted = Scripted(lambda context: [*words, tokenizer.eos_token_id])
    got = {}

    def agent(base_url, api_key, task):
        client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        got["plain"] = client.chat.completions.create(model="m", messages=task["messages"])
        got["stream"] = list(
            client.chat.completions.create(model="m", messages=task["messages"], stream=True)
        )
        got["cplain"] = client.completions.create(model="m", prompt="hello")
        got["cstream"] = list(client.completions.create(model="m", prompt="hello", stream=True))

    rollout = AgentProgramRollout(scripted, tokenizer, agent, timeout_s=30)
    try:
        rollout.run(chat_batch(tokenizer, ["hi"]), SamplingParams(max_new_tokens=40))
    finally:
        rollout.close()
    assert got["plain"].choices[0].message.content == " the cat has 5 apples"
    assert got["plain"].choices[0].finish_reason == "stop"
    pieces = [c.choices[0].delta.content for c in got["stream"] if c.choices[0].delta.content]
    assert "".join(pieces) == " the cat has 5 apples" and len(pieces) == len(words)
    assert got["cplain"].choices[0].text == " the cat has 5 apples"
    assert "".join(c.choices[0].text for c in got["cstream"]) == " the cat has 5 apples"


# ---------------------------------------------------------------------------- exact ids
def test_a_conversation_trains_on_the_sampled_ids_not_a_retokenization(tokenizer):
    """The model samples "the" as t-h-e; the tokenizer writes "the" as t-he. The second
    turn's prompt (chat messages, or completion text) must continue with t-h-e."""
    eos = tokenizer.eos_token_id
    sampled = [tokenizer.convert_tokens_to_ids(c) for c in "the"] + [eos]
    assert tokenizer.decode(sampled, skip_special_tokens=True) == "the"
    assert tokenizer.encode("the", add_special_tokens=False) != sampled[:3]  # they differ
    answer = [*tokenizer.encode("12", add_special_tokens=False), eos]
    scripted = Scripted(lambda context: sampled if len(scripted.batches) == 1 else answer)
    conversations = {}

    def agent(base_url, api_key, task):
        client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        messages = list(task["messages"])
        first = client.chat.completions.create(model="m", messages=messages)
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "tool", "content": "12"},
        ]
        client.chat.completions.create(model="m", messages=messages)
        conversations["chat"] = messages

    rollout = AgentProgramRollout(scripted, tokenizer, agent, timeout_s=30)
    try:
        out = rollout.run(
            chat_batch(tokenizer, ["what is 3*4?"]), SamplingParams(max_new_tokens=48)
        )
    finally:
        rollout.close()
    b = out.batch
    n = int(b["attention_mask"][0, WIDTH:].sum())
    response = b["responses"][0, :n].tolist()
    mask = b["response_mask"][0, :n].tolist()
    # the sampled t-h-e-<eos> start the response, trained, with their recorded log-probs
    assert response[:4] == sampled and mask[:4] == [1, 1, 1, 1]
    assert b["rollout_log_probs"][0, :4].tolist() == pytest.approx([-0.25, -0.26, -0.27, -0.28])
    # then the tool message (not trained), then the second answer (trained)
    assert response[-3:] == answer and mask[-3:] == [1, 1, 1] and 0 in mask[4:-3]
    assert set(mask[4:-3]) == {0}
    assert (
        tokenizer.decode(response[4:-3])
        == "\n<|im_start|>tool\n12<|im_end|>\n<|im_start|>assistant\n"
    )
    # re-tokenizing the conversation would have given other ids for the first answer
    retokenized = tokenizer.apply_chat_template(
        conversations["chat"], tokenize=False, add_generation_prompt=True
    )
    full = b["input_ids"][0][b["attention_mask"][0].bool()].tolist()
    assert tokenizer.encode(retokenized, add_special_tokens=False) != full[: -len(answer)]
    assert tokenizer.decode(full[: -len(answer)]) == retokenized  # the same text, other ids
    assert out.non_tensor_batch["turn_info"][0][1]["stitch"] == "messages"
    assert out.non_tensor_batch["agent_untrained_requests"].tolist() == [0]


@pytest.mark.parametrize("as_ids", [False, True])
def test_completion_prompts_reuse_the_sampled_ids(tokenizer, as_ids):
    eos = tokenizer.eos_token_id
    sampled = [tokenizer.convert_tokens_to_ids(c) for c in "the"]
    more = tokenizer.encode(" cat", add_special_tokens=False)
    scripted = Scripted(lambda context: sampled if len(scripted.batches) == 1 else [*more, eos])

    def agent(base_url, api_key, task):
        client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        prompt = "Say it:"
        first = client.completions.create(
            model="m", prompt=prompt, max_tokens=3, extra_body={"return_token_ids": True}
        )
        if as_ids:
            ids = first.prompt_token_ids + first.choices[0].token_ids
            ids += tokenizer.encode(" and", add_special_tokens=False)
            client.completions.create(model="m", prompt=ids)
        else:
            client.completions.create(model="m", prompt=prompt + first.choices[0].text + " and")

    rollout = AgentProgramRollout(scripted, tokenizer, agent, timeout_s=30)
    try:
        out = rollout.run(chat_batch(tokenizer, ["x"]), SamplingParams(max_new_tokens=20))
    finally:
        rollout.close()
    b = out.batch
    n = int(b["attention_mask"][0, WIDTH:].sum())
    and_ids = tokenizer.encode(" and", add_special_tokens=False)
    assert b["responses"][0, :n].tolist() == [*sampled, *and_ids, *more, eos]
    assert b["response_mask"][0, :n].tolist() == [1, 1, 1] + [0] * len(and_ids) + [1] * (
        len(more) + 1
    )
    prompt_ids = b["prompts"][0][b["attention_mask"][0, :WIDTH].bool()].tolist()
    assert tokenizer.decode(prompt_ids) == "Say it:"
    assert out.non_tensor_batch["turn_info"][0][1]["stitch"] == ("ids" if as_ids else "text")


# ---------------------------------------------------------------------------- log-probs
def test_rollout_log_probs_equal_the_trainers_over_every_turn(model, engine, tokenizer):
    def agent(base_url, api_key, task):
        client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        messages = list(task["messages"])
        for turn in range(3):
            reply = client.chat.completions.create(model="m", messages=messages, max_tokens=6)
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": f"and {turn}?"},
            ]
        return 1.0

    rollout = AgentProgramRollout(engine, tokenizer, agent, concurrency=4, timeout_s=60)
    try:
        out = rollout.run(
            chat_batch(tokenizer, ["1+2=", "hello"]),
            SamplingParams(n=2, max_new_tokens=64, temperature=0.8, seed=3),
        )
    finally:
        rollout.close()
    b = out.batch
    width = b["responses"].shape[1]
    with torch.no_grad():
        (recomputed,) = compute_response_log_probs(
            model,
            b["input_ids"],
            b["attention_mask"],
            b["position_ids"],
            response_len=width,
            temperature=0.8,
        )[:1]
    mask = b["response_mask"].bool()
    assert int(mask.sum(-1).min()) >= 3  # three model turns per row
    diff = (recomputed - b["rollout_log_probs"]).abs()[mask]
    assert float(diff.max()) < 1e-4
    real = b["attention_mask"][:, -width:].bool()
    assert bool((real | ~mask).all()) and int((real & ~mask).sum()) > 0  # user turns: mask 0
    assert b["rollout_log_probs"][~mask].abs().max() == 0
    assert all(len(t) == 3 for t in out.non_tensor_batch["turn_info"])


# ---------------------------------------------------------------------------- failures
def test_failing_agents_are_counted_and_leave_no_trained_token(tokenizer):
    eos = tokenizer.eos_token_id
    scripted = Scripted(lambda context: [5, 6, eos])
    release = threading.Event()
    late: dict[str, object] = {}
    keys: list[str] = []

    def agent(base_url, api_key, task):
        client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        kind = task["sample"]
        keys.append(api_key)
        if kind == 0:  # works
            client.chat.completions.create(model="m", messages=task["messages"])
            return 1.0
        if kind == 1:  # raises after a request
            client.chat.completions.create(model="m", messages=task["messages"])
            raise RuntimeError("tool exploded")
        if kind == 2:  # never calls the model
            return None
        if kind == 3:  # hangs past the timeout, then tries again after the rollout ended
            release.wait(30)
            try:
                client.chat.completions.create(model="m", messages=task["messages"])
            except openai.APIStatusError as exc:
                late["status"] = exc.status_code
            return 1.0
        # another key than its own
        try:
            OpenAI(base_url=base_url, api_key="verl-guessed", max_retries=0).completions.create(
                model="m", prompt="x"
            )
        except openai.AuthenticationError as exc:
            late["guessed"] = exc.status_code
        return 0.0

    rollout = AgentProgramRollout(scripted, tokenizer, agent, timeout_s=2.0)
    try:
        out = rollout.run(chat_batch(tokenizer, ["q"]), SamplingParams(n=5, max_new_tokens=16))
        non = out.non_tensor_batch
        assert non["agent_status"].tolist() == [
            "ok",
            "error",
            "no_requests",
            "timeout",
            "no_requests",
        ]
        assert "RuntimeError: tool exploded" in non["agent_error"][1]
        assert "timeout_s=2" in non["agent_error"][3]
        mask = out.batch["response_mask"]
        assert int(mask[0].sum()) == 3 and int(mask[1:].sum()) == 0  # only the good agent trains
        assert int(out.batch["attention_mask"][1:, WIDTH:].sum()) == 0
        metrics = agent_program_metrics(non)
        assert metrics["agent/errors"] == 1 and metrics["agent/timeouts"] == 1
        assert metrics["agent/no_requests"] == 2 and metrics["agent/ok"] == 1
        assert metrics["agent/unauthorized_requests_total"] == 1
        assert late["guessed"] == 401
        # the hung agent wakes up after its rollout ended: refused with 403, counted
        release.set()
        for thread in agent_threads():
            if thread.name.startswith("verl-agent"):
                thread.join(10)
        assert late["status"] == 403
        assert rollout.endpoint.counters["after_end"] == 1
        # a finished rollout's key stays refused in the next rollout, which counts it
        other = OpenAI(base_url=rollout.endpoint.base_url, api_key=keys[0], max_retries=0)
        with pytest.raises(openai.PermissionDeniedError):
            other.completions.create(model="m", prompt="x")
        again = rollout.run(chat_batch(tokenizer, ["q"]), SamplingParams(n=1, max_new_tokens=8))
        assert agent_program_metrics(again.non_tensor_batch)["agent/late_requests_total"] == 2
    finally:
        release.set()
        rollout.close()
    assert not agent_threads()  # the endpoint's server thread and every agent's are gone


def test_limits_context_budget_and_bad_requests_are_refused(tokenizer):
    eos = tokenizer.eos_token_id
    scripted = Scripted(lambda context: [5] * 6 + [eos])
    errors: list[int] = []

    def agent(base_url, api_key, task):
        client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        messages = list(task["messages"])
        for _ in range(5):
            try:
                reply = client.chat.completions.create(model="m", messages=messages)
            except openai.APIStatusError as exc:
                errors.append(exc.status_code)
                break
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content},
                {"role": "user", "content": "more"},
            ]
        for bad in ({"n": 2}, {"max_tokens": 0}):
            try:
                client.chat.completions.create(model="m", messages=messages[:1], **bad)
            except openai.BadRequestError as exc:
                errors.append(exc.status_code)
        return 1.0

    rollout = AgentProgramRollout(scripted, tokenizer, agent, timeout_s=30, max_requests=2)
    try:
        out = rollout.run(chat_batch(tokenizer, ["q"]), SamplingParams(max_new_tokens=40))
        assert errors == [429, 400, 400]
        assert out.non_tensor_batch["agent_refused_requests"].tolist() == [3]
        # a conversation longer than the response budget is refused, not truncated
        errors.clear()
        rollout.endpoint.max_requests = 64
        out = rollout.run(chat_batch(tokenizer, ["q"]), SamplingParams(max_new_tokens=20))
        assert errors[0] == 400
        assert int(out.batch["attention_mask"][0, WIDTH:].sum()) <= 20
    finally:
        rollout.close()


def test_concurrency_limit_and_batched_generation(tokenizer):
    eos = tokenizer.eos_token_id
    scripted = Scripted(lambda context: [5, eos])
    lock = threading.Lock()
    active = [0, 0]  # now, most at once

    def agent(base_url, api_key, task):
        with lock:
            active[0] += 1
            active[1] = max(active[1], active[0])
        try:
            client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
            for _ in range(2):
                client.chat.completions.create(model="m", messages=task["messages"])
            time.sleep(0.05)
        finally:
            with lock:
                active[0] -= 1
        return 1.0

    rollout = AgentProgramRollout(scripted, tokenizer, agent, concurrency=3, timeout_s=30)
    try:
        out = rollout.run(chat_batch(tokenizer, ["a", "b"]), SamplingParams(n=4, max_new_tokens=8))
    finally:
        rollout.close()
    assert out.non_tensor_batch["agent_status"].tolist() == ["ok"] * 8
    assert active[1] == 3  # never more than concurrency agents at once
    assert sum(scripted.batches) == 16 and max(scripted.batches) > 1  # requests batched
    assert out.non_tensor_batch["agent_untrained_requests"].tolist() == [1] * 8


COMMAND_AGENT = """
import json, os, sys, time
from openai import OpenAI
task = json.load(sys.stdin)
open(os.environ["PID_DIR"] + f"/{task['sample']}", "w").write(str(os.getpid()))
if task["sample"] == 1:
    sys.exit(3)
if task["sample"] == 2:
    time.sleep(60)
client = OpenAI(max_retries=0)  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
reply = client.chat.completions.create(model="m", messages=task["messages"])
print("some log line")
print(json.dumps({"score": float(reply.choices[0].message.content == "the")}))
"""


def test_command_agents(tokenizer, tmp_path, monkeypatch):
    script = tmp_path / "agent.py"
    script.write_text(COMMAND_AGENT)
    monkeypatch.setenv("PID_DIR", str(tmp_path))
    eos = tokenizer.eos_token_id
    scripted = Scripted(lambda context: [*tokenizer.encode("the", add_special_tokens=False), eos])
    spec = load_agent(command=f"{sys.executable} {script}")
    rollout = AgentProgramRollout(scripted, tokenizer, spec, timeout_s=8)
    try:
        out = rollout.run(chat_batch(tokenizer, ["q"]), SamplingParams(n=3, max_new_tokens=8))
    finally:
        rollout.close()
    non = out.non_tensor_batch
    assert non["agent_status"].tolist() == ["ok", "error", "timeout"]
    assert non["extra_info"][0]["agent_reward"] == {"score": 1.0}
    assert "exited with status 3" in non["agent_error"][1]
    for sample in range(3):  # every process is gone, the hung one killed
        pid = int((tmp_path / str(sample)).read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_load_agent_refuses_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="exactly one of program"):
        load_agent()
    with pytest.raises(ValueError, match="exactly one of program"):
        load_agent("m:f", "python x.py")
    with pytest.raises(FileNotFoundError, match="agent program file"):
        load_agent(str(tmp_path / "missing.py") + ":agent")
    path = tmp_path / "a.py"
    path.write_text("def agent(base_url, api_key, task):\n    return 1.0\n")
    assert load_agent(f"{path}:agent").fn("u", "k", {}) == 1.0
    assert load_agent("json:dumps").fn is json.dumps


# ---------------------------------------------------------------------------- rewards
def test_the_agent_reward_manager(tokenizer):
    rows = 4
    responses = torch.tensor([tokenizer.encode("7", add_special_tokens=False) * 2] * rows)
    infos = np.empty(rows, dtype=object)
    infos[0] = {"agent_reward": 0.75, "agent_status": "ok"}
    infos[1] = {"agent_reward": None, "agent_status": "ok"}  # scored by the data source's scorer
    infos[2] = {"agent_reward": None, "agent_status": "error", "agent_error": "boom"}
    infos[3] = {"agent_reward": {"score": -1.0, "acc": 0.0}, "agent_status": "ok"}
    batch = DataProto.from_dict(
        tensors={"responses": responses, "response_mask": torch.ones_like(responses)},
        non_tensors={
            "data_source": np.array(["arithmetic"] * rows, dtype=object),
            "ground_truth": np.array(["77"] * rows, dtype=object),
            "extra_info": infos,
        },
    )
    manager = AgentRewardManager(tokenizer, max_failure_rate=None)
    scores, metrics, _ = manager(batch)
    assert scores.sum(-1).tolist() == [0.75, 1.0, 0.0, -1.0]
    assert metrics[f"reward/{ERROR}"] == 1


def test_an_engine_error_stops_the_step_and_answers_the_agents(tokenizer):
    def broken(context):
        raise RuntimeError("CUDA out of memory (simulated)")

    statuses: list[int] = []

    def agent(base_url, api_key, task):
        client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        try:
            client.chat.completions.create(model="m", messages=task["messages"])
        except openai.APIStatusError as exc:
            statuses.append(exc.status_code)

    rollout = AgentProgramRollout(Scripted(broken), tokenizer, agent, timeout_s=30)
    try:
        with pytest.raises(RuntimeError, match="simulated"):
            rollout.run(chat_batch(tokenizer, ["q"]), SamplingParams(n=2, max_new_tokens=8))
        for thread in agent_threads():
            if thread.name.startswith("verl-agent"):
                thread.join(10)
        # every agent is answered: 500 for the requests the failing engine call held, 403
        # ("this rollout has ended") for one that reached the server after the step stopped
        assert len(statuses) == 2 and 500 in statuses, statuses
        assert set(statuses) <= {500, 403}, statuses
    finally:
        rollout.close()
    assert not agent_threads()
