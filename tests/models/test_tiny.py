"""Tests for verl/models/tiny.py: the tiny ChatML tokenizer and random tiny causal LMs."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.models.tiny import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    build_tiny_model,
    build_tiny_tokenizer,
    save_tiny_model_dir,
)

TEXT = "Hello world!\n  What is 123 + 45?\n\nThe answer is 168.  \t end\n"


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def test_tokenizer_basics(tok):
    assert 512 <= len(tok) <= 1024
    assert tok.convert_tokens_to_ids([ENDOFTEXT, IM_START, IM_END]) == [0, 1, 2]
    assert tok.eos_token == IM_END and tok.eos_token_id == 2
    assert tok.pad_token == ENDOFTEXT and tok.pad_token_id == 0
    assert tok.bos_token is None


def test_round_trip_and_single_digits(tok):
    ids = tok(TEXT)["input_ids"]
    assert tok.decode(ids) == TEXT
    pieces = [tok.decode([i]) for i in tok("9071")["input_ids"]]
    assert pieces == ["9", "0", "7", "1"]


def test_chat_template(tok):
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 3?"},
    ]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = tok(text)["input_ids"]
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2
    assert tok.decode(ids) == text
    no_gen = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    assert no_gen == text[: -len("<|im_start|>assistant\n")]


def test_fresh_copies(tok):
    other = build_tiny_tokenizer()
    other.padding_side = "left"
    assert build_tiny_tokenizer().padding_side == "right"
    assert other.get_vocab() == tok.get_vocab()


def test_disk_cache_is_written_and_reused(tok, tmp_path, monkeypatch):
    from verl.models import tiny

    build_tiny_tokenizer(cache_dir=tmp_path)
    (cache_file,) = tmp_path.glob("tiny_tokenizer_*.json")
    # A fresh process state must read the file instead of training.
    monkeypatch.setattr(tiny, "_TOKENIZER_JSON", None)
    monkeypatch.setattr(tiny, "_train_tokenizer_json", lambda: pytest.fail("retrained"))
    from_disk = build_tiny_tokenizer(cache_dir=tmp_path)
    assert from_disk.get_vocab() == tok.get_vocab()
    assert list(tmp_path.iterdir()) == [cache_file]  # no temp files left behind


def test_training_deterministic():
    from verl.models import tiny

    assert tiny._train_tokenizer_json() == tiny._train_tokenizer_json()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_save_dir_round_trip(arch, tok, tmp_path):
    path = save_tiny_model_dir(tmp_path / arch, arch=arch, seed=3)
    reloaded = AutoTokenizer.from_pretrained(path)
    assert reloaded.get_vocab() == tok.get_vocab()
    assert reloaded(TEXT)["input_ids"] == tok(TEXT)["input_ids"]
    assert reloaded.decode(reloaded(TEXT)["input_ids"]) == TEXT
    assert reloaded.chat_template == tok.chat_template
    assert (reloaded.eos_token, reloaded.pad_token) == (IM_END, ENDOFTEXT)

    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.model_type == arch
    ref = build_tiny_model(arch=arch, seed=3)
    for (name, p), (_, q) in zip(model.state_dict().items(), ref.state_dict().items()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_model_forward_shapes_and_ids(arch, tok):
    model = build_tiny_model(arch=arch, tokenizer=tok, hidden_size=32, num_layers=1)
    assert model.config.vocab_size == len(tok)
    assert (model.config.pad_token_id, model.config.eos_token_id) == (0, 2)
    ids = torch.randint(3, len(tok), (3, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (3, 7, len(tok)) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


def test_model_determinism_and_options():
    torch.manual_seed(123)
    before = torch.rand(1)
    a = build_tiny_model(seed=5)
    b = build_tiny_model(seed=5)
    c = build_tiny_model(seed=6)
    torch.manual_seed(123)
    assert torch.equal(torch.rand(1), before)  # global RNG untouched
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert a.lm_head.weight is a.model.embed_tokens.weight
    untied = build_tiny_model(tie_word_embeddings=False, dtype=torch.bfloat16)
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    assert untied.dtype == torch.bfloat16
    n_params = sum(p.numel() for p in a.parameters())
    # embed 724*64 + per layer (q 64*64+64, k/v 2*(64*32+32), o 64*64, mlp 3*64*128, 2 norms 64)
    per_layer = (64 * 64 + 64) + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert n_params == 724 * 64 + 2 * per_layer + 64


def test_bad_arguments():
    with pytest.raises(ValueError, match="arch='gpt2' is not supported"):
        build_tiny_model(arch="gpt2")
    with pytest.raises(ValueError, match="num_heads=4 is not divisible by num_kv_heads=3"):
        build_tiny_model(num_kv_heads=3)
