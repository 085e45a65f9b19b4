"""The native rollout engine: a batched KV-cache sampler over the actor's own HF module.

It reads the training module's weights in place (no copy) and runs this loop:

1. **Prefill once per prompt.** Columns that are padding in every row are dropped, then the
   ``B`` prompts go through one forward that writes their keys/values straight into the
   ``B * n`` rows of a preallocated cache (``repeat_interleave`` order), so the ``n`` samples
   of a prompt share its prefill. Only the last position's logits are computed
   (``logits_to_keep=1``): no (B, P, vocab) tensor.
2. **Decode.** Each step feeds one token per running row, with a 4-D attention mask that is
   a view of a preallocated (rows, max_len) boolean mask (no mask rebuilt by transformers)
   and explicit position ids (left padding makes them differ per row). The last token is
   sampled without a forward behind it, so ``R`` new tokens cost one prefill + ``R - 1``
   decode forwards. Under CPU bf16 autocast (in fp32 with ``lean_fp32``) a plain Llama /
   Qwen2 runs both without its HF modules (:class:`~verl.rollout.lean_forward.LeanForward`;
   the HF forward otherwise).
3. **Compaction.** Rows that hit a stop token / stop string are dropped from the batch and
   the cache once they make up ``compaction_threshold`` of the running rows, so late steps
   only compute unfinished rows. Each sample draws its uniforms from a hash of (seed, its
   output row, its token index) (``verl.rollout.sampling.row_uniforms``), so compaction
   never changes any sample.
4. **Slots.** At most ``max_num_seqs`` rows decode at once. A call with more rows runs with
   continuous batching by default (:mod:`verl.rollout.continuous`): a finished row's slot
   is refilled with the next waiting prompt at once, rows at different positions decode in
   one step. Samples do not depend on the slot or step a prompt ran in (same seeding), so
   greedy and seeded outputs equal the lock-step engine's. Inside
   :func:`verl.rollout.continuous.feed_prompts` the free slots of a call's tail take the
   next queued call's prompts (continuous batching across calls).
5. **Images** (a Qwen2-VL actor, :data:`verl.rollout.images.NATIVE_IMAGE_MODEL_TYPES`).
   The prefill forward gets the prompts' ``pixel_values`` and ``image_grid_thw``: the
   vision tower runs once per prompt and the model puts its embeddings at the image
   tokens. Positions are (B, P, 4): the text positions and the model's 3-axis rope index,
   as ``generate`` builds them; decode continues every axis from the prompt's last column
   (the rope axes: text position + the row's rope delta). Lock-step batches, waves and
   continuous batching (each admission's prefill gets its prompts' images) take them;
   streaming and mid-call weight updates refuse image prompts.
   The output adds ``multimodal_position_ids`` and ``mm_token_type_ids`` as the ``hf``
   rollout's does (:func:`verl.rollout.images.add_multimodal_positions`).

The lock-step batch is :func:`verl.rollout.native_lockstep.generate_lockstep`, the
continuous loop :func:`verl.rollout.continuous.generate_continuous`; this module holds the
engine (set-up, the model call, masks, sampling, the choice between them).

Generation runs under ``torch.no_grad`` with the module in eval mode; its previous
training mode is restored afterwards. Not ``torch.inference_mode``: under it autocast
does not cache its casts, so a bf16 rollout would cast every weight again at every decode
step (measured on SmolLM2: 45% of the generation's CPU time). Outputs follow
``verl.rollout.base``.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from verl.kernels import block_attention
from verl.kernels.decode_attention import DECODE_KWARG
from verl.rollout.base import (
    RolloutEngine,
    SamplingParams,
    assemble_rollout_output,
    eval_mode,
    validate_prompts,
)
from verl.rollout.continuous import (
    current_group_sink,
    current_prompt_feed,
    generate_continuous,
)
from verl.rollout.images import PromptImages, add_multimodal_positions, native_image_prompts
from verl.rollout.kv_cache import PreallocatedKVCache
from verl.rollout.lean_forward import LeanForward, for_call
from verl.rollout.native_lockstep import generate_lockstep
from verl.rollout.partial import current_weight_mailbox, tag_token_versions
from verl.rollout.sampling import row_uniforms, sample_next_tokens
from verl.rollout.stopping import StopStringChecker

logger = logging.getLogger(__name__)

__all__ = ["NativeRollout"]

# Attention implementations that take a ready 4-D mask (bool for sdpa, additive for eager).
_MASK_4D_IMPLS = ("sdpa", "eager")


class NativeRollout(RolloutEngine):
    """Batched sampler with a shared-prefill, preallocated, compacting KV cache.

    Args:
        module: a HF causal LM (``Qwen2ForCausalLM``, ``LlamaForCausalLM``, ...), used as is.
        tokenizer: needed for ``stop_strings``; also supplies eos / pad ids.
        pad_token_id: fills responses after their end (default: tokenizer / config pad, eos).
        eos_token_ids: default stop tokens when ``params.stop_token_ids`` is None (default:
            every eos id of the generation config, model config and tokenizer).
        compaction: drop finished rows from the running batch (off only for testing).
        compaction_threshold: compact once finished rows are at least this fraction of the
            running rows (0 = every step with a finished row). Each compaction copies the
            filled cache once, so the default 1/8 trades a copy for >= 12.5% less compute
            on every later step.
        stop_string_window: tokens decoded per row per step for stop strings (default
            ``2 * len(longest stop string) + 2``).
        compile_decode: run the decode step through ``torch.compile`` (inductor) over a
            static cache: the attention sees all (rounded-up) ``max_len`` columns with the
            unwritten ones masked, and rows are not compacted, so every step of a
            generation has the same shapes and reuses one graph. Models that need a mask
            per layer type (sliding windows) decode eagerly.
        compile_backend: the ``torch.compile`` backend for ``compile_decode`` (a name or a
            callable; ``"eager"`` traces without generating code, for debugging).
        max_num_seqs: rows (samples) decoded at once, the KV cache's slots (None = every
            row of the call). A call with more rows runs them through that many slots.
        continuous_batching: with more rows than slots, refill a finished row's slot with
            the next prompt at once (:mod:`verl.rollout.continuous`); False = lock-step
            waves of ``max_num_seqs // n`` prompts, each decoded until its longest row ends.
            Either way every sample is the same (per-sample seeding,
            :func:`~verl.rollout.sampling.row_uniforms`).
        logits_processor: ``(logits (rows, vocab), sample rows (rows,), token index (rows,))
            -> logits``, applied before each sampling (e.g. a scripted stop in a benchmark).
        pack_weights: under CPU bf16 autocast, compute every ``Linear`` of the eager
            prefill and decode on bf16 weights packed for oneDNN
            (:mod:`verl.kernels.packed_linear`: same outputs, faster weight reads), packed
            from the current weights at every call. Not with ``compile_decode`` or weights
            arriving mid-call. A plain Llama / Qwen2 (sdpa) with text prompts then runs
            :class:`~verl.rollout.lean_forward.LeanForward` (no HF module calls, fused
            q/k/v and gate/up matmuls) instead of the HF forward (``last_stats["lean"]``),
            unless ``lean_forward=False``. ``lean_fp32``: in fp32 (no autocast) too, its
            matmuls in fp32 (off: not measured faster than the HF forward, docs/rollout.md).

    After each ``generate``, ``last_stats`` holds timings and token counts.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        tokenizer: Any = None,
        *,
        pad_token_id: int | None = None,
        eos_token_ids: list[int] | None = None,
        compaction: bool = True,
        compaction_threshold: float = 0.125,
        stop_string_window: int | None = None,
        compile_decode: bool = False,
        compile_backend: Any = "inductor",
        max_num_seqs: int | None = None,
        continuous_batching: bool = True,
        logits_processor: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
        | None = None,
        pack_weights: bool = True,
        lean_forward: bool = True,
        lean_fp32: bool = False,
    ) -> None:
        if not 0 <= compaction_threshold <= 1:
            raise ValueError(f"compaction_threshold={compaction_threshold} must be in [0, 1]")
        if not hasattr(module, "config"):
            raise TypeError(
                f"{type(module).__name__} has no .config; the native rollout needs a "
                "transformers causal LM (e.g. Qwen2ForCausalLM), not a wrapper around one"
            )
        super().__init__(
            module,
            tokenizer,
            pad_token_id=pad_token_id,
            eos_token_ids=eos_token_ids,
            stop_string_window=stop_string_window,
        )
        self.compaction = compaction
        self.compaction_threshold = compaction_threshold
        self.compile_decode = compile_decode
        self.compile_backend = compile_backend
        self._compiled_forward: Any = None
        if max_num_seqs is not None and max_num_seqs < 1:
            raise ValueError(
                f"actor_rollout_ref.rollout.decode_slots={max_num_seqs} must be >= 1 (or null)"
            )
        self.max_num_seqs = max_num_seqs
        self.continuous_batching = continuous_batching
        self.logits_processor = logits_processor
        self.pack_weights, self.lean_forward = pack_weights, lean_forward
        self.lean_fp32 = lean_fp32
        self.last_stats: dict[str, float] = {}
        self._logged_images = False
        self._lean: LeanForward | None = None  # this call's lean forward (None: the HF one)
        # the continuous loop waiting for the call of a batch fed into it
        # (verl.rollout.continuous: "Across calls"); None when no fed row is in flight
        self._session: Any = None

        config = module.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self._num_layers = int(text_config.num_hidden_layers)
        layer_types = getattr(text_config, "layer_types", None) or []
        impl = getattr(config, "_attn_implementation", None) or "eager"
        # Sliding-window or hybrid models need one mask per layer type: let transformers
        # build them from a 2-D mask instead.
        only_full = all(t == "full_attention" for t in layer_types)
        self._mask_mode = impl if impl in _MASK_4D_IMPLS and only_full else "2d"
        if compile_decode and self._mask_mode == "2d":
            logger.warning(
                "compile_decode: %s (attention %s, layer types %s) needs per-layer masks; "
                "decoding eagerly",
                type(module).__name__,
                impl,
                sorted(set(layer_types)),
            )
            self.compile_decode = False
        # Decode steps of an sdpa model go through verl's decode attention (CPU autocast;
        # otherwise the registered wrapper hands them to transformers' sdpa unchanged).
        self._decode_attention = self._mask_mode == "sdpa"
        if self._decode_attention:
            block_attention.install()
        # peft wrappers take **kwargs and pass them on: read the wrapped model's signature.
        base = module.get_base_model() if hasattr(module, "get_base_model") else module
        params = inspect.signature(base.forward).parameters
        # transformers >= 5.2x renamed ``past_key_values`` to ``cache`` (the old name goes in 5.40).
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        if "logits_to_keep" in params:
            self._logits_kwargs: dict[str, int] = {"logits_to_keep": 1}
        elif "num_logits_to_keep" in params:
            self._logits_kwargs = {"num_logits_to_keep": 1}
        else:
            self._logits_kwargs = {}

    @classmethod
    def config_options(cls, config: Any) -> dict[str, Any]:
        """``actor_rollout_ref.rollout.compile_decode``, ``decode_slots`` (``max_num_seqs``) and
        ``continuous_batching``."""
        rollout = config.actor_rollout_ref.rollout
        return {
            "compile_decode": rollout.compile_decode,
            "max_num_seqs": getattr(rollout, "decode_slots", None),
            "continuous_batching": getattr(rollout, "continuous_batching", True),
        }

    # ------------------------------------------------------------------ public
    def generate(self, prompts: Any, params: SamplingParams) -> Any:
        """Sample ``params.n`` responses per prompt (layout: ``verl.rollout.base``).

        Inside :func:`verl.rollout.continuous.stream_groups` each prompt's group (its ``n``
        rows of this output, assembled alike) also goes to the sink as soon as it is
        complete: mid-call with continuous batching, at the end of its wave with lock-step
        waves, at the end of the call for one lock-step batch. Inside
        :func:`verl.rollout.partial.weight_mailbox` the continuous loop takes posted weights
        between decode steps and the output has ``rollout_token_versions``."""
        input_ids, attention_mask, position_ids = validate_prompts(prompts, images=True)
        sink, mailbox = current_group_sink(), current_weight_mailbox()
        model_positions, images = position_ids, None
        with_images = native_image_prompts(
            self.module, prompts, input_ids, attention_mask, position_ids
        )
        if with_images is not None:
            if sink is not None or mailbox is not None:
                raise ValueError(
                    "the prompts hold images: the native rollout's streaming and mid-call "
                    "weight updates (trainer.rollout_mode=streaming, trainer.partial_rollout) "
                    "take text prompts only; set trainer.async_rollout=false"
                )
            model_positions, images = with_images
            if not self._logged_images:
                self._logged_images = True
                logger.info(
                    "native rollout: image prompts (%s): the vision tower runs at prefill, "
                    "multimodal rope positions",
                    self.module.config.model_type,
                )
        on_group = self._group_reporter(prompts, params, position_ids, sink, mailbox)
        feed = current_prompt_feed() if images is None else None
        with (
            eval_mode(self.module),
            torch.no_grad(),  # not inference_mode: see the docstring
            self._packed(mailbox, input_ids.shape[0] * params.n, images is None),
        ):
            responses, log_probs, lengths, versions = self._generate(
                input_ids,
                attention_mask,
                model_positions,
                params,
                on_group=on_group,
                mailbox=mailbox,
                images=images,
                feed=feed,
            )
            responses, mask, log_probs = self._finish_rows(responses, log_probs, lengths)
        out = assemble_rollout_output(
            prompts, params, responses, mask, log_probs, position_ids=position_ids
        )
        if images is not None:
            add_multimodal_positions(self.module, out, self.pad_token_id)
        # the output's mask: a response may end early at a sampled image placeholder
        return tag_token_versions(out, versions, out.batch["response_mask"], mailbox)

    def drop_session(self) -> None:
        """Forget a continuous loop waiting for a fed batch's call (its rows are given up);
        the rollout copy calls it when it loads weights."""
        self._session = None

    def _group_reporter(
        self, prompts: Any, params: SamplingParams, position_ids: Any, sink: Any, mailbox: Any
    ) -> Callable[..., None] | None:
        """The continuous loop's ``on_group`` for a call on ``prompts``: each group's output,
        assembled like the call's, to ``sink`` (None without one)."""
        if sink is None:
            return None

        def on_group(prompt: int, responses, log_probs, lengths, versions=None) -> None:
            group = self._finish_rows(responses, log_probs, lengths)
            out = assemble_rollout_output(
                prompts[prompt : prompt + 1],
                params,
                *group,
                position_ids=position_ids[prompt : prompt + 1],
            )
            sink(prompt, tag_token_versions(out, versions, group[1], mailbox), params)

        return on_group

    def _finish_rows(
        self, responses: torch.Tensor, log_probs: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(responses, response_mask, log_probs)`` with pad / 0 past each row's length."""
        resp_len = responses.shape[1]
        mask = torch.arange(resp_len, device=lengths.device) < lengths.unsqueeze(1)
        return (
            responses.masked_fill(~mask, self.pad_token_id),
            mask,
            log_probs.masked_fill(~mask, 0.0),
        )

    # ------------------------------------------------------------------ internals
    @contextlib.contextmanager
    def _packed(self, mailbox: Any, rows: int, text: bool) -> Any:
        """The call's packed weights when they apply (``pack_weights``, eager decode):
        :func:`verl.rollout.lean_forward.for_call` (bf16 autocast or fp32; ``text``
        prompts for the lean forward)."""
        lean, context = None, contextlib.nullcontext()
        if self.pack_weights and not self.compile_decode:
            hint = min(rows, self.max_num_seqs or rows)
            # its mask: the 4-D boolean one of sdpa
            use = text and self.lean_forward and self._decode_attention
            use = use and self._mask_mode == "sdpa"
            fp32 = use and self.lean_fp32
            lean, context = for_call(self.module, self._device(), hint, use, mailbox, fp32)
        self._lean = lean
        try:
            with context:
                yield
        finally:
            self._lean = None  # frees its packed weights

    def _device(self) -> torch.device:
        for p in self.module.parameters():
            return p.device
        return torch.device("cpu")

    def _forward(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        position_ids: torch.Tensor,
        cache: PreallocatedKVCache,
        decode: bool = False,
        inputs: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """One model call; returns the last position's logits (rows, vocab). ``decode``: one
        new token per row (the attention may take verl's decode path). ``position_ids``
        (rows, L), or (rows, L, 4) for image prompts (text positions, then the three rope
        axes), given to the model as (4, rows, L). ``inputs``: further model keywords (a
        prefill's ``pixel_values`` and ``image_grid_thw``)."""
        if self._lean is not None:
            return self._lean(input_ids, mask, position_ids, cache, decode)
        extra = {DECODE_KWARG: True} if decode and self._decode_attention else {}
        if inputs:
            extra.update(inputs)
        if position_ids.ndim == 3:
            position_ids = position_ids.permute(2, 0, 1)
        out = self.module(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=True,
            **{self._cache_kwarg: cache},
            **self._logits_kwargs,
            **extra,
        )
        return out.logits[:, -1, :]

    def _decode_compiled(self) -> Any:
        """``_forward`` compiled once per engine for static shapes (inductor on CPU).

        ``dynamic=False``: each (rows, cache width, dtype) gets its own graph, compiled on
        first use; the rows never change within a generation (no compaction) and the width
        is rounded up, so a training run compiles a handful of graphs at most.
        """
        if self._compiled_forward is None:
            self._compiled_forward = torch.compile(
                self._forward, backend=self.compile_backend, dynamic=False
            )
        return self._compiled_forward

    def _cache_precision(
        self, device: torch.device
    ) -> tuple[torch.dtype | None, torch.dtype | None]:
        """``(dtype, round_to)`` of the KV cache. Without autocast: the keys' own dtype.
        Under autocast the attention reads keys and values in the autocast dtype (SDPA and
        eager matmuls cast them to it), so the cache holds them in it, instead of float32
        keys (the rotary embedding's output) that every step would convert again; on a CPU
        with verl's decode attention it holds float32 values rounded to it, which that
        path's fp32 score matmul reads as they are (:mod:`verl.kernels.decode_attention`)."""
        kind = device.type
        if not torch.is_autocast_enabled(kind):
            return None, None
        low = torch.get_autocast_dtype(kind)
        if kind == "cpu" and self._decode_attention:
            return torch.float32, low
        return low, None

    def _to_model_mask(self, allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """4-D boolean ``allowed`` (True = attend) in the form the attention expects."""
        if self._mask_mode == "eager":
            return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
                ~allowed, torch.finfo(dtype).min
            )
        return allowed

    def _prefill_mask(self, key_real: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """(B, 1, P, P) causal-and-padding mask; a padding query attends to itself only.

        Left padding makes the queries at pad positions see no real key; a fully masked row
        gives NaN in SDPA, which would reach real rows through 0 * NaN in the value matmul.
        """
        if self._mask_mode == "2d":
            return key_real.long()
        length = key_real.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=key_real.device).tril_()
        eye = torch.eye(length, dtype=torch.bool, device=key_real.device)
        allowed = (causal & key_real[:, None, None, :]) | eye
        return self._to_model_mask(allowed, dtype)

    def _decode_mask(self, kv_real: torch.Tensor, length: int, dtype: torch.dtype) -> torch.Tensor:
        if self._mask_mode == "2d":
            return kv_real[:, :length].long()
        return self._to_model_mask(kv_real[:, None, None, :length], dtype)

    def _sample(
        self,
        logits: torch.Tensor,
        rows: torch.Tensor,
        steps: torch.Tensor | int,
        params: SamplingParams,
        seed: int | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and log-probs of samples ``rows`` (their output rows) at their token index
        ``steps``, from ``logits`` (len(rows), vocab): the logits processor, then
        :func:`~verl.rollout.sampling.sample_next_tokens` with the per-sample uniforms of
        :func:`~verl.rollout.sampling.row_uniforms`."""
        if self.logits_processor is not None:
            if not isinstance(steps, torch.Tensor):
                steps = torch.full_like(rows, steps)
            logits = self.logits_processor(logits, rows, steps)
        uniforms = None if seed is None else row_uniforms(seed, rows, steps)
        return sample_next_tokens(
            logits,
            greedy=params.greedy,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            uniforms=uniforms,
        )

    def _generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        params: SamplingParams,
        on_group: Callable[..., None] | None = None,
        mailbox: Any = None,
        images: PromptImages | None = None,
        feed: Any = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Core loop. Returns ``responses`` (N, R) with garbage past ``lengths``,
        ``log_probs`` (N, R) float32 and ``lengths`` (N,), where N = B * n, R =
        max_new_tokens and ``lengths`` counts tokens up to and including the stop.
        ``on_group(prompt, responses, log_probs, lengths)`` is called once per prompt with its
        ``n`` rows of the three as soon as they are final
        (:func:`~verl.rollout.continuous.generate_continuous`). With a ``mailbox``
        (:mod:`verl.rollout.partial`) the continuous loop runs whenever it can and the 4th
        result is each token's weights version (None: ``mailbox.held`` on every token).

        At most ``max_num_seqs`` rows decode at once: all ``N`` in one lock-step batch when
        they fit; else continuous batching (:mod:`verl.rollout.continuous`) or, with it off
        (or for the compiled decode and per-layer-mask models), lock-step waves of
        ``max_num_seqs // n`` prompts. ``images``: the prompts' images
        (:func:`~verl.rollout.images.native_image_prompts`, ``position_ids`` then (B, P, 4)),
        given to each prefill with its prompts' share. ``feed``: a
        :class:`~verl.rollout.continuous.PromptFeed` (with ``max_num_seqs`` set, the call
        runs continuous and takes the next queued batches into its free slots)."""
        t_start = time.perf_counter()
        device = self._device()
        n = params.n
        batch = input_ids.shape[0]
        rows = batch * n
        slots = self.max_num_seqs or rows
        if slots < n:
            raise ValueError(
                f"actor_rollout_ref.rollout.decode_slots={slots} < rollout.n={n}: the n "
                f"samples of a prompt share its prefill and decode together; set "
                f"decode_slots >= {n}"
            )
        stop_ids = (
            params.stop_token_ids if params.stop_token_ids is not None else self.eos_token_ids
        )
        stop_ids_t = torch.tensor(stop_ids, dtype=torch.long, device=device)
        checker = StopStringChecker(self.tokenizer, params.stop_strings, self.stop_string_window)
        seed = None
        if not params.greedy:
            seed = params.seed
            if seed is None:  # follow torch's global RNG, so torch.manual_seed reproduces
                seed = int(torch.randint(0, 2**62, (1,)).item())
        key_real = attention_mask.to(device).bool()
        ids, pos = input_ids.to(device), position_ids.to(device)
        can_stream = not self.compile_decode and self._mask_mode in _MASK_4D_IMPLS
        totals: dict[str, float] = {}
        versions = None
        if feed is not None and not (self.max_num_seqs and can_stream and self.continuous_batching):
            feed = None
        if feed is None:
            self._session = None  # only the feed's calls continue a waiting loop
        continuous = (rows > slots or mailbox is not None or feed is not None) and (
            self.continuous_batching
        )
        if continuous and can_stream:
            responses, log_probs, lengths, totals, versions = generate_continuous(
                self,
                ids,
                key_real,
                pos,
                params,
                slots=slots,
                seed=seed,
                stop_ids=stop_ids_t if stop_ids else None,
                checker=checker,
                on_group=on_group,
                mailbox=mailbox,
                images=images,
                feed=feed,
                make_reporter=lambda p, sp, pos, sink: self._group_reporter(
                    p, sp, pos, sink, mailbox
                ),
            )
            mode = "continuous"
        else:
            per_wave = max(1, slots // n)
            parts = []
            for first in range(0, batch, per_wave):
                last = min(batch, first + per_wave)
                part = generate_lockstep(
                    self,
                    ids[first:last],
                    key_real[first:last],
                    pos[first:last],
                    params,
                    first_row=first * n,
                    seed=seed,
                    stop_ids=stop_ids_t if stop_ids else None,
                    checker=checker,
                    images=images.rows(first, last) if images is not None else None,
                )
                parts.append(part[:3])
                if on_group is not None:
                    wave = [t.unflatten(0, (last - first, n)) for t in part[:3]]
                    for prompt in range(first, last):
                        on_group(prompt, *(t[prompt - first] for t in wave))
                for key, value in part[3].items():
                    totals[key] = (
                        max(totals.get(key, 0.0), value)
                        if key == "prompt_len"
                        else (totals.get(key, 0.0) + value)
                    )
            responses, log_probs, lengths = (torch.cat(p) for p in zip(*parts))
            mode = "lockstep" if len(parts) == 1 else "waves"
        t_end = time.perf_counter()
        generated = int(lengths.sum())
        self.last_stats = {
            "prompts": float(batch),
            "samples": float(rows),
            "slots": float(min(slots, rows)),
            "continuous": float(mode == "continuous"),
            "lean": float(self._lean is not None),
            "generated_tokens": float(generated),
            **totals,
            "decode_s": t_end - t_start - totals.get("prefill_s", 0.0),
            "total_s": t_end - t_start,
            "tokens_per_s": generated / max(t_end - t_start, 1e-9),
        }
        return responses, log_probs, lengths, versions
