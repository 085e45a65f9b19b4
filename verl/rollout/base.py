"""The rollout interface: sampling parameters, the engine base class and the output layout.

Every backend (``native``, ``hf``, ``vllm``, ``sglang``) implements
``RolloutEngine.generate(prompts, params) -> DataProto`` with the same contract:

Input ``prompts`` (``B`` rows): ``input_ids`` (B, P) LEFT-padded, ``attention_mask`` (B, P),
``position_ids`` (B, P) = ``cumsum(attention_mask) - 1`` clamped at 0. Other tensor keys,
``non_tensor_batch`` and ``meta_info`` are carried over.

Output (``B * n`` rows; the ``n`` samples of prompt ``i`` are rows ``i*n .. i*n+n-1``, i.e.
``repeat_interleave`` order; every input tensor / non-tensor key is repeated the same way and
``meta_info`` is copied):

- ``prompts`` (B*n, P): the left-padded prompt ids;
- ``responses`` (B*n, R): generated ids, right-padded with ``pad_token_id``. ``R`` is always
  ``params.max_new_tokens`` (not the longest response of the batch), so that every rollout
  batch of a run has the same shape and training micro-batches never re-shape. Code that
  wants the real length must use ``response_mask``;
- ``response_mask`` (B*n, R): 1 for generated tokens including the stop token, 0 after;
  same dtype as the input ``attention_mask``;
- ``input_ids`` (B*n, P+R) = cat(prompts, responses); ``attention_mask`` (B*n, P+R) =
  cat(prompt mask, response_mask); ``position_ids`` (B*n, P+R) continuing after the
  prompt's last position (``last + 1, last + 2, ...``, also over padding);
- ``rollout_log_probs`` (B*n, R) float32: log-prob of each sampled token, 0 where masked.

Log-prob convention: ``log_softmax(logits / T)`` at the chosen token, where ``T`` is
``params.temperature`` (1.0 when the temperature is 0), computed BEFORE top-k / top-p
truncation. With ``top_k=-1, top_p=1`` this is exactly the sampling distribution, and it is
what the trainer recomputes from a forward pass at the same temperature; with truncation it
is the log-prob under the untruncated tempered policy (the truncated distribution would put
-inf on tokens the trainer can still assign mass to).
"""

from __future__ import annotations

import abc
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from verl.rollout.stopping import resolve_eos_token_ids, resolve_pad_token_id

if TYPE_CHECKING:
    from verl.protocol import DataProto

logger = logging.getLogger(__name__)

__all__ = [
    "IMAGE_INPUTS_KEY",
    "IMAGE_KEYS",
    "MM_TOKEN_TYPES_KEY",
    "MULTIMODAL_POSITIONS_KEY",
    "RolloutEngine",
    "SamplingParams",
    "assemble_rollout_output",
    "eval_mode",
    "validate_prompts",
]

# Image prompts (a vision-language model; the same names as ``verl.data.vision``, which
# this layer cannot import): per-row ``{"pixel_values", "image_grid_thw"}`` dicts in
# ``non_tensor_batch``, the token types (text 0, image 1) and the (rows, seq, 4)
# multimodal rope index in ``batch``. The ``hf`` and ``native`` backends generate from them
# (``verl.rollout.images``).
IMAGE_INPUTS_KEY = "multi_modal_inputs"
MM_TOKEN_TYPES_KEY = "mm_token_type_ids"
MULTIMODAL_POSITIONS_KEY = "multimodal_position_ids"
IMAGE_KEYS = (MM_TOKEN_TYPES_KEY, MULTIMODAL_POSITIONS_KEY, IMAGE_INPUTS_KEY)


@dataclass
class SamplingParams:
    """How to sample responses for a batch of prompts.

    ``temperature == 0`` or ``do_sample=False`` means greedy decoding. ``top_k=-1`` and
    ``top_p=1.0`` disable truncation. ``stop_token_ids=None`` means "the eos id(s) of the
    tokenizer / model" (resolved by the engine); ``[]`` means no stop token (only
    ``max_new_tokens`` and ``stop_strings`` end a response). A stop token or the token that
    completes a stop string is part of the response (``response_mask`` is 1 on it).
    ``seed=None`` draws from torch's global RNG; an int makes ``generate`` reproducible.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    max_new_tokens: int = 256
    stop_token_ids: list[int] | None = None
    stop_strings: list[str] = field(default_factory=list)
    seed: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise ValueError(f"SamplingParams.n={self.n!r} must be an int >= 1")
        if not isinstance(self.temperature, int | float) or not self.temperature >= 0:
            raise ValueError(
                f"SamplingParams.temperature={self.temperature!r} must be >= 0 (0 = greedy)"
            )
        if not isinstance(self.top_p, int | float) or not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p={self.top_p!r} must be in (0, 1]")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool):
            raise ValueError(f"SamplingParams.top_k={self.top_k!r} must be an int")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(
                f"SamplingParams.top_k={self.top_k} must be -1 (disabled) or a positive int"
            )
        if (
            not isinstance(self.max_new_tokens, int)
            or isinstance(self.max_new_tokens, bool)
            or self.max_new_tokens < 1
        ):
            raise ValueError(f"SamplingParams.max_new_tokens={self.max_new_tokens!r} must be >= 1")
        if self.stop_token_ids is not None:
            ids = list(self.stop_token_ids)
            if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
                raise ValueError(
                    f"SamplingParams.stop_token_ids={self.stop_token_ids!r} must be "
                    "non-negative ints"
                )
            self.stop_token_ids = ids
        if isinstance(self.stop_strings, str):
            raise ValueError(
                f"SamplingParams.stop_strings={self.stop_strings!r} must be a list of strings, "
                f"e.g. [{self.stop_strings!r}]"
            )
        self.stop_strings = list(self.stop_strings)
        if not all(isinstance(s, str) and s for s in self.stop_strings):
            raise ValueError(
                f"SamplingParams.stop_strings={self.stop_strings!r} must be non-empty strings"
            )
        if self.seed is not None and (
            not isinstance(self.seed, int) or isinstance(self.seed, bool)
        ):
            raise ValueError(f"SamplingParams.seed={self.seed!r} must be an int or None")

    @property
    def greedy(self) -> bool:
        """True when tokens are chosen by argmax (``do_sample=False`` or temperature 0)."""
        return not self.do_sample or self.temperature == 0

    @property
    def logprob_temperature(self) -> float:
        """The temperature of the reported log-probs: ``temperature``, or 1.0 when it is 0."""
        return float(self.temperature) if self.temperature > 0 else 1.0


class RolloutEngine(abc.ABC):
    """Generates responses for a batch of prompts. See the module docstring for the layout.

    Args:
        module: the actor's causal LM (the engine samples from its weights, never a copy).
        tokenizer: decodes tails for stop strings and supplies eos / pad ids.
        pad_token_id / eos_token_ids: override what the tokenizer and config say.
        stop_string_window: tokens of the tail decoded to look for stop strings.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        tokenizer: Any = None,
        *,
        pad_token_id: int | None = None,
        eos_token_ids: list[int] | None = None,
        stop_string_window: int | None = None,
    ) -> None:
        self.module = module
        self.tokenizer = tokenizer
        self.eos_token_ids = (
            list(eos_token_ids)
            if eos_token_ids is not None
            else resolve_eos_token_ids(tokenizer, module)
        )
        self.pad_token_id = (
            int(pad_token_id)
            if pad_token_id is not None
            else resolve_pad_token_id(tokenizer, module, self.eos_token_ids)
        )
        self.stop_string_window = stop_string_window

    #: False: the engine samples from ``module`` in place (``native``, ``hf``). True: it
    #: keeps its own copy (``vllm``, ``sglang``) and the worker sends it the actor's weights
    #: with ``update_weights(named_tensors)`` before generating whenever they changed.
    owns_weights: bool = False

    @classmethod
    def config_options(cls, config: Any) -> dict[str, Any]:
        """Constructor keywords this backend reads from the trainer config (none by default)."""
        return {}

    @classmethod
    def check_available(cls) -> None:
        """Raise a clear error when this machine cannot run the backend (package, device).

        The worker calls it before loading any model; nothing to check by default.
        """
        return None

    @abc.abstractmethod
    def generate(self, prompts: DataProto, params: SamplingParams) -> DataProto:
        """Sample ``params.n`` responses per prompt; returns ``B * n`` rows."""

    def sleep(self) -> None:
        """Free generation-only memory (KV cache) while the actor trains; no-op by default."""
        return None

    def wake_up(self) -> None:
        """Undo :meth:`sleep` before generating; no-op by default."""
        return None

    def close(self) -> None:
        """Release what the engine holds outside this object (an inference engine's
        processes, memory and temporary files); the worker calls it once, at shutdown.
        No-op by default."""
        return None


@contextlib.contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """Put ``module`` in eval mode (no dropout) and restore every submodule's own mode after.

    Restoring per submodule keeps parts that the trainer froze in eval mode as they were,
    which ``module.train(was_training)`` would not.
    """
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def validate_prompts(
    prompts: DataProto, images: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Check a prompt batch and return its ``(input_ids, attention_mask, position_ids)``.

    Raises ``KeyError`` for a missing key and ``ValueError`` for a malformed batch: shapes that
    differ, right padding (the last column must be a real token in every row) or an empty
    prompt, or image prompts (:data:`IMAGE_INPUTS_KEY`) for a backend that does not take
    them (``images=False``). ``position_ids`` defaults to ``cumsum(attention_mask) - 1``
    clamped at 0 when the batch does not carry it.
    """
    if not images and IMAGE_INPUTS_KEY in prompts.non_tensor_batch:
        raise ValueError(
            "the prompts hold images (a vision-language model's data): only the hf rollout "
            "and the native one (Qwen2-VL models) generate from images; set "
            "actor_rollout_ref.rollout.name=hf or native (the vLLM and SGLang backends and "
            "the agent loop take text prompts only)"
        )
    batch = prompts.batch
    for key in ("input_ids", "attention_mask"):
        if key not in batch:
            raise KeyError(f"rollout input has no {key!r}; keys present: {sorted(batch)}")
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask "
            f"{tuple(attention_mask.shape)} must both be (batch, prompt_len)"
        )
    position_ids = batch.get("position_ids")
    if position_ids is None:
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
    elif position_ids.shape != input_ids.shape:
        raise ValueError(
            f"position_ids {tuple(position_ids.shape)} must match input_ids "
            f"{tuple(input_ids.shape)} (multi-axis rope positions are not supported)"
        )
    if input_ids.shape[0] == 0:
        raise ValueError("rollout input has 0 prompts")
    if input_ids.shape[1] == 0:
        raise ValueError("rollout input has prompt length 0; every prompt needs >= 1 token")
    last_real = attention_mask[:, -1].bool()
    if not bool(last_real.all()):
        bad = (~last_real).nonzero().flatten()[:5].tolist()
        if not bool(attention_mask.bool().any(-1).all()):
            raise ValueError(f"rollout input rows {bad} are empty (attention_mask all 0)")
        raise ValueError(
            f"rollout prompts must be LEFT-padded, but rows {bad} end in padding "
            "(tokenizer.padding_side='left')"
        )
    return input_ids, attention_mask, position_ids


def _normal(t: torch.Tensor) -> torch.Tensor:
    return t.clone() if t.is_inference() else t


def assemble_rollout_output(
    prompts: DataProto,
    params: SamplingParams,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    position_ids: torch.Tensor | None = None,
) -> DataProto:
    """Build the output batch (layout in the module docstring) from per-sample results.

    ``responses`` (B*n, R) already pad-filled past the mask, ``response_mask`` (B*n, R) 0/1,
    ``rollout_log_probs`` (B*n, R) float32 already 0 past the mask. ``position_ids`` (B, P)
    overrides the input's (used when the input has none). The input batch is not modified.
    Must be called outside ``torch.inference_mode`` so that the result can enter autograd.
    """
    from verl.protocol import DataProto

    n = params.n
    src = prompts.batch
    prompt_ids = src["input_ids"]
    mask_dtype = src["attention_mask"].dtype
    if position_ids is None:
        position_ids = src["position_ids"]
    device = prompt_ids.device
    # Tensors made under inference_mode cannot be saved for backward by the trainer's forward.
    responses = _normal(responses.to(device))
    response_mask = _normal(response_mask.to(device=device, dtype=mask_dtype))
    rollout_log_probs = _normal(rollout_log_probs.to(device=device, dtype=torch.float32))

    def rep(t: torch.Tensor) -> torch.Tensor:
        return t.repeat_interleave(n, dim=0) if n > 1 else t.clone()

    tensors: dict[str, torch.Tensor] = {
        k: rep(v)
        for k, v in src.items()
        if k not in ("input_ids", "attention_mask", "position_ids")
    }
    rep_prompts = rep(prompt_ids)
    rep_mask = rep(src["attention_mask"])
    rep_pos = rep(position_ids)
    resp_len = responses.shape[1]
    offsets = torch.arange(1, resp_len + 1, device=device, dtype=rep_pos.dtype)
    response_pos = rep_pos[:, -1:] + offsets
    tensors.update(
        prompts=rep_prompts,
        responses=responses,
        response_mask=response_mask,
        input_ids=torch.cat([rep_prompts, responses], dim=1),
        attention_mask=torch.cat([rep_mask, response_mask], dim=1),
        position_ids=torch.cat([rep_pos, response_pos], dim=1),
        rollout_log_probs=rollout_log_probs,
    )
    non_tensors: dict[str, Any] = {
        k: np.repeat(v, n, axis=0) for k, v in prompts.non_tensor_batch.items()
    }
    return DataProto.from_dict(
        tensors=tensors, non_tensors=non_tensors, meta_info=dict(prompts.meta_info)
    )
