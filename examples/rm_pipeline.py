"""SFT -> reward model -> GRPO with the reward model as the only reward (CPU recipe).

The RLHF pipeline on arithmetic, where the truth is known, so every stage can be measured:

1. data (``verl.data``): RL prompts "What is 3 + 4? Answer with just the number." with a
   held-out validation set; SFT rows (prompt -> the answer) on problems outside it;
2. SFT of the base model with ``SFTTrainer`` (loss on the answer only); ``--sft-steps 0``
   skips it (the SmolLM2 default: SmolLM2-Instruct already answers in the format);
3. reward-model pairs on problems outside the RL validation set, held-out RM problems
   apart: ``--rm-pairs policy`` samples the SFT model's own answers (``--rm-samples`` per
   problem, temperature 1, as GRPO samples) and pairs a right one (chosen) with a wrong one
   (rejected), right and wrong by the rule scorer; ``--rm-pairs synthetic`` (the tiny
   model's default) pairs the right number with a made-up wrong one (off by a little,
   another operator's result, or any number;
   ``verl.data.preference_pairs.write_answer_pairs``); ``--rm-pairs mixed`` (the SmolLM2
   default) trains on both, validated on the policy pairs;
4. reward-model training with ``RMTrainer``: the SFT model's body plus a new one-output
   ``score`` head, Bradley-Terry loss on the pairs; ``val/acc`` is the fraction of held-out
   pairs it orders right. On SmolLM2 the body trains LoRA adapters (``--rm-lora-rank``) in
   bf16 autocast where the CPU has native bf16 (``--rm-precision``, ``engine.precision``);
5. GRPO from the SFT model with ``reward_model.enable=true`` and the trained reward model
   as the only training reward. The rule scorer is never used to train: it only measures
   (greedy validation accuracy on the held-out prompts, ``val/acc``, and, per step, the
   fraction of sampled answers that are right, ``rule_acc``, and how often the reward model
   orders a right answer above a wrong one to the same prompt, ``rm_pair_acc``). A KL
   loss to the initial policy (``--kl-coef``, ``actor.use_kl_loss``; 0 turns it off) holds
   the policy near the answers the reward model was trained on. The policy still finds
   answers the reward model over-rates (bare numbers, equations on other operands): the
   remedies tried and their curves are in docs/reward_model.md.

It prints one line per stage and per GRPO step and writes everything as JSON to
``<out>/pipeline.json``::

    PYTHONPATH=. python examples/rm_pipeline.py --out /tmp/rm_pipeline            # SmolLM2
    PYTHONPATH=. python examples/rm_pipeline.py --out /tmp/rm_tiny --model tiny

``--reward rule`` is the control: GRPO on the same prompts with the rule scorer's reward
and no reward model. ``--rm-model DIR`` reuses an earlier run's reward model (no pairs are
sampled, no RM is trained), so GRPO settings can be compared on one reward model. ``--smoke`` runs 2 steps of each stage on small batches. The measured
runs are in docs/reward_model.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verl.config import load_config, load_rm_config, load_sft_config
from verl.config.precision import auto_select_precision
from verl.data.arithmetic import make_arithmetic_rows, row_problem, write_arithmetic_dataset
from verl.data.io import read_records, write_records
from verl.data.preference_pairs import write_answer_pairs
from verl.data.sft_dataset import make_arithmetic_sft_rows
from verl.models import load_causal_lm, load_tokenizer
from verl.models.tiny import save_tiny_model_dir
from verl.rewards import RewardFunction
from verl.rewards.scorers.arithmetic import compute_score
from verl.trainer.offline.rm import RMTrainer
from verl.trainer.offline.sft import SFTTrainer
from verl.trainer.rl.trainer import RLTrainer

MAX_PROMPT = 48
MAX_RESPONSE = 8


def make_data(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """RL prompts (train/test), SFT rows (None without SFT steps) and RM pairs; no SFT or
    RM problem is an RL validation problem."""
    rl_train, rl_val = write_arithmetic_dataset(
        out / "rl", 512, args.val_size, args.digits, args.ops, seed=0
    )
    held_out = {row_problem(r.data) for r in read_records(rl_val).records}
    sft = None
    if args.sft_steps > 0:
        sft_rows = make_arithmetic_sft_rows(
            8 * args.sft_steps, args.digits, args.ops, seed=3, exclude=held_out
        )
        sft = write_records(sft_rows, out / "sft" / "train.parquet")
    rm_train, rm_val = write_answer_pairs(
        out / "rm",
        args.rm_problems,
        args.rm_val_problems,
        args.digits,
        args.ops,
        seed=1,
        wrong_per_problem=args.wrong_per_problem,
        exclude=held_out,
    )
    return {
        "rl_train": rl_train,
        "rl_val": rl_val,
        "sft": sft,
        "rm_train": rm_train,
        "rm_val": rm_val,
    }


def _problems(n: int, args: argparse.Namespace, seed: int, exclude: set) -> list[dict]:
    """Up to ``n`` distinct problems' RL rows (chat prompt, ground truth), none in
    ``exclude``."""
    rows, seen = [], set(exclude)
    for row in make_arithmetic_rows(n, args.digits, args.ops, seed, "train", "chat", exclude):
        if row_problem(row) not in seen:
            seen.add(row_problem(row))
            rows.append(row)
    return rows


@torch.no_grad()
def sample_policy_pairs(
    model_dir: str, rows: list[dict], samples: int, per_problem: int, seed: int
) -> list[dict]:
    """Preference pairs from the policy's own answers: ``samples`` responses per prompt
    sampled from ``model_dir`` (temperature 1, at most ``MAX_RESPONSE`` tokens, as GRPO
    samples them), each marked right or wrong by the rule scorer; up to ``per_problem``
    pairs per prompt of a right response (chosen) against a wrong one (rejected)."""
    tokenizer = load_tokenizer(model_dir)
    tokenizer.padding_side = "left"
    model = load_causal_lm(model_dir).eval()
    bf16 = auto_select_precision("cpu")["actor"] == "bf16"
    torch.manual_seed(seed)
    pairs = []
    for start in range(0, len(rows), 16):
        batch = rows[start : start + 16]
        texts = [
            tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
            for r in batch
        ]
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            ids = model.generate(
                **enc,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=MAX_RESPONSE,
                num_return_sequences=samples,
                pad_token_id=tokenizer.pad_token_id,
            )
        answers = tokenizer.batch_decode(
            ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True
        )
        for i, row in enumerate(batch):
            truth = row["reward_model"]["ground_truth"]
            mine = list(dict.fromkeys(a.strip() for a in answers[i * samples : (i + 1) * samples]))
            right = [a for a in mine if compute_score(a, truth)["acc"] > 0.5]
            wrong = [a for a in mine if a and compute_score(a, truth)["acc"] <= 0.5]
            for k in range(min(max(len(right), len(wrong)), per_problem) if right and wrong else 0):
                pair = {"chosen": right[k % len(right)], "rejected": wrong[k % len(wrong)]}
                pairs.append({"prompt": row["prompt"], **pair, "error": "policy"})
    return pairs


def write_policy_pairs(
    model_dir: str, out: Path, held_out: set, args: argparse.Namespace
) -> dict[str, str]:
    """``rm_train`` / ``rm_val`` files of :func:`sample_policy_pairs` on RM problems (the
    validation problems kept out of train; neither has an RL validation problem); a split
    without any pair is left out."""
    val_rows = _problems(args.rm_val_problems, args, 11, held_out)
    train_rows = _problems(
        args.rm_problems, args, 12, held_out | {row_problem(r) for r in val_rows}
    )
    files: dict[str, Any] = {}
    for name, rows, seed in (("rm_train", train_rows, 1), ("rm_val", val_rows, 2)):
        pairs = sample_policy_pairs(model_dir, rows, args.rm_samples, args.policy_pairs, seed)
        if pairs:  # else the synthetic pairs stay (a tiny smoke run may sample none)
            files[name] = write_records(pairs, out / "rm" / f"policy_{name}.parquet")
        logging.getLogger(__name__).warning(
            "%s: %d policy pairs on %d problems", name, len(pairs), len(rows)
        )
    if args.rm_pairs == "mixed":  # + right number vs a wrong number, none on a val problem
        synthetic, _ = write_answer_pairs(
            out / "rm" / "synthetic",
            args.rm_problems,
            0,
            args.digits,
            args.ops,
            seed=1,
            wrong_per_problem=args.wrong_per_problem,
            exclude=held_out | {row_problem(r) for r in val_rows},
        )
        files["rm_train"] = [*([files["rm_train"]] if "rm_train" in files else []), synthetic]
    return files


def common(out: Path, name: str, steps: int, lr: float) -> list[str]:
    return [
        f"optim.lr={lr}",
        "optim.weight_decay=0.0",
        f"trainer.total_training_steps={steps}",
        "trainer.logger=[jsonl]",
        f"trainer.default_local_dir={out / name / 'ckpt'}",
        f"trainer.log_dir={out / name / 'logs'}",
        "trainer.resume_mode=disable",
    ]


def run_sft(base: Path | str, data: dict, out: Path, args: argparse.Namespace) -> dict:
    cfg = load_sft_config(
        overrides=[
            f"model.path={base}",
            f"data.train_files=[{data['sft']}]",
            f"data.max_length={MAX_PROMPT + MAX_RESPONSE}",
            "data.train_batch_size=8",
            "data.micro_batch_size_per_device=8",
            "trainer.val_before_train=false",
            *common(out, "sft", args.sft_steps, args.sft_lr),
        ]
    )
    results = SFTTrainer(cfg).train()
    return {"dir": results["hf_dir"], "loss": [m["train/loss"] for m in results["history"]]}


def _as_list(files: str | list[str]) -> list[str]:
    return files if isinstance(files, list) else [files]


def rm_config(sft_dir: str, data: dict, out: Path, args: argparse.Namespace) -> Any:
    """The reward-model stage's validated config: from ``sft_dir``, on ``data["rm_train"]``
    (one file or a list), validated on ``data["rm_val"]``."""
    return load_rm_config(
        overrides=[
            f"model.path={sft_dir}",
            f"data.train_files=[{','.join(map(str, _as_list(data['rm_train'])))}]",
            f"data.val_files=[{data['rm_val']}]",
            f"data.max_prompt_length={MAX_PROMPT}",
            f"data.max_length={MAX_PROMPT + MAX_RESPONSE}",
            f"data.train_batch_size={args.rm_batch}",
            f"data.micro_batch_size_per_device={args.rm_batch}",
            f"trainer.test_freq={args.rm_val_every}",
            f"engine.precision={args.rm_precision}",
            # 16 sequences of ~50 tokens: recomputing activations would only cost time here
            "model.enable_gradient_checkpointing=false",
            f"model.lora_rank={args.rm_lora_rank}",
            *([f"model.lora_alpha={2 * args.rm_lora_rank}"] if args.rm_lora_rank else []),
            *common(out, "rm", args.rm_steps, args.rm_lr),
        ]
    )


def run_rm(sft_dir: str, data: dict, out: Path, args: argparse.Namespace) -> dict:
    results = RMTrainer(rm_config(sft_dir, data, out, args)).train()
    return {
        "dir": results["hf_dir"],
        "loss": [m["train/loss"] for m in results["history"]],
        "acc": [m["train/acc"] for m in results["history"]],
        "val": results["val_history"],
    }


class MeasuredReward(RewardFunction):
    """The reward model's reward (``reward``), with each training batch also measured by
    the rule scorer (``rule``), which is never used as the reward: ``rule_acc`` (fraction
    of sampled answers that are right) and ``rm_pair_acc`` (over the (right, wrong) answer
    pairs to one prompt, the fraction the reward model scored right above wrong)."""

    def __init__(self, reward: RewardFunction, rule: RewardFunction) -> None:
        self.reward, self.rule = reward, rule

    def __call__(self, gen: Any, *, update_stats: bool = True) -> tuple[torch.Tensor, dict, dict]:
        scores, metrics, extras = self.reward(gen, update_stats=update_stats)
        if update_stats:
            _, _, rule = self.rule(gen)
            right = np.asarray(rule.get("acc", rule["score"]), dtype=float) > 0.5
            rm = np.asarray(extras["score"], dtype=float)
            uid = np.asarray(gen.non_tensor_batch["uid"])
            ordered = [
                float(rm[i] > rm[j])
                for i in range(len(uid))
                for j in range(len(uid))
                if uid[i] == uid[j] and right[i] and not right[j]
            ]
            metrics["rule_acc"] = float(right.mean())
            metrics["rm_pair_acc"] = float(np.mean(ordered)) if ordered else float("nan")
            metrics["rm_pairs"] = float(len(ordered))
        return scores, metrics, extras

    def state_dict(self) -> dict[str, Any] | None:
        return self.reward.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self.reward.load_state_dict(state)

    def close(self) -> None:
        self.reward.close()


def grpo_config(
    sft_dir: str, rm_dir: str | None, data: dict, out: Path, args: argparse.Namespace
) -> Any:
    """The GRPO stage's validated RL config: from ``sft_dir`` with the reward model
    ``rm_dir`` as the only reward (None: the rule scorer's reward, the control run), and with
    ``args.kl_coef > 0`` a KL(actor || reference) loss term of that coefficient (the
    reference is the initial policy; k3, ``low_var_kl``)."""
    reward = (
        ["reward_model.enable=true", f"reward_model.model.path={rm_dir}"]
        if rm_dir is not None
        else ["reward_model.enable=false"]
    )
    kl = (
        [
            "actor_rollout_ref.actor.use_kl_loss=true",
            f"actor_rollout_ref.actor.kl_loss_coef={args.kl_coef}",
            "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
            f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_device={args.prompts * args.n}",
        ]
        if args.kl_coef > 0
        else ["actor_rollout_ref.actor.use_kl_loss=false"]
    )
    return load_config(
        overrides=[
            f"actor_rollout_ref.model.path={sft_dir}",
            f"data.train_files=[{data['rl_train']}]",
            f"data.val_files=[{data['rl_val']}]",
            f"data.max_prompt_length={MAX_PROMPT}",
            f"data.max_response_length={MAX_RESPONSE}",
            f"data.train_batch_size={args.prompts}",
            f"actor_rollout_ref.rollout.n={args.n}",
            "actor_rollout_ref.rollout.temperature=1.0",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_device={args.prompts * args.n}",
            f"actor_rollout_ref.actor.optim.lr={args.grpo_lr}",
            "algorithm.adv_estimator=grpo",
            *kl,
            *reward,
            f"reward_model.micro_batch_size_per_device={args.prompts * args.n}",
            f"trainer.total_training_steps={args.grpo_steps}",
            "trainer.val_before_train=true",
            f"trainer.test_freq={args.val_every}",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={out / 'grpo' / 'ckpt'}",
            f"trainer.log_dir={out / 'grpo' / 'logs'}",
            f"trainer.rollout_data_dir={out / 'grpo' / 'rollouts'}",
            f"trainer.validation_data_dir={out / 'grpo' / 'validation'}",
            "trainer.resume_mode=disable",
        ]
    )


def last_validation_samples(out: Path, k: int = 4) -> list[dict]:
    """``k`` wrong answers (else any) of the last greedy validation, as the policy wrote
    them: prompt's question, response, ground truth (from ``trainer.validation_data_dir``)."""
    files = sorted((out / "grpo" / "validation").glob("*.jsonl"), key=lambda f: int(f.stem))
    if not files:
        return []
    rows = [json.loads(line) for line in files[-1].read_text().splitlines() if line.strip()]
    wrong = [r for r in rows if compute_score(r["response"], r["ground_truth"])["acc"] <= 0.5]
    return [
        {"step": int(files[-1].stem), **{key: r[key] for key in ("response", "ground_truth")}}
        for r in (wrong or rows)[:k]
    ]


def run_grpo(
    sft_dir: str, rm_dir: str | None, data: dict, out: Path, args: argparse.Namespace
) -> dict:
    """GRPO of :func:`grpo_config`; per step the measured metrics, and the validations."""
    trainer = RLTrainer(grpo_config(sft_dir, rm_dir, data, out, args))
    trainer.reward_fn = MeasuredReward(trainer.reward_fn, trainer.val_reward_fn)
    try:
        trainer.fit()
        steps = [
            {
                "step": step,
                "rule_acc": m["rule_acc"],
                "rm_pair_acc": m["rm_pair_acc"],
                "rm_score_mean": m.get("reward/model_score_mean"),
                "kl": m.get("actor/kl_loss"),
                "response_length": m.get("response_length/mean"),
                "step_seconds": m.get("timing_s/step"),
            }
            for step, m in enumerate(trainer.history, start=1)
        ]
        val = [{"step": v["step"], "acc": v["val/acc"]} for v in trainer.validation_history]
    finally:
        trainer.close()
    return {"steps": steps, "val": val, "samples": last_validation_samples(out)}


# model -> defaults of the settings that differ between the embedded SmolLM2 and the tiny model
# SmolLM2-Instruct already answers in the prompt's format (50% right, greedy), so its SFT is
# skipped and its reward model trains LoRA adapters (and the new score head) in bf16 autocast.
# Its reward model also trains on right-vs-wrong bare numbers (mixed pairs) and its GRPO has a
# KL loss of 3.0 to the initial policy: without both the policy collapses from 0.75 to 0.08
# greedy accuracy on answers the reward model over-rates (docs/reward_model.md).
DEFAULTS = {
    "smollm2": dict(
        sft_steps=0,
        sft_lr=1e-5,
        rm_steps=30,
        rm_lr=3e-4,
        rm_lora_rank=16,
        rm_precision="auto",
        rm_pairs="mixed",
        grpo_lr=2e-5,
        kl_coef=3.0,
        threads=2,
    ),
    "tiny": dict(
        sft_steps=300,
        sft_lr=3e-3,
        rm_steps=300,
        rm_lr=1e-3,
        rm_lora_rank=0,
        rm_precision="none",
        rm_pairs="synthetic",
        grpo_lr=1e-3,
        kl_coef=0.0,
        threads=1,
    ),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="working directory (data, models, logs)")
    p.add_argument("--model", choices=sorted(DEFAULTS), default="smollm2")
    p.add_argument("--digits", type=int, default=1)
    p.add_argument("--ops", nargs="+", default=["+", "*"])
    p.add_argument("--val-size", type=int, default=64, help="held-out RL validation prompts")
    p.add_argument("--sft-steps", type=int, help="SFT steps of 8 rows (0: no SFT)")
    p.add_argument("--sft-lr", type=float)
    p.add_argument("--rm-problems", type=int, default=64, help="problems of the RM pairs")
    p.add_argument("--rm-val-problems", type=int, default=24, help="held-out RM problems")
    p.add_argument("--wrong-per-problem", type=int, default=2, help="RM pairs per problem")
    p.add_argument("--rm-steps", type=int)
    p.add_argument("--rm-lr", type=float)
    p.add_argument("--rm-batch", type=int, default=8, help="pairs per RM step")
    p.add_argument("--rm-lora-rank", type=int, help="RM LoRA rank (0: train every weight)")
    p.add_argument(
        "--rm-pairs",
        choices=["policy", "synthetic", "mixed"],
        help="RM pairs: the policy's own sampled answers marked by the rule scorer (policy), "
        "the right answer against made-up wrong numbers (synthetic), or both for training "
        "(mixed; validated on the policy pairs)",
    )
    p.add_argument("--rm-samples", type=int, default=8, help="policy samples per RM problem")
    p.add_argument("--policy-pairs", type=int, default=4, help="policy pairs per RM problem")
    p.add_argument("--rm-precision", choices=["none", "bf16", "auto"], help="RM engine.precision")
    p.add_argument(
        "--rm-val-every", type=int, default=30, help="RM steps between held-out evaluations"
    )
    p.add_argument("--grpo-steps", type=int, default=16)
    p.add_argument("--grpo-lr", type=float)
    p.add_argument("--prompts", type=int, default=8, help="prompts per GRPO step")
    p.add_argument("--n", type=int, default=4, help="responses per prompt")
    p.add_argument("--val-every", type=int, default=4, help="GRPO steps between validations")
    p.add_argument("--threads", type=int, help="torch threads")
    p.add_argument(
        "--reward",
        choices=["rm", "rule"],
        default="rm",
        help="GRPO's reward: the trained reward model (rm), or the rule scorer (rule: the "
        "control run, no reward model is trained)",
    )
    p.add_argument(
        "--kl-coef",
        type=float,
        help="GRPO's KL(actor || initial policy) loss coefficient (0: no KL term and no "
        "reference model)",
    )
    p.add_argument(
        "--rm-model",
        help="a trained reward model directory (an earlier run's <out>/rm/ckpt/huggingface): "
        "GRPO scores with it, no RM pairs are sampled and no RM is trained",
    )
    p.add_argument("--smoke", action="store_true", help="2 steps of each stage, small batches")
    args = p.parse_args(argv)
    for key, value in DEFAULTS[args.model].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.kl_coef < 0:
        p.error(f"--kl-coef {args.kl_coef}: a KL coefficient is >= 0 (0 = no KL term)")
    if args.rm_model is not None and args.reward == "rule":
        p.error("--rm-model with --reward rule: the control run uses no reward model")
    if args.smoke:
        args.sft_steps = args.rm_steps = args.grpo_steps = 2
        args.val_size, args.rm_problems, args.rm_val_problems = 4, 8, 2
        args.rm_batch, args.rm_val_every = 4, 2
        args.prompts, args.n, args.val_every = 2, 2, 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    start = time.monotonic()
    data = make_data(out, args)
    if args.model == "smollm2":
        base: Path | str = "smollm2-135m-instruct"
    else:
        base = save_tiny_model_dir(
            out / "tiny", hidden_size=128, num_layers=4, intermediate_size=256, seed=0
        )
    if args.sft_steps > 0:
        sft = run_sft(base, data, out, args)
    else:  # the base model is the policy and the reward model's backbone
        sft = {"dir": str(base), "loss": []}
    sft_seconds = time.monotonic() - start
    if args.rm_model is not None:  # an earlier run's reward model: no pairs, no RM training
        rm = {"dir": args.rm_model, "loss": [], "acc": [], "val": []}
    elif args.reward == "rm":
        if args.rm_pairs in ("policy", "mixed"):
            held_out = {row_problem(r.data) for r in read_records(data["rl_val"]).records}
            data |= write_policy_pairs(sft["dir"], out, held_out, args)
        rm = run_rm(sft["dir"], data, out, args)
    else:
        rm = {"dir": None, "loss": [], "acc": [], "val": []}
    rm_seconds = time.monotonic() - start - sft_seconds
    grpo = run_grpo(sft["dir"], rm["dir"], data, out, args)
    total = time.monotonic() - start
    result = {
        "args": vars(args),
        "sft": {"seconds": round(sft_seconds, 1), "loss": sft["loss"]},
        "rm": {"seconds": round(rm_seconds, 1), **{k: v for k, v in rm.items() if k != "dir"}},
        "grpo": {"seconds": round(total - sft_seconds - rm_seconds, 1), **grpo},
        "total_seconds": round(total, 1),
    }
    (out / "pipeline.json").write_text(json.dumps(result, indent=1))
    if sft["loss"]:
        print(
            f"SFT: {args.sft_steps} steps, {sft_seconds:.0f} s, loss {sft['loss'][0]:.3f} -> "
            f"{sft['loss'][-1]:.3f}"
        )
    val = rm["val"]
    if val:
        print(
            f"RM: {args.rm_steps} steps, {rm_seconds:.0f} s, loss {rm['loss'][0]:.3f} -> "
            f"{rm['loss'][-1]:.3f}, held-out pair accuracy {val[0]['val/acc']:.3f} (step "
            f"{val[0]['step']}) -> {val[-1]['val/acc']:.3f} (step {val[-1]['step']})"
        )
    print("GRPO step  rule_acc (sampled)  rm_pair_acc  seconds")
    for s in grpo["steps"]:
        print(
            f"{s['step']:9d}  {s['rule_acc']:18.3f}  {s['rm_pair_acc']:11.3f}"
            f"  {s['step_seconds'] or 0:7.1f}"
        )
    print("validation after step  acc (greedy, rule scorer)")
    for v in grpo["val"]:
        print(f"{v['step']:21d}  {v['acc']:.3f}")
    for sample in grpo["samples"]:
        print(
            f"after step {sample['step']} the policy wrote {sample['response']!r} "
            f"(truth {sample['ground_truth']})"
        )
    print(f"total {total:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
