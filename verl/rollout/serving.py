"""What the serving-engine backends (``vllm``, ``sglang``) share.

A serving engine keeps its own copy of the weights (``owns_weights``), takes token-id
prompts and returns, per sample, the generated ids and each sampled token's log-prob.
:class:`ServingRollout` holds everything around the engine call that does not depend on
which engine it is:

- the model directory the engine starts from: the module's ``config.json`` and tokenizer
  only (the engine starts with dummy weights and receives the real ones by a push), removed
  with the engine;
- the weight push (:meth:`ServingRollout.push_weights`): ``verl.rollout.weight_sync``'s
  bucketed, time-limited push; after a failed push the engine refuses further use, since
  its weights are half loaded;
- sleep / wake-up bookkeeping around the engine's own memory release;
- request building (:func:`token_prompts`: left padding removed) and output conversion
  (:meth:`ServingRollout.build_output`: samples to the batch of ``verl.rollout.base``);
- the one-time warnings about sampling settings the engines treat differently;
- one lock per engine kind for the whole process (:func:`engine_lock`,
  ``ServingRollout.engine_lock``). Two in-process vLLM engines (the actor's and the
  asynchronous rollout copy's, on two threads) share module-level state: the forward
  context of the running step, the rotary-embedding modules vLLM caches by their settings
  (one object in both models) and the layer-wise reload's bookkeeping. A weight push puts
  the reloaded modules' tensors on the meta device until it finishes, so a step of the other
  engine meanwhile failed ("Cannot copy out of meta tensor" in the rotary embedding). Every
  push, sleep / wake-up and generation takes the lock; the rollout copy takes it per engine
  step (``verl.rollout.vllm_stream``), so a push waits one step, not a whole call.

A backend starts its engine through ``_start_engine`` and implements ``_load`` (the loader
given to the push), ``_after_load``, ``_release_memory`` / ``_resume_memory``, ``_shutdown``
and ``generate``.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from verl.rollout.base import RolloutEngine, SamplingParams, assemble_rollout_output
from verl.rollout.weight_sync import push_weights
from verl.utils.stale_tmp import make_owned_tmpdir, remove_stale_tmpdirs

logger = logging.getLogger(__name__)

__all__ = ["ENGINE_DTYPES", "ServingRollout", "engine_lock", "serving_options", "token_prompts"]

#: The model dtypes the engines take, by the name they take them under.
ENGINE_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
#: ``(token ids, log-prob of each)`` of one sample, as the engine returned it.
Sample = tuple[Sequence[int], Sequence[float]]


_ENGINE_LOCKS: dict[str, threading.RLock] = {}
_LOCKS_GUARD = threading.Lock()


def engine_lock(engine_name: str) -> threading.RLock:
    """The process-wide re-entrant lock of every ``engine_name`` engine in this process
    (module docstring): held by whatever runs one of them."""
    with _LOCKS_GUARD:
        return _ENGINE_LOCKS.setdefault(engine_name, threading.RLock())


def token_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """Each row's prompt ids without the left padding: ``(B, P)`` -> ``B`` lists."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(input_ids.cpu(), attention_mask.cpu())]


def serving_options(config: Any, engine_cfg: Any, key: str) -> dict[str, Any]:
    """Constructor keywords every serving backend reads: lengths, seed, the push's limits.

    ``engine_cfg``: the backend's settings (``actor_rollout_ref.rollout.<key>``), which carry
    ``max_model_len``, ``weight_sync_bucket_mb`` and ``weight_sync_timeout_s``. The engine's
    ``dtype`` comes from the worker's spec (``verl.workers.role_options.rollout_options``).
    """
    rollout_cfg = config.actor_rollout_ref.rollout
    needed = config.data.max_prompt_length + config.data.max_response_length
    max_model_len = engine_cfg.max_model_len if engine_cfg.max_model_len is not None else needed
    if max_model_len < needed:
        raise ValueError(
            f"actor_rollout_ref.rollout.{key}.max_model_len={max_model_len} is below "
            f"data.max_prompt_length + data.max_response_length = {needed}; raise it or "
            "set it to null"
        )
    return {
        "max_model_len": max_model_len,
        "seed": rollout_cfg.seed if rollout_cfg.seed is not None else config.trainer.seed,
        "weight_sync_bucket_mb": engine_cfg.weight_sync_bucket_mb,
        "weight_sync_timeout_s": engine_cfg.weight_sync_timeout_s,
    }


def _cast_floating(
    named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """Floating-point tensors in ``dtype``, cast one at a time as the engine's loader takes
    them (buckets are cut and gathered in the storage dtype, the same on every rank)."""
    for name, tensor in named_tensors:
        if tensor.is_floating_point() and tensor.dtype != dtype:
            tensor = tensor.to(dtype)
        yield name, tensor


class ServingRollout(RolloutEngine):
    """Base of the backends whose engine keeps its own weights (see the module docstring).

    Subclasses set ``engine_name`` (the ``rollout.name`` and config key: ``"vllm"``) and
    ``display_name``, start their engine through :meth:`_start_engine` and then push the
    module's weights (:meth:`update_weights`) unless the caller will.
    """

    owns_weights = True
    engine_name = ""
    #: how errors name the engine ("vLLM").
    display_name = ""
    #: True where the engine can free its KV cache (and weights) while the actor trains.
    sleep_supported = False
    #: Keys of ``actor_rollout_ref.rollout.<engine_name>`` the constructor takes as they are.
    engine_keys: tuple[str, ...] = ()

    @classmethod
    def config_options(cls, config: Any) -> dict[str, Any]:
        """Keywords from ``actor_rollout_ref.rollout.<engine_name>`` and the data lengths."""
        engine_cfg = getattr(config.actor_rollout_ref.rollout, cls.engine_name)
        options = serving_options(config, engine_cfg, cls.engine_name)
        return options | {key: getattr(engine_cfg, key) for key in cls.engine_keys}

    def __init__(
        self,
        module: torch.nn.Module,
        tokenizer: Any = None,
        *,
        max_model_len: int | None = None,
        seed: int = 0,
        weight_sync_bucket_mb: float = 256.0,
        weight_sync_timeout_s: float = 120.0,
        role: str = "actor_rollout_ref",
        push_initial_weights: bool = True,
        dtype: torch.dtype | None = None,
        **ids: Any,
    ) -> None:
        """``dtype``: what the engine computes in and the push casts the weights to (None:
        the module's parameter dtype). ``ids``: ``pad_token_id`` / ``eos_token_ids`` /
        ``stop_string_window``, as for ``NativeRollout``; the other arguments as the
        subclasses document them."""
        if tokenizer is None:
            raise ValueError(
                f"rollout.name={self.engine_name} needs the tokenizer (the engine loads it "
                "from disk)"
            )
        super().__init__(module, tokenizer, **ids)
        dtype = dtype if dtype is not None else next(module.parameters()).dtype
        if dtype not in ENGINE_DTYPES:
            raise ValueError(
                f"rollout.name={self.engine_name}: dtype {dtype} is not one of "
                f"{list(ENGINE_DTYPES)}"
            )
        if not weight_sync_bucket_mb > 0 or not weight_sync_timeout_s > 0:
            raise ValueError(
                f"weight_sync_bucket_mb={weight_sync_bucket_mb} and weight_sync_timeout_s="
                f"{weight_sync_timeout_s} must be > 0"
            )
        self.dtype = dtype
        self.dtype_name = ENGINE_DTYPES[dtype]
        #: held while this process runs any engine of this kind (:func:`engine_lock`)
        self.engine_lock = engine_lock(self.engine_name)
        self.max_model_len, self.seed = max_model_len, seed
        self.push_initial_weights = push_initial_weights
        self.role = role
        self.bucket_bytes = int(weight_sync_bucket_mb * 2**20)
        self.timeout_s = float(weight_sync_timeout_s)
        self.last_stats: dict[str, float] = {}
        self._warned: set[str] = set()
        self._broken: str | None = None
        self._asleep = False
        self._model_dir: str | None = None
        self._cleanup: Callable[[], Any] = lambda: None

    def _start_engine(
        self,
        module: torch.nn.Module,
        tokenizer: Any,
        start: Callable[[str], Any],
    ) -> Any:
        """Return ``start(model_dir)`` (the engine), timed in ``startup_seconds``.

        ``model_dir`` holds only ``config.json`` and the tokenizer: the engine starts with
        dummy weights. It is removed with this object (or at exit), and at once on failure;
        its name carries this process's pid, and the directories of dead processes (a
        SIGKILLed run leaves its own) are removed first (``verl.utils.stale_tmp``).
        """
        prefix = f"verl-{self.engine_name}-model-"
        remove_stale_tmpdirs(prefix)
        path = make_owned_tmpdir(prefix)
        self._cleanup = weakref.finalize(self, shutil.rmtree, path, True)
        self._model_dir = path
        try:
            module.config.save_pretrained(path)
            tokenizer.save_pretrained(path)
            begin = time.perf_counter()
            engine = start(path)
        except BaseException:
            self._cleanup()
            raise
        self.startup_seconds = time.perf_counter() - begin
        logger.info(
            "%s: %s engine started in %.1f s", self.role, self.display_name, self.startup_seconds
        )
        return engine

    def _push_initial(self, module: torch.nn.Module) -> None:
        """The first push, once the engine runs (unless ``push_initial_weights=False``)."""
        if self.push_initial_weights:
            self.update_weights(module.state_dict().items())

    # ------------------------------------------------------------------ weights
    def _load(self, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
        """The engine's loader: consume every ``(name, tensor)`` of ``weights``."""
        raise NotImplementedError

    def _after_load(self) -> None:
        """Drop what the old weights left behind (prefix caches); after every push."""

    def update_weights(
        self,
        named_tensors: Iterable[tuple[str, torch.Tensor]],
        *,
        before_bucket: Callable[[int], None] | None = None,
    ) -> dict[str, float]:
        """Load new weights into the running engine in place; returns the push's timings.

        ``named_tensors``: HF checkpoint names and tensors (``module.state_dict().items()``:
        it has ``lm_head.weight`` even when tied, which the engines' output layer needs).
        Sharded DTensors are gathered bucket by bucket; ``before_bucket``: as for
        ``verl.rollout.weight_sync.push_weights``.
        """
        self._check_usable()
        with self.engine_lock:  # no step of another in-process engine during the push
            try:
                stats = push_weights(
                    lambda weights: self._load(_cast_floating(weights, self.dtype)),
                    named_tensors,
                    bucket_bytes=self.bucket_bytes,
                    timeout_s=self.timeout_s,
                    role=self.role,
                    engine=self.engine_name,
                    timeout_key=(
                        f"actor_rollout_ref.rollout.{self.engine_name}.weight_sync_timeout_s"
                    ),
                    before_bucket=before_bucket,
                )
            except Exception as exc:
                self._broken = f"a weight sync failed ({type(exc).__name__})"
                raise
            self._after_load()
        self.last_stats = {f"weight_sync_{k}": v for k, v in stats.items()}
        return stats

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise RuntimeError(
                f"{self.role}: the {self.display_name} rollout engine is unusable because "
                f"{self._broken}"
            )

    # ------------------------------------------------------------------ memory
    def _release_memory(self) -> None:
        raise NotImplementedError

    def _resume_memory(self) -> None:
        raise NotImplementedError

    def sleep(self) -> None:
        """Free the engine's memory while the actor trains; a logged no-op without support."""
        if not self.sleep_supported:
            logger.debug("%s: %s cannot sleep here; memory kept", self.role, self.engine_name)
            return
        if not self._asleep:
            with self.engine_lock:
                self._release_memory()
            self._asleep = True

    def wake_up(self) -> None:
        """Re-allocate what :meth:`sleep` freed."""
        if self._asleep:
            with self.engine_lock:
                self._resume_memory()
            self._asleep = False

    def _shutdown(self) -> None:
        """Stop the engine (its processes, if any); called by :meth:`close`."""

    def close(self) -> None:
        """Stop the engine and remove its temporary model directory."""
        try:
            self._shutdown()
        finally:
            self._cleanup()

    # ------------------------------------------------------------------ sampling
    def _warn_once(self, key: str, level: int, message: str, *args: Any) -> None:
        if key not in self._warned:
            logger.log(level, message, *args)
            self._warned.add(key)

    def check_sampling(self, params: SamplingParams) -> None:
        """Log once what the engine does differently from ``verl.rollout.base``'s contract."""
        if not params.greedy and (params.top_k > 0 or params.top_p < 1):
            self._warn_once(
                "truncation",
                logging.WARNING,
                "rollout.name=%s with top_k=%s / top_p=%s: the engine reports log-probs of the "
                "truncated distribution, not of the untruncated tempered policy that the "
                "other backends report (verl.rollout.base)",
                self.engine_name,
                params.top_k,
                params.top_p,
            )
        if params.seed is not None:
            self._warn_once(
                "seed",
                logging.INFO,
                "rollout.name=%s: per-call seeds are not used; the engine is seeded once",
                self.engine_name,
            )

    def stop_ids(self, params: SamplingParams) -> list[int]:
        """The token ids that end a response (``params.stop_token_ids``, else the eos ids)."""
        ids = params.stop_token_ids if params.stop_token_ids is not None else self.eos_token_ids
        return list(ids)

    def build_output(
        self,
        prompts: Any,
        params: SamplingParams,
        samples: Sequence[Sample],
        *,
        position_ids: torch.Tensor,
        seconds: float,
    ) -> Any:
        """The rollout batch from ``B * n`` samples in ``repeat_interleave`` order.

        Each sample is cut at ``params.max_new_tokens``; ``last_stats`` gets the timing.
        """
        rows, max_new = len(samples), params.max_new_tokens
        expected = prompts.batch["input_ids"].shape[0] * params.n
        if rows != expected:
            raise RuntimeError(
                f"the {self.engine_name} engine returned {rows} samples, expected "
                f"{expected} (prompts x n={params.n})"
            )
        responses = torch.full((rows, max_new), self.pad_token_id, dtype=torch.long)
        log_probs = torch.zeros(rows, max_new, dtype=torch.float32)
        lengths = torch.zeros(rows, dtype=torch.long)
        for row, (ids, logps) in enumerate(samples):
            ids, logps = list(ids)[:max_new], list(logps)[:max_new]
            if len(ids) != len(logps):
                raise RuntimeError(
                    f"the {self.engine_name} engine returned {len(ids)} tokens but "
                    f"{len(logps)} log-probs for sample {row}"
                )
            lengths[row] = len(ids)
            responses[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            log_probs[row, : len(ids)] = torch.tensor(logps, dtype=torch.float32)
        mask = torch.arange(max_new) < lengths.unsqueeze(1)
        self.last_stats = {
            "generate_seconds": seconds,
            "response_tokens": float(lengths.sum()),
            "tokens_per_second": float(lengths.sum()) / max(seconds, 1e-9),
        }
        device = prompts.batch["input_ids"].device
        return assemble_rollout_output(
            prompts,
            params,
            responses.to(device),
            mask.to(device),
            log_probs.to(device),
            position_ids=position_ids,
        )
