"""Tests for verl/models/loading.py: local-only loading and its error messages."""

import logging
import re

import pytest
import torch

from verl.models import (
    build_tiny_model,
    build_tiny_tokenizer,
    is_embedded_alias,
    load_causal_lm,
    load_tokenizer,
    loading,
    resolve_model_path,
    save_tiny_model_dir,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "qwen2", seed=7)


def test_load_causal_lm_matches_saved(model_dir):
    model = load_causal_lm(model_dir)
    ref = build_tiny_model(seed=7)
    assert not model.training and model.dtype == torch.float32
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=0, atol=0)


def test_load_causal_lm_dtype_and_attn(model_dir):
    model = load_causal_lm(str(model_dir), dtype="bf16", attn_implementation="eager")
    assert model.dtype == torch.bfloat16
    assert model.config._attn_implementation == "eager"


def test_load_tokenizer(model_dir):
    tok = load_tokenizer(model_dir)
    assert (tok.pad_token, tok.eos_token) == ("<|endoftext|>", "<|im_end|>")
    assert tok.decode(tok("a  b\n\nc 12")["input_ids"]) == "a  b\n\nc 12"


def test_pad_token_defaults_to_eos(tmp_path, caplog):
    tok = build_tiny_tokenizer()
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    with caplog.at_level(logging.INFO, logger="verl.models.loading"):
        loaded = load_tokenizer(tmp_path)
    assert loaded.pad_token == "<|im_end|>" and loaded.pad_token_id == 2
    assert "no pad token; using eos '<|im_end|>' as pad" in caplog.text


def test_missing_path():
    with pytest.raises(FileNotFoundError, match=re.escape("model path '/x' does not exist")):
        load_causal_lm("/x")
    with pytest.raises(FileNotFoundError, match="smollm2-135m-instruct"):
        load_tokenizer("/x")


def test_path_is_a_file(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"")
    msg = f"model path '{f}' is a file, not a model directory"
    with pytest.raises(NotADirectoryError, match=re.escape(msg)) as err:
        resolve_model_path(f)
    assert f"pass its directory '{tmp_path}'" in str(err.value)


def test_directory_without_weights(tmp_path):
    build_tiny_model().config.save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError) as err:
        load_causal_lm(tmp_path)
    msg = str(err.value)
    assert f"model directory '{tmp_path.resolve()}' has no weights" in msg
    assert "*.safetensors" in msg and "*.gguf" in msg


def test_weights_without_config(model_dir, tmp_path):
    (tmp_path / "model.safetensors").write_bytes((model_dir / "model.safetensors").read_bytes())
    with pytest.raises(FileNotFoundError, match=re.escape("has weights but no config.json")):
        load_causal_lm(tmp_path)


def test_several_gguf_files(tmp_path):
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(ValueError, match=re.escape("several GGUF files ['a.gguf', 'b.gguf']")):
        load_causal_lm(tmp_path)


def test_directory_without_tokenizer(tmp_path):
    build_tiny_model().save_pretrained(tmp_path)
    with pytest.raises(
        FileNotFoundError, match=re.escape("has no tokenizer: expected one of tokenizer.json")
    ):
        load_tokenizer(tmp_path)


def test_embedded_aliases_resolve_to_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(loading, "embedded_model_dir", lambda: tmp_path)
    for name in ("smollm2-135m-instruct", "embedded:smollm2", " Embedded:SmolLM2-135M-Instruct"):
        assert is_embedded_alias(name)
        assert resolve_model_path(name) == tmp_path
    assert not is_embedded_alias("smollm2")
    assert not is_embedded_alias(tmp_path)


def test_sets_hub_offline(model_dir, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    load_tokenizer(model_dir)
    assert loading.os.environ["HF_HUB_OFFLINE"] == "1"


def test_override_config_reaches_the_model(model_dir):
    ids = torch.tensor([[5, 6, 7, 8]])
    plain = load_causal_lm(model_dir)
    changed = load_causal_lm(model_dir, override_config={"rms_norm_eps": 0.5})
    assert changed.config.rms_norm_eps == 0.5
    assert plain.config.rms_norm_eps != 0.5
    with torch.no_grad():
        assert not torch.allclose(plain(ids).logits, changed(ids).logits)
    # the weights are the same: only the config changed
    torch.testing.assert_close(plain.state_dict(), changed.state_dict(), rtol=0, atol=0)


def test_override_config_unknown_key_is_named_with_a_suggestion(model_dir):
    with pytest.raises(ValueError) as err:
        load_causal_lm(model_dir, override_config={"rms_norm_epsilon": 1e-5})
    message = str(err.value)
    assert "model.override_config: 'rms_norm_epsilon'" in message
    assert "did you mean rms_norm_eps" in message
    assert str(model_dir) in message
