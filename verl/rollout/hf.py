"""The ``hf`` rollout backend: transformers ``model.generate`` behind the rollout interface.

A reference and fallback for the native engine: same inputs, same output layout, same
log-prob convention (``verl.rollout.base``). ``generate`` is asked for the raw logits of every
step (``output_logits``), from which ``log_softmax(logits / T)`` at the sampled tokens gives
``rollout_log_probs``; transformers' processed scores would be the truncated distribution.

Responses end at the first stop token; stop strings are applied afterwards with the same
tail-window check as the native engine (transformers keeps generating those rows, which
costs compute but keeps both backends ending a response at the same token). ``n`` samples
use ``num_return_sequences`` (adjacent rows, like ``repeat_interleave``); transformers then
encodes each prompt ``n`` times.

Image prompts (a vision-language model such as Qwen2-VL; the keys of
``verl.rollout.base.IMAGE_KEYS``): the rows' ``pixel_values`` and ``image_grid_thw`` (the
per-row dicts of ``non_tensor_batch["multi_modal_inputs"]``, concatenated in row order) and
``mm_token_type_ids`` go to ``generate``. The output then also holds, for the training
passes, ``mm_token_type_ids`` ``(B*n, P+R)`` (0 over the responses) and
``multimodal_position_ids`` ``(B*n, P+R, 4)``: row 0 the text positions, rows 1-3 the
model's own ``get_rope_index`` over the whole sequence (responses are text: their positions
continue from the prompt's largest, as generation placed them), 0 on padding. The per-row
image dicts are repeated ``n`` times like every non-tensor key.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any

import torch

from verl.rollout.base import (
    IMAGE_INPUTS_KEY,
    MM_TOKEN_TYPES_KEY,
    MULTIMODAL_POSITIONS_KEY,
    RolloutEngine,
    SamplingParams,
    assemble_rollout_output,
    eval_mode,
    validate_prompts,
)
from verl.rollout.stopping import StopStringChecker

logger = logging.getLogger(__name__)

__all__ = ["HFRollout"]


class HFRollout(RolloutEngine):
    """Rollout through ``module.generate``; arguments as for ``NativeRollout``."""

    def __init__(
        self,
        module: torch.nn.Module,
        tokenizer: Any = None,
        *,
        pad_token_id: int | None = None,
        eos_token_ids: list[int] | None = None,
        stop_string_window: int | None = None,
    ) -> None:
        if not hasattr(module, "generate"):
            raise TypeError(
                f"{type(module).__name__} has no .generate(); the hf rollout needs a "
                "transformers PreTrainedModel (use rollout.name=native for other modules)"
            )
        super().__init__(
            module,
            tokenizer,
            pad_token_id=pad_token_id,
            eos_token_ids=eos_token_ids,
            stop_string_window=stop_string_window,
        )

    def _generation_kwargs(self, params: SamplingParams, stop_ids: list[int]) -> dict[str, Any]:
        kwargs: dict[str, Any] = dict(
            max_new_tokens=params.max_new_tokens,
            num_return_sequences=params.n,
            do_sample=not params.greedy,
            pad_token_id=self.pad_token_id,
            # An explicit None keyword disables eos stopping in transformers 5 (leaving the
            # key out would use the model's generation config).
            eos_token_id=stop_ids if stop_ids else None,
            return_dict_in_generate=True,
            output_logits=True,
            use_cache=True,
            min_new_tokens=0,
            repetition_penalty=1.0,
        )
        if not params.greedy:
            # transformers fills unset knobs from its global defaults (top_k=50): pass all.
            kwargs.update(
                temperature=float(params.temperature),
                top_k=params.top_k if params.top_k > 0 else 0,
                top_p=float(params.top_p),
            )
        return kwargs

    def generate(self, prompts: Any, params: SamplingParams) -> Any:
        """Sample ``params.n`` responses per prompt (layout: ``verl.rollout.base``)."""
        input_ids, attention_mask, position_ids = validate_prompts(prompts, images=True)
        image_inputs = _image_inputs(prompts)
        checker = StopStringChecker(self.tokenizer, params.stop_strings, self.stop_string_window)
        stop_ids = (
            params.stop_token_ids if params.stop_token_ids is not None else self.eos_token_ids
        )
        device = next(self.module.parameters()).device
        max_new = params.max_new_tokens
        # A fixed seed must not leave the global RNG changed; seed=None draws from it.
        rng = torch.random.fork_rng(devices=[]) if params.seed is not None else nullcontext()
        # no_grad, not inference_mode: autocast caches its weight casts only outside it
        with eval_mode(self.module), torch.no_grad(), rng:
            if params.seed is not None:
                torch.manual_seed(params.seed)
            out = self.module.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                **{k: v.to(device) for k, v in image_inputs.items()},
                **self._generation_kwargs(params, stop_ids),
            )
            gen = out.sequences[:, input_ids.shape[1] :]
            rows, got = gen.shape
            temp = params.logprob_temperature
            # One step at a time: stacking every step's logits is a (rows, R, vocab) tensor.
            chosen = torch.stack(
                [
                    (step_logits.float() / temp)
                    .log_softmax(-1)
                    .gather(-1, gen[:, t : t + 1])
                    .squeeze(-1)
                    for t, step_logits in enumerate(out.logits)
                ],
                dim=1,
            )
            lengths = torch.full((rows,), got, dtype=torch.long, device=gen.device)
            if stop_ids:
                is_stop = torch.isin(gen, torch.tensor(stop_ids, device=gen.device))
                first = is_stop.int().argmax(dim=1)
                lengths = torch.where(is_stop.any(dim=1), first + 1, lengths)
            lengths = checker.first_stops(gen, lengths)
            mask = torch.arange(max_new, device=gen.device) < lengths.unsqueeze(1)
            responses = torch.full(
                (rows, max_new), self.pad_token_id, dtype=torch.long, device=gen.device
            )
            responses[:, :got] = gen
            responses.masked_fill_(~mask, self.pad_token_id)
            rollout_log_probs = torch.zeros(rows, max_new, dtype=torch.float32, device=gen.device)
            rollout_log_probs[:, :got] = chosen
            rollout_log_probs.masked_fill_(~mask, 0.0)
        out = assemble_rollout_output(
            prompts, params, responses, mask, rollout_log_probs, position_ids=position_ids
        )
        if image_inputs:
            _add_multimodal_positions(self.module, out)
        return out


def _image_inputs(prompts: Any) -> dict[str, torch.Tensor]:
    """``generate``'s image keywords of an image batch (``{}`` for text prompts)."""
    rows = prompts.non_tensor_batch.get(IMAGE_INPUTS_KEY)
    if rows is None:
        return {}
    if MM_TOKEN_TYPES_KEY not in prompts.batch:
        raise KeyError(
            f"image prompts need {MM_TOKEN_TYPES_KEY!r} (text 0, image 1) in the batch; "
            "collate them with verl.data.vision_dataset.collate_vision_prompts"
        )
    with_images = [r for r in rows if r]
    out = {MM_TOKEN_TYPES_KEY: prompts.batch[MM_TOKEN_TYPES_KEY]}
    if with_images:
        out["pixel_values"] = torch.cat([r["pixel_values"] for r in with_images])
        out["image_grid_thw"] = torch.cat([r["image_grid_thw"] for r in with_images])
    return out


def rope_index_of(module: torch.nn.Module) -> Any:
    """The ``get_rope_index`` of the (sub)module that defines it (Qwen2-VL's base model)."""
    for sub in module.modules():
        if hasattr(type(sub), "get_rope_index"):
            return sub.get_rope_index
    raise ValueError(
        f"{type(module).__name__} has no get_rope_index: image prompts need a model with a "
        "multimodal rope index (the Qwen2-VL family)"
    )


def _add_multimodal_positions(module: torch.nn.Module, out: Any) -> None:
    """Add ``multimodal_position_ids`` (rows, P+R, 4) and the full-width
    ``mm_token_type_ids`` to a rollout output of image prompts (module docstring)."""
    batch = out.batch
    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    prompt_types = batch[MM_TOKEN_TYPES_KEY]
    types = torch.cat(
        [prompt_types, prompt_types.new_zeros(len(out), batch["responses"].shape[1])], dim=1
    )
    rows = out.non_tensor_batch[IMAGE_INPUTS_KEY]
    grids = [r["image_grid_thw"] for r in rows if r]
    grid = torch.cat(grids).to(input_ids.device) if grids else None
    with torch.no_grad():
        vision, _ = rope_index_of(module)(
            input_ids,
            mm_token_type_ids=types,
            image_grid_thw=grid,
            attention_mask=attention_mask,
        )
    text = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    positions = torch.cat([text.unsqueeze(0), vision.to(text.device, text.dtype)], dim=0)
    batch[MM_TOKEN_TYPES_KEY] = types
    batch[MULTIMODAL_POSITIONS_KEY] = positions.permute(1, 2, 0).contiguous()
