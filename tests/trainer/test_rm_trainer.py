"""Reward-model training (verl/trainer/offline/rm.py): the Bradley-Terry loss and accuracy on
hand-made pairs, learning on a tiny model, LoRA with a fully trained score head, the export
loading as ``reward_model.model.path`` and scoring as in training, ``main_rm`` / ``verl rm``,
and exact resume after a crash."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from verl.cli import main as verl_main
from verl.cli import rm as main_rm
from verl.cli.config_gen import default_yaml, with_tables
from verl.config import ConfigError, RMConfig, TrainerConfig, load_rm_config
from verl.data.io import write_records
from verl.models import load_reward_model
from verl.models.tiny import build_tiny_tokenizer
from verl.protocol import DataProto
from verl.trainer.lifecycle.checkpoint import complete_checkpoints
from verl.trainer.offline.rm import RMTrainer, reward_pair_loss, reward_pair_metrics
from verl.workers.reward_model import RewardModelWorker
from verl.workers.specs import reward_model_spec

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def pairs(n: int) -> list[dict]:
    return [
        {
            "prompt": f"What is {i} + {i % 3}?",
            "chosen": f"The answer is {i + i % 3}.",
            "rejected": f"The answer is {i + i % 3 + 2}.",
        }
        for i in range(n)
    ]


def config(tmp_path: Path, model_dir: Path, *extra: str, rows: list[dict] | None = None):
    train = write_records(rows or pairs(8), tmp_path / "pairs.jsonl")
    return load_rm_config(
        overrides=[
            f"model.path={model_dir}",
            f"data.train_files={train}",
            f"data.val_files={train}",
            "data.train_batch_size=8",
            "data.micro_batch_size_per_device=4",
            "optim.lr=1e-3",
            "trainer.total_training_steps=12",
            "trainer.logger=[jsonl]",
            "trainer.device=cpu",
            f"trainer.default_local_dir={tmp_path / 'out'}",
            f"trainer.log_dir={tmp_path / 'out'}",
            *extra,
        ]
    )


def test_loss_and_accuracy_on_hand_made_pairs():
    chosen = torch.tensor([2.0, 0.0, 1.0, 0.5])
    rejected = torch.tensor([0.0, 0.0, 3.0, 0.5])
    losses = reward_pair_loss(chosen, rejected)
    # -log sigmoid(d) = log(1 + exp(-d)) for d = 2, 0, -2, 0
    want = [math.log1p(math.exp(-2)), math.log(2), math.log1p(math.exp(2)), math.log(2)]
    assert losses.tolist() == pytest.approx(want, rel=1e-6)
    # a margin m asks for chosen - rejected > m: d - m = 1, -1, -2, -0.5
    margin = torch.tensor([1.0, 1.0, 0.0, 0.5])
    with_margin = reward_pair_loss(chosen, rejected, margin)
    assert with_margin.tolist() == pytest.approx(
        [math.log1p(math.exp(d)) for d in (-1.0, 1.0, 2.0, 0.5)],
        rel=1e-6,
    )
    metrics = reward_pair_metrics(chosen, rejected, "val/")
    # ties count as wrong: only pair 0 is ordered right
    assert metrics == pytest.approx(
        {
            "val/acc": 0.25,
            "val/margin": 0.0,
            "val/rewards/chosen": 0.875,
            "val/rewards/rejected": 0.875,
        }
    )
    with pytest.raises(ValueError, match=r"must both be \(pairs,\)"):
        reward_pair_loss(chosen, rejected[:2])


def _score_alone(model: torch.nn.Module, ids: list[int]) -> float:
    """HF's own forward on one unpadded sequence: the reference reward."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, 0].item()


def test_trainer_loss_and_accuracy_match_the_formula_and_learn(tmp_path, tiny_model_dir, tok):
    trainer = RMTrainer(
        config(tmp_path, tiny_model_dir, "optim.lr=5e-3", "trainer.total_training_steps=16")
    )
    module = trainer.engine.module
    assert type(module).__name__ == "Qwen2ForSequenceClassification"
    assert module.config.num_labels == 1 and module.config.pad_token_id == tok.pad_token_id

    # Before training: the trainer's val/loss and val/acc are the formula's over rewards
    # read by HF on each unpadded sequence (prompt + completion + eos) alone.
    module.eval()
    chosen, rejected = [], []
    for item in trainer.val_dataset:
        chosen.append(_score_alone(module, item["prompt_ids"] + item["chosen_ids"]))
        rejected.append(_score_alone(module, item["prompt_ids"] + item["rejected_ids"]))
    c, r = torch.tensor(chosen), torch.tensor(rejected)
    before = trainer.evaluate()
    assert before["val/loss"] == pytest.approx(float(reward_pair_loss(c, r).mean()), abs=1e-5)
    assert before["val/acc"] == float((c > r).float().mean())
    assert before["val/margin"] == pytest.approx(float((c - r).mean()), abs=1e-5)

    results = trainer.train()
    history = results["history"]
    assert history[0]["train/loss"] == pytest.approx(before["val/loss"], abs=1e-5)  # one batch
    assert history[-1]["train/loss"] < 0.5 * history[0]["train/loss"]
    after = results["val_after"]
    assert after["val/acc"] == 1.0 and after["val/margin"] > 1.0
    assert after["val/loss"] < 0.5 * before["val/loss"]
    for key in ("train/acc", "train/margin", "train/rewards/chosen", "train/grad_norm"):
        assert key in history[0]
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").open()]
    assert sum("train/loss" in row for row in rows) == 16


def test_margin_column_enters_the_loss(tmp_path, tiny_model_dir):
    rows = [{**row, "margin": float(i % 2)} for i, row in enumerate(pairs(8))]
    trainer = RMTrainer(config(tmp_path, tiny_model_dir, rows=rows))
    assert trainer.train_dataset.has_margins
    assert [it["margin"] for it in trainer.val_dataset] == [0.0, 1.0] * 4
    mb = trainer.micro_collate([trainer.val_dataset[i] for i in range(4)])[0]
    assert mb["margin"].tolist() == [0.0, 1.0, 0.0, 1.0]
    trainer.engine.module.eval()
    with torch.no_grad():
        c, r = trainer.pair_rewards(trainer.engine.module, mb)
        losses, _, _ = trainer._pair_losses(trainer.engine.module, mb)
    assert losses.tolist() == pytest.approx((-F.logsigmoid(c - r - mb["margin"])).tolist())

    # Ignoring the column: every margin is 0.
    ignoring = RMTrainer(
        config(tmp_path / "null", tiny_model_dir, "data.margin_key=null", rows=rows)
    )
    assert {it["margin"] for it in ignoring.train_dataset} == {0.0}


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (
            [{**p, "margin": 1.0} for p in pairs(2)] + pairs(2),
            r"pairs\.jsonl line 3: no 'margin' value, but .*line 1 has one",
        ),
        ([{**p, "margin": "big"} for p in pairs(2)], r"'margin' must be a number, got str 'big'"),
        ([{**p, "margin": True} for p in pairs(2)], r"'margin' must be a number, got bool"),
        (
            [{"prompt": "1 + 1?", "completion": "2", "label": True}] * 2,
            r"labelled completions .*a reward model trains on pairs",
        ),
    ],
)
def test_bad_rows_are_refused(tmp_path, tiny_model_dir, rows, message):
    with pytest.raises(ValueError, match=message):
        RMTrainer(config(tmp_path, tiny_model_dir, "data.train_batch_size=2", rows=rows))


def rm_batch(trainer: RMTrainer, items: list[dict]) -> DataProto:
    """Prompt (left-padded) + chosen completion (right-padded) as a rollout batch."""
    mb = trainer.micro_collate(items)[0]
    n = len(items)
    width = mb["response_mask"].shape[1]
    return DataProto.from_dict(
        tensors={
            "input_ids": mb["input_ids"][:n],
            "attention_mask": mb["attention_mask"][:n],
            "responses": mb["input_ids"][:n, -width:],
            "response_mask": mb["response_mask"][:n],
        }
    )


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_export_loads_as_the_rl_reward_model(tmp_path, tiny_model_dir, tok, lora_rank):
    cfg = config(tmp_path, tiny_model_dir, f"model.lora_rank={lora_rank}")
    trainer = RMTrainer(cfg)
    module = trainer.engine.module
    if lora_rank:
        trainable = {n for n, p in module.named_parameters() if p.requires_grad}
        assert {"score.weight"} <= trainable  # the new head trains in full
        assert all(".lora_" in n for n in trainable - {"score.weight"})
        head_before = module.score.weight.detach().clone()
        body_weight = module.model.layers[0].mlp.up_proj.base_layer.weight.detach().clone()
    results = trainer.train()
    if lora_rank:
        assert not torch.equal(module.score.weight, head_before)
        assert torch.equal(module.model.layers[0].mlp.up_proj.base_layer.weight, body_weight)
        assert results["val_after"]["val/acc"] >= 0.75

    # As reward_model.model.path: the RL worker's scores are the trainer's rewards.
    rl = TrainerConfig(mixed_precision="none")
    rl.trainer.device = "cpu"
    rl.reward_model.enable = True
    rl.reward_model.model.path = results["hf_dir"]
    worker = RewardModelWorker(reward_model_spec(rl), actor_tokenizer=tok)
    worker.init_model()
    assert worker.retokenize is False  # the export holds the training tokenizer
    items = [trainer.val_dataset[i] for i in range(4)]
    rm_scores = worker.compute_rm_score(rm_batch(trainer, items)).batch["rm_scores"]
    module.eval()
    with torch.no_grad():
        chosen, _ = trainer.pair_rewards(module, trainer.micro_collate(items)[0])
    assert rm_scores.sum(-1).tolist() == pytest.approx(chosen.tolist(), abs=1e-4)
    loaded = load_reward_model(results["hf_dir"])
    assert type(loaded).__name__ == "Qwen2ForSequenceClassification"
    assert not any(".lora_" in k for k in load_file(Path(results["hf_dir"]) / "model.safetensors"))


def test_bf16_precision_autocasts_over_fp32_weights_and_learns(
    tmp_path, tiny_model_dir, monkeypatch
):
    fp32 = RMTrainer(config(tmp_path / "fp32", tiny_model_dir))
    bf16 = RMTrainer(config(tmp_path / "bf16", tiny_model_dir, "engine.precision=bf16"))
    assert fp32.engine.autocast_dtype is None and bf16.engine.autocast_dtype == torch.bfloat16
    assert {p.dtype for p in bf16.engine.module.parameters()} == {torch.float32}
    # Same weights (same seed): the bf16 rewards are the fp32 ones within bf16 rounding.
    before_fp32, before_bf16 = fp32.evaluate(), bf16.evaluate()
    for key in ("val/rewards/chosen", "val/rewards/rejected"):
        assert before_bf16[key] == pytest.approx(before_fp32[key], abs=0.05)
    assert before_bf16[key] != before_fp32[key]  # the forward did run in bf16
    after = bf16.train()["val_after"]
    # 12 steps: native bf16 ends below 0.7x the first loss, emulated bf16 (a CPU without
    # avx512_bf16, other rounding) at 0.72x
    assert after["val/acc"] == 1.0 and after["val/loss"] < 0.8 * before_bf16["val/loss"]
    # auto: what verl.config.precision picks for a trainable role on this device
    monkeypatch.setattr(
        "verl.trainer.offline.rm.auto_select_precision", lambda d: {"critic": "none"}
    )
    auto = RMTrainer(config(tmp_path / "auto", tiny_model_dir, "engine.precision=auto"))
    assert auto.engine.autocast_dtype is None


def test_verl_rm_command_and_config_checks(tmp_path, tiny_model_dir, capsys):
    train = write_records(pairs(4), tmp_path / "pairs.parquet")
    out = tmp_path / "run"
    code = verl_main(
        [
            "rm",
            f"model.path={tiny_model_dir}",
            f"data.train_files=[{train}]",
            "data.train_batch_size=2",
            "data.micro_batch_size_per_device=1",
            "optim.lr=1e-3",
            "trainer.total_training_steps=2",
            "trainer.save_freq=2",
            "trainer.logger=[console]",
            f"trainer.default_local_dir={out}",
            f"trainer.log_dir={out}",
        ]
    )
    assert code == 0
    assert "train/loss:" in capsys.readouterr().out
    assert load_reward_model(out / "huggingface").config.num_labels == 1
    assert [step for step, _ in complete_checkpoints(out)] == [2]
    manifest = json.loads((out / "global_step_2" / "checkpoint.json").read_text())
    assert manifest["trainer"] == "rm"

    assert main_rm.main(["data.margin_key=", "data.max_prompt_length=600"]) == 2
    err = capsys.readouterr().err
    assert "data.margin_key='': must not be empty" in err
    assert "data.max_prompt_length=600: leaves no room" in err
    with pytest.raises(ConfigError, match=r"data\.train_batch_size=0"):
        load_rm_config(overrides=["data.train_batch_size=0"])
    assert load_rm_config() == RMConfig()


def test_generated_defaults_and_docs_table_are_current():
    committed = (ROOT / "verl/trainer/config/rm_trainer.yaml").read_text()
    assert committed == default_yaml("rm"), (
        "rm_trainer.yaml is stale: python -m verl.trainer.main_rm --print-defaults "
        "> verl/trainer/config/rm_trainer.yaml"
    )
    doc = (ROOT / "docs/reward_model.md").read_text()
    assert "BEGIN GENERATED RM CONFIG TABLE" in doc
    assert doc == with_tables(doc), (
        "docs/reward_model.md table is stale: python -m verl.cli.config_gen docs "
        "docs/reward_model.md"
    )


# ---------------------------------------------------------------------- exact resume

# Four steps with state that carries over: AdamW moments, a cosine schedule with warmup, a
# shuffled loader whose 10 pairs in batches of 4 cross an epoch boundary, validation every 2.
EXACT = (
    "data.arithmetic.train_size=10",
    "data.arithmetic.val_size=4",
    "data.train_batch_size=4",
    "data.micro_batch_size_per_device=2",
    "optim.lr=1e-3",
    "optim.warmup_style=cosine",
    "optim.lr_warmup_steps=1",
    "trainer.total_training_steps=4",
    "trainer.save_freq=2",
    "trainer.test_freq=2",
    "trainer.val_before_train=false",
    "trainer.logger=[jsonl]",
    "trainer.device=cpu",
)


class _Crash(Exception):
    """Stands for a crash of the run in the middle of a step."""


def _exact_config(model_dir: Path, run_dir: Path, *extra: str) -> RMConfig:
    return load_rm_config(
        overrides=[
            f"model.path={model_dir}",
            *EXACT,
            f"trainer.num_threads={torch.get_num_threads()}",
            f"trainer.default_local_dir={run_dir}",
            f"trainer.log_dir={run_dir}",
            *extra,
        ]
    )


def _comparable(metrics: dict) -> dict:
    return {
        k: v
        for k, v in metrics.items()
        if not k.startswith("timing_s/") and k not in ("train/tokens_per_s", "step", "time")
    }


def _checkpoint_tensors(step_dir: Path) -> dict[str, torch.Tensor]:
    out = {f"model/{k}": t for k, t in load_file(step_dir / "actor" / "model.safetensors").items()}
    optim = torch.load(step_dir / "actor" / "optim_tensors.pt", weights_only=True)
    return out | {f"optim/{k}": t for k, t in optim.items()}


@pytest.mark.slow
@pytest.mark.parametrize("lora_rank", [0, 4])
def test_rm_resumes_bit_for_bit_after_a_crash(tiny_model_dir, tmp_path, lora_rank):
    extra = (f"model.lora_rank={lora_rank}",)
    straight = RMTrainer(_exact_config(tiny_model_dir, tmp_path / "straight", *extra))
    straight_results = straight.train()

    cfg = _exact_config(tiny_model_dir, tmp_path / "run", *extra)
    first = RMTrainer(cfg)
    real_step = first.train_step

    def train_step(micro_batches):
        if first.global_step >= 3:
            raise _Crash
        return real_step(micro_batches)

    first.train_step = train_step
    with pytest.raises(_Crash):
        first.train()
    # A new process would start the same way: the new head's init is drawn, then replaced.
    second = RMTrainer(cfg)
    results = second.train()
    assert second.resumed_from == tmp_path / "run" / "global_step_2"
    assert [m["train/epoch"] for m in straight.history] == [0, 0, 1, 1]
    got = [_comparable(m) for m in first.history[:2] + second.history]
    assert got == [_comparable(m) for m in straight.history]
    assert results["val_after"] == straight_results["val_after"]
    a = _checkpoint_tensors(tmp_path / "run" / "global_step_4")
    b = _checkpoint_tensors(tmp_path / "straight" / "global_step_4")
    assert a.keys() == b.keys()
    assert not [k for k in a if not torch.equal(a[k], b[k])]
    exported = load_file(tmp_path / "run" / "huggingface" / "model.safetensors")
    want = load_file(tmp_path / "straight" / "huggingface" / "model.safetensors")
    assert exported.keys() == want.keys()
    assert all(torch.equal(exported[k], want[k]) for k in want)


@pytest.mark.slow
def test_two_fsdp2_ranks_train_like_one_process(ray_session, tiny_model_dir, tmp_path):
    """Two FSDP2 ranks (Ray actors, gloo) with LoRA: the same losses, accuracies and
    exported reward model as one process, up to float reduction order."""
    from verl.trainer.offline.launch import train_on_ranks

    lora = ("model.lora_rank=4", "trainer.num_threads=1")
    one = RMTrainer(_exact_config(tiny_model_dir, tmp_path / "one", *lora)).train()
    two = train_on_ranks(
        "rm",
        _exact_config(
            tiny_model_dir,
            tmp_path / "two",
            *lora,
            "trainer.n_gpus_per_node=2",
            "engine.strategy=fsdp2",
        ),
    )
    assert len(two["history"]) == 4
    for a, b in zip(two["history"], one["history"]):
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-4)
        assert a["train/acc"] == b["train/acc"]
        assert a["train/margin"] == pytest.approx(b["train/margin"], abs=1e-4)
    assert two["val_after"] == pytest.approx(one["val_after"], abs=1e-4)
    manifest = json.loads((tmp_path / "two" / "global_step_4" / "checkpoint.json").read_text())
    assert manifest["roles"]["actor_rollout_ref"]["strategy"] == "fsdp2"
    got = load_file(tmp_path / "two" / "huggingface" / "model.safetensors")
    want = load_file(tmp_path / "one" / "huggingface" / "model.safetensors")
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=0, atol=1e-5)
