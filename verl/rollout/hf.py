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
continue from the prompt's largest, as generation placed them), 0 on padding
(:mod:`verl.rollout.images`). The per-row image dicts are repeated ``n`` times like every
non-tensor key.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from typing import Any

import torch

from verl.rollout.base import (
    RolloutEngine,
    SamplingParams,
    assemble_rollout_output,
    eval_mode,
    validate_prompts,
)
from verl.rollout.images import add_multimodal_positions, image_inputs
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
        images = image_inputs(prompts)
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
                **{k: v.to(device) for k, v in images.items()},
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
        if images:
            add_multimodal_positions(self.module, out, self.pad_token_id)
        return out
