"""DPO / IPO / KTO on a tiny model: reference log-probs computed once from the initial model,
the loss falls and reward accuracy rises, and ``main_dpo`` writes a reloadable model."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from verl.cli import dpo as main_dpo
from verl.cli.config_gen import default_yaml
from verl.config import ConfigError, DPOConfig, load_dpo_config
from verl.data.io import write_records
from verl.data.preference_dataset import collate_preference
from verl.models import load_causal_lm
from verl.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny_model_dir
from verl.trainer.offline.dpo import DPOTrainer

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


def config(tmp_path: Path, *extra: str) -> DPOConfig:
    train = write_records(pairs(8), tmp_path / "pairs.jsonl")
    return load_dpo_config(
        overrides=[
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


def test_dpo_loss_falls_and_accuracy_rises(tmp_path: Path, tok):
    model = build_tiny_model(tokenizer=tok)
    initial = copy.deepcopy(model)
    trainer = DPOTrainer(config(tmp_path), model=model, tokenizer=tok)
    results = trainer.train()

    # The reference is the initial model, scored once before the first update.
    row = trainer.train_dataset[3]
    batch = collate_preference([row], tok.pad_token_id, paired=True)
    with torch.no_grad():
        expected = trainer.completion_log_probs(initial, batch)
    assert [row["ref_chosen_logps"], row["ref_rejected_logps"]] == pytest.approx(
        expected.tolist(), abs=1e-4
    )

    before, after = results["val_before"], results["val_after"]
    assert before["val/loss"] == pytest.approx(math.log(2), abs=1e-6)  # policy == reference
    assert before["val/rewards/accuracies"] == 0.0
    history = results["history"]
    assert history[0]["train/loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert history[-1]["train/loss"] < 0.8 * history[0]["train/loss"]
    assert after["val/loss"] < 0.8 * math.log(2)
    assert after["val/rewards/accuracies"] == 1.0
    assert after["val/rewards/margins"] > 0.1
    assert after["val/rewards/chosen"] > after["val/rewards/rejected"]
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
        assert key in history[0]
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").open()]
    assert sum("train/loss" in r for r in records) == 12


@pytest.mark.parametrize("loss_type", ["ipo", "kto"])
def test_ipo_and_kto_learn(tmp_path: Path, tok, loss_type: str):
    extra = [f"algorithm.loss_type={loss_type}", "trainer.total_training_steps=8"]
    if loss_type == "ipo":
        extra.append("algorithm.beta=1.0")  # target margin 1 / (2 beta) = 0.5 nats
    else:  # 16 labelled rows per step (all of them): a less noisy z_ref and accuracy
        extra += ["algorithm.beta=0.5", "optim.lr=2e-3", "data.train_batch_size=16"]
        extra.append("data.micro_batch_size_per_device=8")
    trainer = DPOTrainer(
        config(tmp_path, *extra), model=build_tiny_model(tokenizer=tok), tokenizer=tok
    )
    results = trainer.train()
    before, after = results["val_before"], results["val_after"]
    if loss_type == "kto":
        assert len(trainer.train_dataset) == 16  # 8 pairs -> 8 desirable + 8 undesirable
        assert before["val/loss"] == pytest.approx(0.5, abs=1e-6)  # 1 - sigmoid(0)
        assert "val/kto/kl" in after
    else:
        assert before["val/loss"] == pytest.approx(0.25, abs=1e-6)  # (0 - 1/2)^2
    assert after["val/loss"] < before["val/loss"]
    assert after["val/rewards/margins"] > 0
    assert after["val/rewards/accuracies"] >= 0.75


def test_pair_losses_refuse_kto_rows(tmp_path: Path, tok):
    rows = [{"prompt": "1 + 1?", "completion": "2", "label": True}] * 4
    path = write_records(rows, tmp_path / "kto.jsonl")
    cfg = config(tmp_path, f"data.train_files=[{path}]", "data.val_files=[]")
    with pytest.raises(ValueError, match=r"algorithm\.loss_type=dpo needs chosen/rejected pairs"):
        DPOTrainer(cfg, model=build_tiny_model(tokenizer=tok), tokenizer=tok)


def test_unknown_loss_type_is_a_config_error(tmp_path: Path, tok):
    cfg = config(tmp_path, "algorithm.loss_type=dpoo")
    with pytest.raises(ConfigError, match=r"algorithm\.loss_type=dpoo: must be one of .*dpo"):
        DPOTrainer(cfg, model=build_tiny_model(tokenizer=tok), tokenizer=tok)


def test_main_dpo_writes_a_reloadable_model(tmp_path: Path, tok):
    model_dir = save_tiny_model_dir(tmp_path / "tiny", tokenizer=tok)
    train = write_records(pairs(4), tmp_path / "pairs.parquet")
    out = tmp_path / "run"
    code = main_dpo.main(
        [
            f"model.path={model_dir}",
            f"data.train_files=[{train}]",
            "data.train_batch_size=2",
            "data.micro_batch_size_per_device=1",
            "optim.lr=1e-3",
            "trainer.total_training_steps=2",
            "trainer.logger=[console]",
            f"trainer.default_local_dir={out}",
            f"trainer.log_dir={out}",
        ]
    )
    assert code == 0
    reloaded = load_causal_lm(out / "huggingface")
    original = load_causal_lm(model_dir)
    assert any(
        not torch.equal(p, original.get_parameter(n)) for n, p in reloaded.named_parameters()
    )


def test_config_checks_and_generated_defaults(capsys):
    assert (
        main_dpo.main(
            ["algorithm.beta=0", "algorithm.label_smoothing=0.2", "algorithm.loss_type=kto"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "algorithm.beta=0.0: must be > 0" in err
    assert "algorithm.label_smoothing=0.2: only the dpo loss uses it" in err
    with pytest.raises(ConfigError, match=r"data\.max_prompt_length=512: leaves no room"):
        load_dpo_config(overrides=["data.max_prompt_length=512"])
    committed = (ROOT / "verl/trainer/config/dpo_trainer.yaml").read_text()
    assert committed == default_yaml("dpo"), (
        "dpo_trainer.yaml is stale: python -m verl.trainer.main_dpo --print-defaults "
        "> verl/trainer/config/dpo_trainer.yaml"
    )
    assert load_dpo_config() == DPOConfig()
