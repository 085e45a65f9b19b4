"""SFT on a tiny model: the loss falls, packing isolates samples exactly, micro-batching is
exact, and ``main_sft`` writes a HF directory that reloads. Also: the config and its
generated defaults."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verl.cli import sft as main_sft
from verl.cli.config_gen import default_yaml, with_tables
from verl.config import ConfigError, SFTConfig, load_sft_config
from verl.config.load import load_yaml_text
from verl.data.io import write_records
from verl.models import load_causal_lm
from verl.models.tiny import build_tiny_model, build_tiny_tokenizer, save_tiny_model_dir
from verl.trainer.offline.sft import SFTTrainer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def chats(n: int) -> list[dict]:
    """``n`` chats of varied length; some are two-turn."""
    rows = []
    for i in range(n):
        messages = [
            {"role": "user", "content": f"What is {i} + {i % 3}?"},
            {"role": "assistant", "content": f"The answer is {i + i % 3}."},
        ]
        if i % 2:
            messages += [
                {"role": "user", "content": "Thanks! And times two?"},
                {"role": "assistant", "content": f"{2 * (i + i % 3)}"},
            ]
        rows.append({"messages": messages})
    return rows


def config(tmp_path: Path, *extra: str) -> SFTConfig:
    train = write_records(chats(8), tmp_path / "train.jsonl")
    return load_sft_config(
        overrides=[
            f"data.train_files={train}",
            f"data.val_files={train}",
            "data.train_batch_size=8",
            "data.micro_batch_size_per_device=4",
            "data.max_length=64",
            "optim.lr=3e-3",
            "optim.warmup_style=constant",
            "optim.lr_warmup_steps=0",
            "trainer.total_training_steps=25",
            "trainer.logger=[jsonl]",
            "trainer.device=cpu",
            f"trainer.default_local_dir={tmp_path / 'out'}",
            f"trainer.log_dir={tmp_path / 'out'}",
            *extra,
        ]
    )


def test_sft_overfits_eight_chats(tmp_path: Path, tok):
    trainer = SFTTrainer(config(tmp_path), model=build_tiny_model(tokenizer=tok), tokenizer=tok)
    results = trainer.train()
    losses = [m["train/loss"] for m in results["history"]]
    assert len(losses) == 25
    assert losses[-1] < 0.5 * losses[0], losses
    assert results["val_after"]["val/loss"] < 0.5 * results["val_before"]["val/loss"]
    assert results["val_before"]["val/loss"] == pytest.approx(losses[0], rel=1e-5)

    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").open()]
    steps = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in steps] == list(range(1, 26))
    for key in ("train/lr", "train/grad_norm", "train/tokens_per_s", "train/loss_tokens"):
        assert key in steps[0]
    assert steps[0]["train/lr"] == pytest.approx(3e-3)
    assert Path(results["hf_dir"], "config.json").is_file()


def _first_step(cfg: SFTConfig, tok, attn: str = "sdpa") -> tuple[SFTTrainer, dict]:
    model = build_tiny_model(tokenizer=tok)  # same seed: same initial weights every call
    model.set_attn_implementation(attn)
    trainer = SFTTrainer(cfg, model=model, tokenizer=tok)
    micro_batches = next(iter(trainer.train_loader))
    return trainer, trainer.train_step(micro_batches)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packing_gives_the_unpacked_loss_and_gradient(tmp_path: Path, tok, attn: str):
    unpacked_cfg = config(tmp_path)
    _, unpacked = _first_step(unpacked_cfg, tok, attn)
    # 266 tokens (samples of 24 to 43) in 2 sequences of <= 160 tokens
    packed_cfg = config(
        tmp_path, "data.packing=true", "data.train_batch_size=2", "data.max_length=160"
    )
    trainer, packed = _first_step(packed_cfg, tok, attn)
    assert len(trainer.train_loader.dataset) == 2
    assert packed["train/samples"] == unpacked["train/samples"] == 8
    assert packed["train/loss_tokens"] == unpacked["train/loss_tokens"]
    assert packed["train/loss"] == pytest.approx(unpacked["train/loss"], abs=1e-5)
    assert packed["train/grad_norm"] == pytest.approx(unpacked["train/grad_norm"], rel=1e-4)


def test_packing_without_isolation_would_leak(tmp_path: Path, tok):
    """The check above is sensitive: the same packed batch with a plain causal mask differs."""
    trainer = SFTTrainer(
        config(tmp_path, "data.packing=true", "data.train_batch_size=2", "data.max_length=160"),
        model=build_tiny_model(tokenizer=tok),
        tokenizer=tok,
    )
    (mb,) = next(iter(trainer.train_loader))
    with trainer.engine.eval_mode():
        isolated = trainer._nll_sum(trainer.engine.module, mb)
        trainer.packing = False  # -> 2-D attention mask: samples see each other
        leaking = trainer._nll_sum(trainer.engine.module, mb)
    assert abs(float(isolated) - float(leaking)) > 1e-3


def test_micro_batching_is_exact(tmp_path: Path, tok):
    _, one = _first_step(config(tmp_path, "data.micro_batch_size_per_device=8"), tok)
    _, four = _first_step(config(tmp_path, "data.micro_batch_size_per_device=2"), tok)
    assert four["train/loss"] == pytest.approx(one["train/loss"], abs=1e-5)
    assert four["train/grad_norm"] == pytest.approx(one["train/grad_norm"], rel=1e-4)


def test_main_sft_writes_a_reloadable_model(tmp_path: Path, tok):
    model_dir = save_tiny_model_dir(tmp_path / "tiny", tokenizer=tok)
    train = write_records(chats(4), tmp_path / "train.parquet")
    out = tmp_path / "run"
    code = main_sft.main(
        [
            f"model.path={model_dir}",
            f"data.train_files=[{train}]",
            "data.packing=true",
            "data.max_length=128",  # 4 chats of 24-42 tokens -> 2 packed sequences
            "data.train_batch_size=1",
            "trainer.total_training_steps=2",
            "trainer.logger=[console,jsonl]",
            "trainer.val_before_train=false",
            f"trainer.default_local_dir={out}",
            f"trainer.log_dir={out}",
        ]
    )
    assert code == 0
    reloaded = load_causal_lm(out / "huggingface")
    assert reloaded.config.vocab_size == len(tok)
    assert (out / "huggingface" / "tokenizer.json").is_file()
    assert not any(p.name.startswith(".huggingface") for p in out.iterdir())  # no temp left
    original = load_causal_lm(model_dir)
    changed = [
        n for n, p in reloaded.named_parameters() if not torch.equal(p, original.get_parameter(n))
    ]
    assert changed  # the saved weights are the trained ones


def test_main_sft_bad_config_exits_2_and_print_config(capsys):
    assert main_sft.main(["optim.lrr=1", "data.truncation=left"]) == 2
    err = capsys.readouterr().err
    assert "optim.lrr: unknown key (override 'optim.lrr=1'); did you mean optim.lr?" in err
    assert "data.truncation=left: must be one of error, right, drop" in err
    assert main_sft.main(["--print-config", "data.packing=true"]) == 0
    printed = load_yaml_text(capsys.readouterr().out)
    assert (
        printed["data"]["packing"] is True and printed["model"]["path"] == "smollm2-135m-instruct"
    )


def test_config_validation_names_keys():
    cfg = SFTConfig()
    cfg.data.train_batch_size = 0
    cfg.data.builtin = None
    cfg.engine.grad_clip = -1.0
    with pytest.raises(ConfigError) as err:
        cfg.validate()
    text = str(err.value)
    assert "data.train_batch_size=0: must be >= 1" in text
    assert "data.train_files=[]: no training data" in text
    assert "engine.grad_clip=-1.0: must be > 0" in text


def test_committed_defaults_and_docs_are_generated_from_the_schema():
    committed = (ROOT / "verl/trainer/config/sft_trainer.yaml").read_text()
    assert committed == default_yaml("sft"), (
        "sft_trainer.yaml is stale: python -m verl.trainer.main_sft --print-defaults "
        "> verl/trainer/config/sft_trainer.yaml"
    )
    assert load_sft_config() == SFTConfig()
    doc = (ROOT / "docs/sft_dpo.md").read_text()
    assert doc == with_tables(doc), (
        "docs/sft_dpo.md tables are stale: python -m verl.cli.config_gen docs docs/sft_dpo.md"
    )


def test_cli_subprocess_prints_config_without_torch():
    code = (
        "import sys; from verl.cli.sft import main; "
        "assert main(['--validate-only']) == 0; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.splitlines() == ["config OK", "[]"]


def test_sft_with_lora_trains_adapters_and_exports_merged(tmp_path: Path, tok):
    cfg = config(
        tmp_path,
        "trainer.total_training_steps=6",
        "model.lora_rank=8",
        "model.lora_alpha=16",
        "model.target_modules=[q_proj,v_proj,up_proj]",
    )
    base = build_tiny_model(tokenizer=tok)
    base_weights = {n: p.detach().clone() for n, p in base.named_parameters()}
    trainer = SFTTrainer(cfg, model=base, tokenizer=tok)
    module = trainer.engine.module
    trainable = [n for n, p in module.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    assert not any("k_proj.lora" in n for n in trainable)  # only the targeted modules
    results = trainer.train()
    losses = [m["train/loss"] for m in results["history"]]
    assert losses[-1] < losses[0], losses
    # the base weights never moved; the export folds the adapters in
    for name, p in module.get_base_model().named_parameters():
        plain = name.replace(".base_layer.", ".")
        if ".lora_" not in name:
            assert torch.equal(p, base_weights[plain]), name
    exported = load_causal_lm(results["hf_dir"])
    ids = torch.randint(3, len(tok), (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(
            exported(input_ids=ids).logits, module(input_ids=ids).logits, rtol=0, atol=1e-5
        )
    assert Path(results["hf_dir"], "lora_adapter", "adapter_config.json").is_file()
