"""SFT warm start, then GRPO, of a tiny Qwen2-VL on the synthetic visual task (CPU recipe).

No pretrained vision-language model ships offline, so the model is transformers' own
``Qwen2VLForConditionalGeneration`` built from a config (``verl.models.tiny_vision``:
vision transformer, patch merger, 3-D rope language model; random init) and the task is
drawn with PIL (``verl.data.visual_tasks``): "What colour is the square?" (6 colours) and
"How many circles are there?" (1-5), scored by ``verl.rewards.scorers.visual_shapes``.

1. data: ``--train-size`` / ``--val-size`` rows of both tasks (parquet, PNG bytes);
2. SFT warm start (this script's loop: cross-entropy on the answer word and ``<|im_end|>``,
   the prompt and image masked; images, multimodal rope index and the padded forward as
   the RL passes take them), ``--sft-steps`` steps of ``--sft-batch`` rows, then the model
   and its processor are saved as a HF directory;
3. GRPO through ``RLTrainer`` from that directory with the default config otherwise
   (the native rollout, sequence packing on), greedy validation on the held-out rows
   before training and every ``--val-every`` steps. ``rollout.seed`` defaults to
   ``trainer.seed``: runs that differ only in ``--grpo-lr`` draw the same random numbers,
   so their sampled answers differ only where the updates moved the policy enough
   (docs/vision.md).

Accuracy is measured on the held-out rows, per task, for the random model, after SFT and
after GRPO (this script's own evaluation): greedily (through the hf rollout, with the
greedy answers counted by ground truth: ``*_confusion``), and as the expected accuracy of a
sample at temperature 1 (``*_expected``: the exact probability of the right answer, what
GRPO's sampled reward estimates), beside what always giving each task's most common
held-out answer scores (a model blind to the image can do no better); printed and written
to ``<out>/curve.json``::

    PYTHONPATH=. python examples/vision_shapes_sft_grpo.py --out /tmp/vision_recipe

``--smoke`` runs 2 steps of each on small batches (the slow test). The defaults are the
measured run of docs/vision.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from verl.config import load_config
from verl.data.vision import multimodal_position_ids
from verl.data.vision_dataset import VisionRLHFDataset, collate_vision_fn
from verl.data.visual_tasks import TASKS, write_visual_dataset
from verl.kernels.torch_functional import compute_response_log_probs
from verl.models.tiny_vision import tiny_vision_model, tiny_vision_processor
from verl.protocol import DataProto
from verl.rewards.scorers.visual_shapes import compute_score
from verl.rollout import SamplingParams, build_rollout
from verl.trainer.rl.trainer import RLTrainer
from verl.workers.vision_inputs import forward_inputs

logger = logging.getLogger("vision_recipe")


def _items(dataset: VisionRLHFDataset) -> list[dict[str, Any]]:
    return [dataset[i] for i in range(len(dataset))]


def sft_batch(items: list[dict[str, Any]], tokenizer: Any, config: Any) -> tuple[Any, int]:
    """Prompt items + their answers as a rollout-shaped batch: prompts left-padded, answers
    (``answer<|im_end|>``) right-padded, the multimodal rope index over both. Returns the
    batch and the answer width."""
    prompts = collate_vision_fn(items, tokenizer.pad_token_id)
    answers = [
        tokenizer(item["ground_truth"] + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        for item in items
    ]
    width = max(len(a) for a in answers)
    rows = len(items)
    response = torch.full((rows, width), tokenizer.pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((rows, width), dtype=torch.long)
    for i, ids in enumerate(answers):
        response[i, : len(ids)] = torch.tensor(ids)
        response_mask[i, : len(ids)] = 1
    b = prompts.batch
    input_ids = torch.cat([b["input_ids"], response], dim=1)
    attention_mask = torch.cat([b["attention_mask"], response_mask], dim=1)
    types = torch.cat([b["mm_token_type_ids"], torch.zeros_like(response)], dim=1)
    grids = [r["image_grid_thw"] for r in prompts.non_tensor_batch["multi_modal_inputs"] if r]
    positions = multimodal_position_ids(
        config, input_ids, types, torch.cat(grids) if grids else None, attention_mask
    )
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "response_mask": response_mask,
        "multimodal_position_ids": positions.permute(1, 2, 0).contiguous(),
    }
    images = {"multi_modal_inputs": prompts.non_tensor_batch["multi_modal_inputs"]}
    out = DataProto.from_dict(tensors=tensors, non_tensors=images)
    return out, width


def answer_log_probs(
    model: Any, items: list[dict[str, Any]], tokenizer: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log_probs, response_mask)``, each (rows, answer tokens): the model's log-probs of
    each item's ground-truth answer given its image and question (teacher-forced)."""
    data, width = sft_batch(items, tokenizer, model.config)
    positions, inputs = forward_inputs(data)
    b = data.batch
    log_probs, _ = compute_response_log_probs(
        model,
        b["input_ids"],
        b["attention_mask"],
        positions,
        response_len=width,
        model_inputs=inputs,
    )
    return log_probs, b["response_mask"]


def run_sft(
    model: Any, items: list[dict[str, Any]], tokenizer: Any, steps: int, batch: int, lr: float
) -> list[float]:
    """``steps`` Adam steps of answer cross-entropy on rows drawn in a fixed order."""
    optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(0)
    losses = []
    model.train()
    for step in range(steps):
        pick = torch.randint(len(items), (batch,), generator=generator).tolist()
        log_probs, mask = answer_log_probs(model, [items[i] for i in pick], tokenizer)
        mask = mask.float()
        loss = -(log_probs * mask).sum() / mask.sum()
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        losses.append(loss.item())
        if step % 25 == 0 or step == steps - 1:
            logger.info("sft step %d: loss %.3f", step, loss)
    model.eval()
    return losses


@torch.no_grad()
def greedy_answers(model: Any, items: list[dict[str, Any]], tokenizer: Any) -> list[str]:
    """Each item's greedy response (4 tokens at most, as the GRPO rollout) through the hf
    rollout, decoded."""
    rollout = build_rollout("hf", model, tokenizer)
    texts: list[str] = []
    for start in range(0, len(items), 32):
        chunk = items[start : start + 32]
        gen = rollout.generate(
            collate_vision_fn(chunk, tokenizer.pad_token_id),
            SamplingParams(do_sample=False, max_new_tokens=4),
        )
        texts += tokenizer.batch_decode(gen.batch["responses"], skip_special_tokens=True)
    return texts


def _by_task(items: list[dict[str, Any]], values: list[float]) -> dict[str, float]:
    per: dict[str, list[float]] = {}
    for item, value in zip(items, values, strict=True):
        per.setdefault(item["extra_info"]["task"], []).append(value)
    out = {task: sum(v) / len(v) for task, v in sorted(per.items())}
    out["all"] = sum(values) / len(values)
    return out


def accuracy(
    model: Any, items: list[dict[str, Any]], tokenizer: Any, texts: list[str] | None = None
) -> dict[str, float]:
    """Greedy accuracy on ``items`` (of :func:`greedy_answers`, or the given ``texts``),
    overall and per task."""
    texts = greedy_answers(model, items, tokenizer) if texts is None else texts
    scores = [
        compute_score(text, item["ground_truth"], item["extra_info"])["acc"]
        for item, text in zip(items, texts, strict=True)
    ]
    return _by_task(items, scores)


def confusion(items: list[dict[str, Any]], texts: list[str]) -> dict[str, dict[str, int]]:
    """``{"task:ground truth": {answer read: count}}`` of greedy answers (``None``: no
    candidate named)."""
    out: dict[str, Counter] = {}
    for item, text in zip(items, texts, strict=True):
        pred = compute_score(text, item["ground_truth"], item["extra_info"])["pred"]
        key = f"{item['extra_info']['task']}:{item['ground_truth']}"
        out.setdefault(key, Counter())[str(pred)] += 1
    return {k: dict(v.most_common()) for k, v in sorted(out.items())}


@torch.no_grad()
def expected_accuracy(model: Any, items: list[dict[str, Any]], tokenizer: Any) -> dict[str, float]:
    """The probability that a sample at temperature 1 is the right answer, exactly, per task:
    for each item, ``p(answer<|im_end|>)`` of its ground truth cut at 4 tokens (the GRPO
    response limit), by one teacher-forced forward. This is the quantity GRPO's sampled
    reward estimates (less the rare samples the scorer also reads as right, such as
    ``red.``); greedy accuracy only reads which answer is the most likely."""
    probs = []
    for start in range(0, len(items), 32):
        log_probs, mask = answer_log_probs(model, items[start : start + 32], tokenizer)
        mask = mask.clone()
        mask[:, 4:] = 0
        probs += (log_probs * mask).sum(-1).exp().tolist()
    return _by_task(items, probs)


def majority(items: list[dict[str, Any]]) -> dict[str, float]:
    """The accuracy of always giving each task's most common answer in ``items`` (what a
    model that ignores the image can reach at best), overall and per task."""
    answers: dict[str, Counter] = {}
    for item in items:
        answers.setdefault(item["extra_info"]["task"], Counter())[item["ground_truth"]] += 1
    out = {task: c.most_common(1)[0][1] / c.total() for task, c in sorted(answers.items())}
    out["all"] = sum(c.most_common(1)[0][1] for c in answers.values()) / len(items)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--train-size", type=int, default=600)
    p.add_argument("--val-size", type=int, default=120)
    p.add_argument("--sft-steps", type=int, default=150)
    p.add_argument("--sft-batch", type=int, default=32)
    p.add_argument("--sft-lr", type=float, default=3e-3)
    p.add_argument(
        "--sft-dir",
        default=None,
        help="a model directory an earlier run's SFT wrote (<out>/sft): skip the SFT (it is "
        "deterministic for the seed and sizes, so the same arguments give the same model)",
    )
    p.add_argument("--grpo-steps", type=int, default=150)
    p.add_argument("--grpo-batch", type=int, default=32)
    p.add_argument("--grpo-n", type=int, default=16)
    p.add_argument("--grpo-lr", type=float, default=1e-3)
    p.add_argument(
        "--grpo-tasks",
        nargs="+",
        choices=TASKS,
        default=list(TASKS),
        help="the tasks GRPO trains on (its own train rows; validation keeps both)",
    )
    p.add_argument("--val-every", type=int, default=50)
    p.add_argument(
        "--grpo-override",
        nargs="*",
        default=[],
        help="more config overrides of the GRPO run (key=value), after the recipe's",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="2 steps of each, small batches")
    args = p.parse_args(argv)
    if args.smoke:
        args.train_size, args.val_size = 32, 8
        args.sft_steps, args.sft_batch = 2, 4
        args.grpo_steps, args.grpo_batch, args.grpo_n, args.val_every = 2, 4, 2, 1
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    torch.manual_seed(args.seed)
    out = Path(args.out)
    train, val = write_visual_dataset(
        out / "data", args.train_size, args.val_size, seed=args.seed, image_size=56
    )
    processor = tiny_vision_processor()
    tokenizer = processor.tokenizer
    tokenizer.padding_side = "left"
    model = tiny_vision_model(processor, seed=args.seed)
    kwargs = dict(processor=processor, model_config=model.config, max_prompt_length=64)
    train_items = _items(VisionRLHFDataset(train, **kwargs))
    val_items = _items(VisionRLHFDataset(val, **kwargs))
    curve: dict[str, Any] = {"args": vars(args)}

    t0 = time.perf_counter()
    curve["majority"] = majority(val_items)
    curve["random"] = accuracy(model, val_items, tokenizer)
    sft_dir = out / "sft"
    if args.sft_dir is None:
        curve["sft_loss"] = run_sft(
            model, train_items, tokenizer, args.sft_steps, args.sft_batch, args.sft_lr
        )
        model.save_pretrained(sft_dir)
        processor.save_pretrained(sft_dir)
    else:
        from verl.models.vision_model import load_vision_model

        sft_dir = Path(args.sft_dir)
        model = load_vision_model(sft_dir)
    model.eval()
    texts = greedy_answers(model, val_items, tokenizer)
    curve["sft"] = accuracy(model, val_items, tokenizer, texts)
    curve["sft_confusion"] = confusion(val_items, texts)
    curve["sft_expected"] = expected_accuracy(model, val_items, tokenizer)
    curve["sft_s"] = time.perf_counter() - t0
    logger.info("random %s -> after SFT %s", curve["random"], curve["sft"])

    t0 = time.perf_counter()
    run_dir = out / "grpo"
    grpo_train = train
    if sorted(args.grpo_tasks) != sorted(TASKS):
        grpo_train, _ = write_visual_dataset(
            out / "grpo_data", args.train_size, 1, args.grpo_tasks, seed=args.seed + 1
        )
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={sft_dir}",
            f"data.train_files={grpo_train}",
            f"data.val_files={val}",
            "algorithm.adv_estimator=grpo",
            f"data.train_batch_size={args.grpo_batch}",
            "data.max_prompt_length=64",
            "data.max_response_length=4",
            f"data.seed={args.seed}",
            f"actor_rollout_ref.rollout.n={args.grpo_n}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={args.grpo_batch}",
            f"actor_rollout_ref.actor.optim.lr={args.grpo_lr}",
            "actor_rollout_ref.actor.entropy_coeff=0",
            f"trainer.total_training_steps={args.grpo_steps}",
            f"trainer.test_freq={args.val_every}",
            "trainer.mixed_precision=none",
            f"trainer.seed={args.seed}",
            "trainer.logger=[jsonl]",
            f"trainer.default_local_dir={run_dir}",
            f"trainer.log_dir={run_dir}",
            *args.grpo_override,
        ]
    )
    trainer = RLTrainer(cfg)
    trainer.fit()
    curve["grpo_s"] = time.perf_counter() - t0
    curve["grpo_history"] = [  # the sampled training answers' mean score per step
        {"step": step, "score": m.get("critic/score/mean")}
        for step, m in enumerate(trainer.history, start=1)
    ]
    curve["grpo_validation"] = trainer.validation_history
    from verl.models.vision_model import load_vision_model

    trained = load_vision_model(run_dir / "huggingface")
    trained.eval()
    texts = greedy_answers(trained, val_items, tokenizer)
    curve["grpo"] = accuracy(trained, val_items, tokenizer, texts)
    curve["grpo_confusion"] = confusion(val_items, texts)
    curve["grpo_expected"] = expected_accuracy(trained, val_items, tokenizer)
    logger.info(
        "greedy accuracy on %d held-out rows (a blind majority answer: %s): random %s, "
        "after SFT %s, after GRPO %s; expected (sampled) accuracy after SFT %s, after GRPO %s",
        len(val_items),
        curve["majority"],
        curve["random"],
        curve["sft"],
        curve["grpo"],
        curve["sft_expected"],
        curve["grpo_expected"],
    )
    (out / "curve.json").write_text(json.dumps(curve, indent=1, default=str))
    return curve


if __name__ == "__main__":
    main()
