"""SFT warm start on tool-call transcripts, then GRPO with the calculator tool (CPU recipe).

The embedded SmolLM2-135M-Instruct never calls the calculator from a system-message
description (0/16, docs/multiturn.md), so RL from it has nothing to reward. This recipe
shows the agent loop learning on this CPU with a tiny Qwen2 instead (random init, the
tiny byte-level tokenizer, a ChatML template):

1. data: 3-digit multiplication prompts that ask for the calculator
   (``verl.data.arithmetic``, ``prompt_style="tool"``) and, on problems outside the
   validation set, SFT transcripts (``write_tool_transcripts``): system message listing the
   calculator, the question, ``<tool_call>...</tool_call>``, the tool's result, the answer;
2. SFT with verl's own trainer (loss on the assistant turns only) for a few steps, so the
   model writes the call format but still miscopies operands and results;
3. GRPO through ``RLTrainer`` with ``multi_turn.enable`` and the calculator; the reward is
   the built-in arithmetic scorer (the last number of the model's own text).

It prints one line per GRPO step (correct fraction, tool calls per response, turns) and
writes them as JSON to ``<out>/curve.json``::

    PYTHONPATH=. python examples/calculator_sft_grpo.py --out /tmp/calc_recipe

``--sft-steps`` / ``--grpo-steps`` set the length; ``--smoke`` runs 2 steps of each.
``--model smollm2`` warm-starts the embedded SmolLM2-135M-Instruct instead (measured:
``--sft-steps 4 --sft-lr 1e-4 --transcripts 32`` makes it call the calculator and answer
right on 16/16 validation prompts, greedy; its GRPO steps take minutes each on this CPU).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch

from verl.config import load_config, load_sft_config
from verl.data.arithmetic import row_problem, write_arithmetic_dataset, write_tool_transcripts
from verl.data.base import render_chat
from verl.data.io import read_records
from verl.models.embedded import EMBEDDED_MODEL_NAME
from verl.models.tiny import CHATML_TEMPLATE, build_tiny_tokenizer, save_tiny_model_dir
from verl.tools.calculator import CALCULATOR_SCHEMA
from verl.trainer.ppo_trainer import RLTrainer
from verl.trainer.sft_trainer import SFTTrainer

MAX_LENGTH = 256
# The tiny model's chat template lists tools in one short system line, as Qwen's template
# renders them at length (``render_chat`` uses a template's own ``tools=`` rendering). With
# the generic description (~450 tokens of JSON) a model trained from scratch has to find
# the operands among 500 tokens and did not learn to copy them in 400 SFT steps.
SYSTEM = "Tools: calculator"
TOOLS_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\nTools: ' + (tools | map(attribute='function')"
    " | map(attribute='name') | join(', ')) + '<|im_end|>\\n' }}{% endif %}" + CHATML_TEMPLATE
)


def tool_tokenizer():
    """The tiny tokenizer with :data:`TOOLS_TEMPLATE`; checks that a transcript's system
    message renders exactly as the RL prompts list the tools."""
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = TOOLS_TEMPLATE
    user = [{"role": "user", "content": "What is 1 * 2?"}]
    rl_prompt = render_chat(tokenizer, user, True, tools=[CALCULATOR_SCHEMA])
    sft_prompt = tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, *user], tokenize=False, add_generation_prompt=True
    )
    if rl_prompt != sft_prompt:
        raise RuntimeError(f"tool prompt mismatch: {rl_prompt!r} != {sft_prompt!r}")
    return tokenizer


def make_data(
    out: Path, digits: int, train_size: int, val_size: int, transcripts: int, system: str | None
) -> dict:
    """RL prompts (train/test parquet) and SFT transcripts on non-validation problems."""
    train, val = write_arithmetic_dataset(
        out / "rl", train_size, val_size, digits, ["*"], seed=0, prompt_style="tool"
    )
    held_out = {row_problem(r.data) for r in read_records(val).records}
    sft = write_tool_transcripts(
        out / "sft" / "train.jsonl",
        transcripts,
        [CALCULATOR_SCHEMA],
        digits=digits,
        seed=7,
        exclude=held_out,
        system=system,
    )
    return {"rl_train": train, "rl_val": val, "sft": sft}


def run_sft(
    model_dir: Path | str, sft_file: str, out: Path, steps: int, lr: float, max_length: int
) -> tuple[Path, list[float]]:
    """SFT of ``model_dir`` on the transcripts; the saved model and the loss per step."""
    cfg = load_sft_config(
        overrides=[
            f"model.path={model_dir}",
            f"data.train_files=[{sft_file}]",
            f"data.max_length={max_length}",
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


def run_grpo(
    model_dir: Path,
    data: dict,
    out: Path,
    steps: int,
    lr: float,
    prompts: int,
    n: int,
    max_length: int,
) -> list[dict]:
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            f"data.train_files=[{data['rl_train']}]",
            f"data.val_files=[{data['rl_val']}]",
            f"data.max_prompt_length={max_length - 128}",
            "data.max_response_length=128",
            f"data.train_batch_size={prompts}",
            f"actor_rollout_ref.rollout.n={n}",
            "actor_rollout_ref.rollout.temperature=1.0",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.multi_turn.tools=[{path: builtin, name: calculator}]",
            "actor_rollout_ref.rollout.multi_turn.max_turns=2",
            "actor_rollout_ref.rollout.multi_turn.max_tool_response_tokens=16",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_device={min(16, prompts * n)}",
            f"actor_rollout_ref.actor.optim.lr={lr}",
            "algorithm.adv_estimator=grpo",
            f"trainer.total_training_steps={steps}",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={out / 'grpo_ckpt'}",
            f"trainer.log_dir={out / 'grpo_logs'}",
        ]
    )
    trainer = RLTrainer(cfg)
    curve = []
    try:
        trainer.fit()
        for step, m in enumerate(trainer.history, start=1):
            point = {
                "step": step,
                "correct": m["reward/acc"],
                "tool_calls_mean": m["multi_turn/tool_calls_mean"],
                "tool_errors": m["multi_turn/tool_errors"],
                "turns_mean": m["multi_turn/turns_mean"],
                "step_seconds": m.get("timing_s/step"),
            }
            curve.append(point)
    finally:
        trainer.close()
    return curve


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="working directory (data, models, logs)")
    p.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    p.add_argument("--digits", type=int, default=3)
    p.add_argument("--transcripts", type=int, default=1024)
    p.add_argument("--sft-steps", type=int, default=150)
    p.add_argument("--sft-lr", type=float, default=5e-3)
    p.add_argument("--grpo-steps", type=int, default=20)
    p.add_argument("--grpo-lr", type=float, default=1e-3)
    p.add_argument("--prompts", type=int, default=8, help="prompts per GRPO step")
    p.add_argument("--n", type=int, default=8, help="responses per prompt")
    p.add_argument("--threads", type=int, default=1, help="torch threads (tiny model: 1)")
    p.add_argument("--smoke", action="store_true", help="2 SFT steps and 2 GRPO steps")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    if args.smoke:
        args.sft_steps, args.grpo_steps, args.transcripts = 2, 2, 32
        args.prompts, args.n = 2, 4
    out = Path(args.out)
    start = time.monotonic()
    max_length = MAX_LENGTH
    if args.model == "smollm2":
        # SmolLM2's template has no tools= support: the generic description (206-token prompts)
        max_length = 512
        data = make_data(out, args.digits, 512, 64, args.transcripts, None)
        base = EMBEDDED_MODEL_NAME
    else:
        data = make_data(out, args.digits, 512, 64, args.transcripts, SYSTEM)
        base = save_tiny_model_dir(
            out / "tiny",
            tokenizer=tool_tokenizer(),
            hidden_size=128,
            num_layers=4,
            intermediate_size=256,
            max_position_embeddings=MAX_LENGTH,
            seed=0,
        )
    sft_dir, sft_losses = run_sft(base, data["sft"], out, args.sft_steps, args.sft_lr, max_length)
    sft_seconds = time.monotonic() - start
    curve = run_grpo(
        sft_dir, data, out, args.grpo_steps, args.grpo_lr, args.prompts, args.n, max_length
    )
    result = {
        "sft_steps": args.sft_steps,
        "sft_seconds": round(sft_seconds, 1),
        "sft_loss": [round(x, 4) for x in sft_losses],
        "total_seconds": round(time.monotonic() - start, 1),
        "curve": curve,
    }
    (out / "curve.json").write_text(json.dumps(result, indent=1))
    print(f"SFT: {args.sft_steps} steps, {sft_seconds:.0f} s")
    print("step  correct  tool_calls/resp  tool_errors  turns")
    for c in curve:
        print(
            f"{c['step']:4d}  {c['correct']:.3f}    {c['tool_calls_mean']:.2f}"
            f"             {c['tool_errors']:4.0f}        {c['turns_mean']:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
