"""Benchmark: the embedded SmolLM2-135M-Instruct on multiplication, alone and with the
calculator tool through the agent loop (native engine), side by side in one run.

Workload: ``--prompts`` problems of ``--digits``-digit multiplication from
``verl.data.arithmetic`` (seed 0, the validation split's draw). Two settings, greedy:

- ``alone``: the ``chat`` prompt ("Answer with just the number."), one turn;
- ``calculator``: the ``tool`` prompt, the calculator listed in the system message as the
  dataset renders it (``verl.data.base.render_chat``), up to ``--max-turns`` turns.

Reported per setting: accuracy (the arithmetic scorer on the model's own tokens), the
fraction of samples that made a tool call, tool errors, mean turns, seconds. This is the
starting point of RL on the calculator task: the rate the model calls the tool, and how
often a call gives the right answer, before any training.

    python bench/bench_multi_turn.py --prompts 16 --digits 3
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--digits", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from verl.data.arithmetic import make_arithmetic_rows
    from verl.data.base import render_chat
    from verl.models import embedded_model_dir, load_causal_lm, load_tokenizer
    from verl.protocol import DataProto
    from verl.rewards.scorers.arithmetic import compute_score
    from verl.rollout import SamplingParams, build_rollout
    from verl.rollout.agent_loop import AgentLoop, EngineTurnGenerator
    from verl.tools.calculator import calculator_tool

    path = embedded_model_dir()
    tokenizer = load_tokenizer(str(path))
    tokenizer.padding_side = "left"
    model = load_causal_lm(str(path)).eval()
    engine = build_rollout("native", model, tokenizer)
    tool = calculator_tool()
    params = SamplingParams(
        n=1, do_sample=False, max_new_tokens=args.max_new_tokens, stop_token_ids=None
    )

    def batch(style: str, tools: list | None) -> tuple[DataProto, list[str]]:
        rows = make_arithmetic_rows(
            args.prompts, digits=args.digits, ops=["*"], seed=1, split="test", prompt_style=style
        )
        texts = [render_chat(tokenizer, r["prompt"], True, tools=tools) for r in rows]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        mask = enc["attention_mask"]
        tensors = {
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
        }
        truths = [r["reward_model"]["ground_truth"] for r in rows]
        return DataProto.from_dict(tensors=tensors), truths

    results = {}
    for name in ("alone", "calculator"):
        if name == "alone":
            prompts, truths = batch("chat", None)
            start = time.perf_counter()
            out = engine.generate(prompts, params)
        else:
            prompts, truths = batch("tool", [tool.schema])
            loop = AgentLoop(
                EngineTurnGenerator(engine), tokenizer, [tool], max_turns=args.max_turns
            )
            start = time.perf_counter()
            out = loop.run(prompts, params)
        seconds = time.perf_counter() - start
        texts = [
            tokenizer.decode(r[m.bool()], skip_special_tokens=True)
            for r, m in zip(out.batch["responses"], out.batch["response_mask"])
        ]
        acc = [compute_score(t, g)["acc"] for t, g in zip(texts, truths)]
        row = {"accuracy": sum(acc) / len(acc), "seconds": round(seconds, 1)}
        if "num_turns" in out.non_tensor_batch:
            nt = out.non_tensor_batch
            row |= {
                "called_tool": float((nt["num_tool_calls"] > 0).mean()),
                "tool_errors": int(nt["num_tool_errors"].sum()),
                "turns_mean": float(nt["num_turns"].mean()),
            }
        row["example"] = texts[0][:200]
        results[name] = row
    print(json.dumps({"args": vars(args), "results": results}, indent=1))
    print(f"{'setting':<12}{'accuracy':>10}{'tool calls':>12}{'seconds':>9}")
    for name, row in results.items():
        print(
            f"{name:<12}{row['accuracy']:>10.3f}{row.get('called_tool', 0):>12.2f}{row['seconds']:>9}"
        )


if __name__ == "__main__":
    main()
