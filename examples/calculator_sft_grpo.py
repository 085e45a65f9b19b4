"""SFT warm start on tool-call transcripts, then GRPO with the calculator tool (CPU recipe).

The embedded SmolLM2-135M-Instruct never calls the calculator from a system-message
description (0/16, docs/multiturn.md), so RL from it has nothing to reward; and a warm start
on tool-call transcripts alone makes it answer every validation prompt right (16/16 after
4 SFT steps), which leaves nothing for RL to raise. This recipe gives GRPO room:

1. data: 3-digit multiplication prompts that ask for the calculator
   (``verl.data.arithmetic``, ``prompt_style="tool"``) and, on problems outside the
   validation set, SFT transcripts (``write_tool_transcripts``): system message listing the
   calculator, the question, ``<tool_call>...</tool_call>``, the tool's result, the answer.
   Only ``--tool-fraction`` of them (default 0.3) call the tool; the others answer at once
   with the right product, as a model that has only seen worked answers would try to;
2. SFT with verl's own trainer (loss on the assistant turns only): the model now calls the
   calculator on part of the prompts and guesses the product on the others (a guess of a
   3-digit product is almost always wrong);
3. GRPO through ``RLTrainer`` with ``multi_turn.enable`` and the calculator; the reward is
   the built-in arithmetic scorer (the last number of the model's own text). Validation is
   greedy on held-out prompts every ``--val-every`` steps.

``--rollout agent`` runs step 3 through an agent program instead of the built-in tool loop
(docs/agents.md): ``calculator_tools_agent`` of examples/agents/calculator_agent.py, a plain
``openai``-client agent that passes the calculator as ``tools``, computes the reply's
``tool_calls`` and returns its own reward (1.0 for the right last number), talks to the
endpoint verl serves from the policy; training and greedy validation both go through it.
Its prompts are the tool loop's (the template renders ``tools`` as the same system line), so
the same warm start applies: ``--sft-dir`` reuses an SFT model saved by an earlier run
(``<out>/sft_ckpt/huggingface``) and skips step 2. Measured (docs/agents.md): greedy
held-out accuracy through the agent 0.50 -> 1.00 in 3 GRPO steps, as through the loop.

The chat template lists the tools in one short system line ("Tools: calculator") rather
than the generic JSON description (~200 tokens), which makes every step ~3x cheaper.

It prints one line per GRPO step (sampled training answers: correct fraction, tool calls
per response, turns) and per validation (greedy), and writes them as JSON to
``<out>/curve.json``::

    PYTHONPATH=. python examples/calculator_sft_grpo.py --out /tmp/calc_recipe

``--sft-steps`` / ``--grpo-steps`` set the length; ``--smoke`` runs 2 steps of each on
small batches. ``--model tiny`` runs the same recipe on a tiny random-init Qwen2 (4 layers,
hidden 128; measured: it learns the call format but not to copy the numbers, so GRPO gets
no reward; docs/multiturn.md).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoTokenizer

from verl.config import load_config, load_sft_config
from verl.data.arithmetic import (
    OPERATORS,
    row_problem,
    sample_problems,
    tool_transcript_row,
    write_arithmetic_dataset,
)
from verl.data.base import render_chat
from verl.data.io import read_records, write_records
from verl.models.embedded import embedded_model_dir
from verl.models.tiny import CHATML_TEMPLATE, build_tiny_tokenizer, save_tiny_model_dir
from verl.tools.calculator import CALCULATOR_SCHEMA
from verl.trainer.offline.sft import SFTTrainer
from verl.trainer.rl.trainer import RLTrainer

AGENT = Path(__file__).resolve().parent / "agents" / "calculator_agent.py"

# Prompt and response budgets in tokens: the prompt is ~45 tokens with the short tools
# line; a response (call, tool result, answer) ~55 for SmolLM2's tokenizer.
MAX_PROMPT = 64
MAX_RESPONSE = 96
# The chat template lists tools in one short system line, as Qwen's template renders them
# at length (``render_chat`` uses a template's own ``tools=`` rendering). With the generic
# description (~450 tokens of JSON for the tiny tokenizer, ~200 for SmolLM2's) every step
# costs ~3x more, and a model trained from scratch has to find the operands among 500 tokens.
SYSTEM = "Tools: calculator"
TOOLS_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\nTools: ' + (tools | map(attribute='function')"
    " | map(attribute='name') | join(', ')) + '<|im_end|>\\n' }}{% endif %}" + CHATML_TEMPLATE
)


def tool_tokenizer(tokenizer: Any = None) -> Any:
    """``tokenizer`` (default: the tiny one) with :data:`TOOLS_TEMPLATE`; checks that a
    transcript's system message renders exactly as the RL prompts list the tools."""
    tokenizer = tokenizer if tokenizer is not None else build_tiny_tokenizer()
    tokenizer.chat_template = TOOLS_TEMPLATE
    user = [{"role": "user", "content": "What is 1 * 2?"}]
    rl_prompt = render_chat(tokenizer, user, True, tools=[CALCULATOR_SCHEMA])
    sft_prompt = tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, *user], tokenize=False, add_generation_prompt=True
    )
    if rl_prompt != sft_prompt:
        raise RuntimeError(f"tool prompt mismatch: {rl_prompt!r} != {sft_prompt!r}")
    return tokenizer


def smollm2_tools_dir(out: Path) -> Path:
    """The embedded SmolLM2-135M-Instruct with :data:`TOOLS_TEMPLATE`: links to the cached
    weights and config, and the tokenizer saved with the new template."""
    src = embedded_model_dir()
    dst = out / "smollm2_tools"
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        link = dst / name
        if not link.exists():
            link.symlink_to(src / name)
    tool_tokenizer(AutoTokenizer.from_pretrained(src)).save_pretrained(dst)
    return dst


def write_sft_rows(
    path: Path, n: int, digits: int, tool_fraction: float, exclude: set, seed: int = 7
) -> str:
    """``n`` SFT transcripts on problems outside ``exclude``: a ``tool_fraction`` of them
    call the calculator and copy its result (``tool_transcript_row``), the others answer
    with the right product at once (no tool call)."""
    if not 0.0 <= tool_fraction <= 1.0:
        raise ValueError(f"--tool-fraction {tool_fraction}: must be in [0, 1]")
    rng = random.Random(seed)
    rows = []
    for problem in sample_problems(n, digits, ["*"], seed, exclude):
        row = tool_transcript_row(problem, [CALCULATOR_SCHEMA], SYSTEM)
        if rng.random() >= tool_fraction:
            a, op, b = problem
            answer = {"role": "assistant", "content": str(OPERATORS[op](a, b))}
            row = {"messages": [*row["messages"][:2], answer]}
        rows.append(row)
    return write_records(rows, path)


def make_data(
    out: Path, digits: int, val_size: int, transcripts: int, tool_fraction: float
) -> dict:
    """RL prompts (train/test parquet) and SFT transcripts on non-validation problems."""
    train, val = write_arithmetic_dataset(
        out / "rl", 512, val_size, digits, ["*"], seed=0, prompt_style="tool"
    )
    held_out = {row_problem(r.data) for r in read_records(val).records}
    sft = write_sft_rows(out / "sft" / "train.jsonl", transcripts, digits, tool_fraction, held_out)
    return {"rl_train": train, "rl_val": val, "sft": sft}


def run_sft(
    model_dir: Path | str, sft_file: str, out: Path, steps: int, lr: float
) -> tuple[Path, list[float]]:
    """SFT of ``model_dir`` on the transcripts; the saved model and the loss per step."""
    cfg = load_sft_config(
        overrides=[
            f"model.path={model_dir}",
            f"data.train_files=[{sft_file}]",
            f"data.max_length={MAX_PROMPT + MAX_RESPONSE}",
            "data.train_batch_size=8",
            "data.micro_batch_size_per_device=8",
            f"optim.lr={lr}",
            "optim.lr_warmup_steps_ratio=0.1",
            "optim.weight_decay=0.0",
            "optim.min_lr_ratio=0.1",
            f"trainer.total_training_steps={steps}",
            "trainer.val_before_train=false",
            "trainer.logger=[console]",
            f"trainer.default_local_dir={out / 'sft_ckpt'}",
            f"trainer.log_dir={out / 'sft_logs'}",
            "trainer.resume_mode=disable",
        ]
    )
    results = SFTTrainer(cfg).train()
    losses = [m["train/loss"] for m in results["history"]]
    return Path(results["hf_dir"]), losses


def tool_calls(non_tensor: Any) -> tuple[list[int], list[int]]:
    """Tool calls and failed calls per response: the agent loop's ``num_tool_calls`` /
    ``num_tool_errors`` columns, or (agent programs) the ``tool`` messages of each row's
    ``messages`` and those whose result is an ``Error: ...``."""
    if "num_tool_calls" in non_tensor:
        calls = [int(c) for c in non_tensor["num_tool_calls"]]
        errors = non_tensor.get("num_tool_errors", [0] * len(calls))
        return calls, [int(e) for e in errors]
    tools = [[m for m in row if m.get("role") == "tool"] for row in non_tensor["messages"]]
    errors = [sum(str(m.get("content")).startswith("Error") for m in row) for row in tools]
    return [len(row) for row in tools], errors


class CurveTrainer(RLTrainer):
    """``RLTrainer`` that also reports the tool calls per response: ``val/tool_calls_mean``
    per validation, and :attr:`train_calls` (calls, failed calls) per training rollout."""

    _val_calls: list[int] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.train_calls: list[tuple[float, float]] = []

    def validate(self) -> dict[str, float]:
        self._val_calls = []
        try:
            metrics = super().validate()
        finally:
            calls, self._val_calls = self._val_calls, None
        if calls:
            metrics["val/tool_calls_mean"] = float(np.mean(calls))
        return metrics

    def _generate(self, prompts: Any, group: Any = None) -> Any:
        gen = super()._generate(prompts, group)
        calls, errors = tool_calls(gen.non_tensor_batch)
        if self._val_calls is not None:
            self._val_calls.extend(calls)
        else:
            self.train_calls.append((float(np.mean(calls)), float(np.sum(errors))))
        return gen


def rollout_overrides(rollout: str) -> list[str]:
    """The config of the GRPO rollout: the built-in tool loop (``loop``) or the OpenAI-client
    agent over the served endpoint (``agent``, its reward through the ``agent`` manager)."""
    if rollout == "agent":
        return [
            f"actor_rollout_ref.rollout.agent.program={AGENT}:calculator_tools_agent",
            "actor_rollout_ref.rollout.agent.concurrency=32",
            "actor_rollout_ref.rollout.agent.timeout_s=1800",
            "reward_model.reward_manager=agent",
        ]
    if rollout != "loop":
        raise ValueError(f"--rollout {rollout!r}: choose loop or agent")
    return [
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.tools=[{path: builtin, name: calculator}]",
        "actor_rollout_ref.rollout.multi_turn.max_turns=2",
        "actor_rollout_ref.rollout.multi_turn.max_tool_response_tokens=16",
    ]


def run_grpo(model_dir: Path, data: dict, out: Path, args: argparse.Namespace) -> dict:
    """GRPO with the calculator; per-step training metrics and per-validation (greedy)
    accuracy and tool calls."""
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            f"data.train_files=[{data['rl_train']}]",
            f"data.val_files=[{data['rl_val']}]",
            f"data.max_prompt_length={MAX_PROMPT}",
            f"data.max_response_length={MAX_RESPONSE}",
            f"data.train_batch_size={args.prompts}",
            f"actor_rollout_ref.rollout.n={args.n}",
            "actor_rollout_ref.rollout.temperature=1.0",
            *rollout_overrides(args.rollout),
            f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_device="
            f"{min(16, args.prompts * args.n)}",
            f"actor_rollout_ref.actor.optim.lr={args.grpo_lr}",
            "algorithm.adv_estimator=grpo",
            f"trainer.total_training_steps={args.grpo_steps}",
            f"trainer.mixed_precision={args.precision}",
            "trainer.val_before_train=true",
            f"trainer.test_freq={args.val_every}",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={out / 'grpo_ckpt'}",
            f"trainer.log_dir={out / 'grpo_logs'}",
        ]
    )
    trainer = CurveTrainer(cfg)
    try:
        trainer.fit()
        steps = [
            {
                "step": step,
                "correct": m.get("reward/acc", m["critic/score/mean"]),
                "tool_calls_mean": calls,
                "tool_errors": errors,
                "turns_mean": m.get("multi_turn/turns_mean", m.get("agent/requests_mean")),
                "step_seconds": m.get("timing_s/step"),
            }
            for step, (m, (calls, errors)) in enumerate(
                zip(trainer.history, trainer.train_calls, strict=True), start=1
            )
        ]
        val = [
            {
                "step": v["step"],
                "correct": v["val/acc"],
                "tool_calls_mean": v.get("val/tool_calls_mean", 0.0),
            }
            for v in trainer.validation_history
        ]
    finally:
        trainer.close()
    return {"steps": steps, "val": val}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="working directory (data, models, logs)")
    p.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    p.add_argument("--digits", type=int, default=3)
    p.add_argument("--val-size", type=int, default=32, help="held-out validation prompts")
    p.add_argument("--transcripts", type=int, default=None, help="default: 8 per SFT step")
    p.add_argument(
        "--tool-fraction", type=float, default=0.3, help="SFT transcripts that call the tool"
    )
    p.add_argument("--sft-steps", type=int, default=None, help="smollm2: 8, tiny: 150")
    p.add_argument("--sft-lr", type=float, default=None, help="smollm2: 1e-4, tiny: 5e-3")
    p.add_argument("--grpo-steps", type=int, default=12)
    p.add_argument("--grpo-lr", type=float, default=None, help="smollm2: 5e-5, tiny: 1e-3")
    p.add_argument("--prompts", type=int, default=4, help="prompts per GRPO step")
    p.add_argument("--n", type=int, default=4, help="responses per prompt")
    p.add_argument("--val-every", type=int, default=4, help="GRPO steps between validations")
    p.add_argument(
        "--precision", default="auto", help="GRPO trainer.mixed_precision (auto: bf16 here)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads (smollm2 2, tiny 1)")
    p.add_argument(
        "--rollout",
        choices=["loop", "agent"],
        default="loop",
        help="GRPO through the built-in tool loop or the OpenAI-client calculator agent",
    )
    p.add_argument("--sft-dir", default=None, help="an SFT model of an earlier run: skip SFT")
    p.add_argument("--smoke", action="store_true", help="2 SFT and 2 GRPO steps, small batches")
    args = p.parse_args(argv)
    smollm2 = args.model == "smollm2"
    defaults = {"sft_steps": (8, 150), "sft_lr": (1e-4, 5e-3), "grpo_lr": (5e-5, 1e-3)}
    defaults["threads"] = (2, 1)
    for key, (big, tiny) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, big if smollm2 else tiny)
    if args.smoke:
        args.sft_steps, args.grpo_steps, args.val_size = 2, 2, 4
        args.prompts, args.n, args.val_every = 2, 2, 2
    if args.transcripts is None:
        args.transcripts = 8 * args.sft_steps
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    start = time.monotonic()
    data = make_data(out, args.digits, args.val_size, args.transcripts, args.tool_fraction)
    if args.sft_dir:
        sft_dir, sft_losses = Path(args.sft_dir), []
        if AutoTokenizer.from_pretrained(sft_dir).chat_template != TOOLS_TEMPLATE:
            raise ValueError(
                f"--sft-dir {sft_dir}: its tokenizer's chat template is not the recipe's tools "
                "template; pass the sft_ckpt/huggingface directory of an earlier run"
            )
    else:
        if smollm2:
            base = smollm2_tools_dir(out)
        else:
            base = save_tiny_model_dir(
                out / "tiny",
                tokenizer=tool_tokenizer(),
                hidden_size=128,
                num_layers=4,
                intermediate_size=256,
                max_position_embeddings=MAX_PROMPT + MAX_RESPONSE,
                seed=0,
            )
        sft_dir, sft_losses = run_sft(base, data["sft"], out, args.sft_steps, args.sft_lr)
    sft_seconds = time.monotonic() - start
    curve = run_grpo(sft_dir, data, out, args)
    result = {
        "args": vars(args),
        "sft_seconds": round(sft_seconds, 1),
        "sft_loss": [round(x, 4) for x in sft_losses],
        "total_seconds": round(time.monotonic() - start, 1),
        **curve,
    }
    (out / "curve.json").write_text(json.dumps(result, indent=1))
    if args.sft_dir:
        print(f"SFT: reused {args.sft_dir}")
    else:
        print(f"SFT: {args.sft_steps} steps, {sft_seconds:.0f} s, loss {result['sft_loss']}")
    print(f"GRPO rollout: {args.rollout}")
    print("GRPO step  correct (sampled)  tool calls/resp  tool errors  turns  seconds")
    for c in curve["steps"]:
        print(
            f"{c['step']:9d}  {c['correct']:17.3f}  {c['tool_calls_mean']:15.2f}"
            f"  {c['tool_errors']:11.0f}  {c['turns_mean']:5.2f}  {c['step_seconds'] or 0:7.1f}"
        )
    print("validation after step  correct (greedy)  tool calls/resp")
    for v in curve["val"]:
        print(f"{v['step']:21d}  {v['correct']:16.3f}  {v['tool_calls_mean']:15.2f}")
    print(f"total {result['total_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
