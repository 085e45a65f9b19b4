"""The calculator task as a plain OpenAI-client agent, trained with GRPO as a rollout.

:func:`calculator_agent` is an ordinary agent: it knows nothing of verl. It asks the model
with the ``openai`` client, runs its own tool loop (a ``<tool_call>{"name": "calculator",
"arguments": {"expression": ...}}</tool_call>`` in the model's text is parsed, computed
and sent back as a ``tool`` message) and returns its reward: 1.0 when the last number of
the model's final answer is the ground truth, else 0.0. :func:`calculator_tools_agent` is
the same agent with OpenAI function calling (``tools=[...]`` in the request, the reply's
``tool_calls``, ``tool`` messages with their ``tool_call_id``); examples/calculator_sft_grpo.py
``--rollout agent`` trains it from the recipe's SFT warm start.

verl runs it as the rollout (``actor_rollout_ref.rollout.agent.program``, docs/agents.md):
it serves the OpenAI endpoint from the policy being trained, records every request's exact
token ids and log-probs, and trains on the model's own tokens of each conversation::

    PYTHONPATH=. python examples/agents/calculator_agent.py --steps 2            # tiny model
    PYTHONPATH=. python examples/agents/calculator_agent.py --model smollm2 --steps 12

The same run from the command line::

    python -m verl.trainer.main_ppo \\
        actor_rollout_ref.rollout.agent.program=examples/agents/calculator_agent.py:calculator_agent \\
        reward_model.reward_manager=agent ...
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import re
from typing import Any

from openai import OpenAI

SYSTEM = (
    "You have a calculator. To use it, write "
    '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call> '
    "and wait for its result. Then answer with just the number."
)
MAX_TURNS = 3
MAX_TOKENS = 48
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def calculate(expression: str) -> str:
    """Exact arithmetic on ``+ - * / // %`` and parentheses; anything else is an error."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if max(abs(left), abs(right)) > 1e12:
                raise ValueError("numbers too large")
            return _OPS[type(node.op)](left, right)
        raise ValueError(f"unsupported expression {ast.dump(node)[:40]}")

    if len(expression) > 200:
        return "Error: expression too long"
    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"Error: {exc}"
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


def parse_call(text: str) -> str | None:
    """The calculator expression of the first tool call in ``text`` (None: no call)."""
    match = _CALL.search(text)
    if match is None:
        return None
    try:
        call = json.loads(match.group(1))
        return str(call["arguments"]["expression"])
    except (json.JSONDecodeError, KeyError, TypeError):
        return ""  # a malformed call: the agent answers with an error message


def calculator_agent(base_url: str, api_key: str, task: dict[str, Any]) -> float:
    """Solve one arithmetic task with the calculator; the reward is 1.0 for the right
    number in the final answer, else 0.0."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, *task["messages"]]
    answer = ""
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(
            model="policy", messages=messages, max_tokens=MAX_TOKENS
        )
        answer = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": answer})
        expression = parse_call(answer)
        if expression is None:
            break
        result = calculate(expression) if expression else "Error: malformed tool call"
        messages.append({"role": "tool", "content": result})
    numbers = _NUMBER.findall(answer)
    return float(bool(numbers) and numbers[-1] == str(task["ground_truth"]).strip())


#: The calculator as an OpenAI function tool, for :func:`calculator_tools_agent`.
CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression exactly, e.g. '1234 * 5678'.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
#: Model turns of :func:`calculator_tools_agent`: a call, then the answer (as the built-in
#: tool loop's ``multi_turn.max_turns=2`` in examples/calculator_sft_grpo.py).
TOOL_TURNS = 2


def calculator_tools_agent(base_url: str, api_key: str, task: dict[str, Any]) -> float:
    """The same task with OpenAI function calling: the calculator is passed as ``tools``
    (the server's chat template describes it), the reply's ``tool_calls`` are computed and
    answered with ``tool`` messages. At most :data:`TOOL_TURNS` model turns; the reward is
    1.0 for the right number in the last reply, else 0.0."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[dict[str, Any]] = list(task["messages"])
    answer = ""
    for _ in range(TOOL_TURNS):
        reply = client.chat.completions.create(
            model="policy", messages=messages, tools=[CALCULATOR_TOOL]
        )
        message = reply.choices[0].message
        answer = message.content or ""
        if not message.tool_calls:
            break
        calls = [
            {"id": c.id, "type": "function", "function": c.function.model_dump()}
            for c in message.tool_calls
        ]
        messages.append({"role": "assistant", "content": message.content, "tool_calls": calls})
        for call in message.tool_calls:
            try:
                expression = str(json.loads(call.function.arguments)["expression"])
                result = calculate(expression)
            except (json.JSONDecodeError, KeyError, TypeError):
                result = "Error: malformed tool call"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    numbers = _NUMBER.findall(answer)
    return float(bool(numbers) and numbers[-1] == str(task["ground_truth"]).strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny, smollm2, or a model directory")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", default="/tmp/calculator_agent")
    parser.add_argument("overrides", nargs="*", help="more config overrides (key=value)")
    args = parser.parse_args()

    from verl.config import load_config
    from verl.trainer.rl.trainer import RLTrainer

    if args.model == "tiny":
        from verl.models.tiny import save_tiny_model_dir

        model = save_tiny_model_dir(f"{args.out}/tiny_model", arch="qwen2")
    elif args.model == "smollm2":
        from verl.models.embedded import embedded_model_dir

        model = embedded_model_dir()
    else:
        model = args.model
    config = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={model}",
            f"actor_rollout_ref.rollout.agent.program={__file__}:calculator_agent",
            "reward_model.reward_manager=agent",
            "data.arithmetic.digits=2",
            "data.train_batch_size=4",
            "data.max_prompt_length=256",
            "data.max_response_length=160",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.optim.lr=5e-5",
            f"trainer.total_training_steps={args.steps}",
            f"trainer.default_local_dir={args.out}",
            f"trainer.log_dir={args.out}",
            "trainer.logger=[console,jsonl]",
            *args.overrides,
        ]
    )
    trainer = RLTrainer(config)
    try:
        trainer.fit()
    finally:
        trainer.close()
    for step, metrics in enumerate(trainer.history, 1):
        print(
            f"step {step}: reward {metrics.get('critic/score/mean', float('nan')):.3f}, "
            f"requests/agent {metrics.get('agent/requests_mean', 0):.2f}, "
            f"agent errors {metrics.get('agent/errors', 0):.0f}"
        )


if __name__ == "__main__":
    main()
