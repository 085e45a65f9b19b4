"""The reward-model worker: scores finished responses with a sequence-classification model.

A reward model (RM) is a local ``AutoModelForSequenceClassification`` with one label. Its
score for a sequence is the ``score`` head applied to the hidden state of the sequence's
last real token; the worker places it on the last valid response token (``rm_scores``,
``(batch, response_len)``), the same layout as rule-based ``token_level_scores``.

Two input paths:

- same vocabulary as the actor (``get_vocab()`` equal, compared once at init through its
  size and a hash): the actor's ``input_ids`` / ``attention_mask`` are scored as they are.
  The layout is prompt left-padded + response right-padded, so the body is run with the
  attention mask and positions ``cumsum(mask) - 1``, and the head is applied at the last
  position whose mask is 1. HF's own pooling is not used: it looks for the last token that
  is not ``pad_token_id``, which is wrong when the response's eos is the pad token.
- different vocabulary (or ``retokenize=True``): the response is decoded with the actor
  tokenizer (special tokens skipped), appended to the ``raw_prompt`` messages as an
  assistant turn, rendered with the RM tokenizer's chat template and re-encoded, right-padded.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import torch

from verl.controller import Dispatch, Worker, register
from verl.models import load_reward_model, load_tokenizer, resolve_dtype
from verl.protocol import DataProto
from verl.rewards.placement import last_valid_index, place_on_last_token
from verl.utils.device import resolve_device
from verl.workers.common import apply_inference_precision, dynamic_precision
from verl.workers.specs import RewardModelSpec, check_spec

logger = logging.getLogger(__name__)


def vocab_fingerprint(tokenizer: Any) -> tuple[int, str]:
    """``(vocab size, sha256 of the sorted token -> id pairs)`` of ``tokenizer.get_vocab()``."""
    vocab = tokenizer.get_vocab()
    h = hashlib.sha256()
    for token, index in sorted(vocab.items()):
        h.update(f"{token}\x00{index}\x01".encode("utf-8", "surrogatepass"))
    return len(vocab), h.hexdigest()


def last_token_scores(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Scalar RM score of each row, float32 ``(batch,)``.

    ``input_ids`` / ``attention_mask``: ``(batch, seq_len)``, any padding layout (left,
    right or both); the score is read at the last position where the mask is 1.
    """
    attention_mask = attention_mask.long()
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    out = model.base_model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
    )
    last = last_valid_index(attention_mask)
    hidden = out.last_hidden_state[torch.arange(input_ids.shape[0], device=last.device), last]
    return model.score(hidden).squeeze(-1).float()


def _messages(raw_prompt: Any) -> list[dict[str, str]]:
    """``raw_prompt`` as a list of chat messages (a plain string is one user turn)."""
    if isinstance(raw_prompt, str):
        return [{"role": "user", "content": raw_prompt}]
    return [dict(m) for m in raw_prompt]


class RewardModelWorker(Worker):
    """Scores responses with ``reward_model.model.path`` (inference only, no engine).

    Args:
        spec: what the worker reads (:func:`verl.workers.specs.reward_model_spec`; the
            actor tokenizer path is read when ``actor_tokenizer`` is not given).
        module: an already-built sequence-classification RM to use instead of loading one.
        tokenizer: the RM's tokenizer (default: ``model.tokenizer_path`` or ``model.path``).
        actor_tokenizer: the policy's tokenizer, which produced the ids to score.
        retokenize: ``None`` decides from the vocabularies; ``True`` always re-encodes text
            with the RM tokenizer; ``False`` always scores the actor's ids.
    """

    def __init__(
        self,
        spec: RewardModelSpec,
        module: torch.nn.Module | None = None,
        tokenizer: Any = None,
        actor_tokenizer: Any = None,
        retokenize: bool | None = None,
        **worker_kwargs: Any,
    ) -> None:
        super().__init__(**worker_kwargs)
        check_spec(spec, RewardModelSpec, "reward_model_spec")
        self.spec = spec
        self.module = module
        self.dynamic = None  # DynamicPrecision (trainer.dynamic_precision=true)
        self.tokenizer = tokenizer
        self.actor_tokenizer = actor_tokenizer
        self.retokenize = retokenize
        self.device = resolve_device(spec.device, self.local_rank or 0)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Load the RM and its tokenizer (unless given) and decide the input path."""
        spec = self.spec
        where = spec.path if self.module is None else f"<given {type(self.module).__name__}>"
        given = self.module is not None
        if self.module is None:
            if not spec.path:
                raise ValueError(
                    "reward_model.model.path is null; set it to a local sequence-classification "
                    "reward model directory (or disable reward_model.enable)"
                )
            self.module = load_reward_model(
                spec.path, dtype=spec.dtype, override_config=spec.override_config
            )
        num_labels = self.module.config.num_labels
        if num_labels != 1:
            raise ValueError(
                f"reward model {where} has num_labels={num_labels}; a reward model must output "
                "one scalar (AutoModelForSequenceClassification with num_labels=1)"
            )
        if not isinstance(getattr(self.module, "score", None), torch.nn.Linear):
            raise TypeError(
                f"reward model {where} ({type(self.module).__name__}) has no linear `score` "
                "head; expected a decoder sequence-classification model such as "
                "LlamaForSequenceClassification or Qwen2ForSequenceClassification"
            )
        self.module = self.module.eval().requires_grad_(False).to(self.device)
        if spec.precision in ("fp32", "bf16", "fp16"):
            self.module.to(resolve_dtype(spec.precision))
        self.module = apply_inference_precision(spec.precision, self.module)
        self.dynamic = dynamic_precision(
            "reward",
            self.module,
            self.device,
            spec.dynamic_min_free_gb,
            reload=None
            if given
            else lambda: load_reward_model(
                spec.path, dtype=spec.dtype, override_config=spec.override_config
            ).state_dict(),
        )

        if self.tokenizer is None:
            path = spec.tokenizer_path
            if not path:
                raise ValueError(
                    "the reward model was given without a tokenizer and "
                    "reward_model.model.tokenizer_path / model.path are null; pass tokenizer="
                )
            self.tokenizer = load_tokenizer(path)
        if self.actor_tokenizer is None:
            self.actor_tokenizer = load_tokenizer(
                spec.actor_tokenizer_path, trust_remote_code=spec.actor_trust_remote_code
            )
        if self.retokenize is None:
            same = vocab_fingerprint(self.tokenizer) == vocab_fingerprint(self.actor_tokenizer)
            self.retokenize = not same
        logger.info(
            "reward model %s: %s",
            where,
            "re-encoding text with its own tokenizer"
            if self.retokenize
            else "scoring the actor's token ids (same vocabulary)",
        )

    # ------------------------------------------------------------------ inputs
    def _actor_id_batches(self, data: DataProto, mbs: int):
        """Micro-batches of the actor's ``(input_ids, attention_mask)``, all-pad columns cut."""
        ids_all, mask_all = data.batch["input_ids"], data.batch["attention_mask"]
        for start in range(0, len(data), mbs):
            ids, mask = ids_all[start : start + mbs], mask_all[start : start + mbs]
            used = (mask != 0).any(0).nonzero().flatten()
            if used.numel():
                ids = ids[:, used[0] : used[-1] + 1]
                mask = mask[:, used[0] : used[-1] + 1]
            yield ids, mask

    def _encode(self, messages: list[dict[str, str]], response: str) -> list[int]:
        """RM token ids of a prompt plus an assistant turn holding ``response``."""
        if self.tokenizer.chat_template is None:
            # No template: the same plain layout the dataset uses for base models.
            text = "\n".join([m["content"] for m in messages] + [response])
            return self.tokenizer(text, add_special_tokens=True)["input_ids"]
        chat = [*messages, {"role": "assistant", "content": response}]
        text = self.tokenizer.apply_chat_template(chat, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _retokenized_batches(self, data: DataProto, mbs: int):
        """Micro-batches of RM-tokenized ``(input_ids, attention_mask)``, right-padded."""
        if "raw_prompt" not in data.non_tensor_batch:
            raise KeyError(
                "the reward model's tokenizer differs from the actor's, so it scores text and "
                "needs the 'raw_prompt' messages in non_tensor_batch; keep 'raw_prompt' in the "
                "batch (it comes from the dataset)"
            )
        raw_prompts = data.non_tensor_batch["raw_prompt"]
        responses, response_mask = data.batch["responses"], data.batch["response_mask"]
        pad_id = self.tokenizer.pad_token_id
        pad_id = 0 if pad_id is None else pad_id
        for start in range(0, len(data), mbs):
            rows = []
            for i in range(start, min(start + mbs, len(data))):
                ids = responses[i][response_mask[i] != 0].tolist()
                text = self.actor_tokenizer.decode(ids, skip_special_tokens=True)
                rows.append(self._encode(_messages(raw_prompts[i]), text))
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for j, row in enumerate(rows):
                ids[j, : len(row)] = torch.tensor(row, dtype=torch.long)
                mask[j, : len(row)] = 1
            yield ids, mask

    # ------------------------------------------------------------------ scoring
    @register(
        dispatch_mode=Dispatch.DP_COMPUTE,
        reads=("input_ids", "attention_mask", "responses", "response_mask"),
        optional=("raw_prompt",),
    )
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` float32 ``(batch, response_len)``: each sequence's RM score on its
        last valid response token (position 0 for an empty response), 0 elsewhere.

        Reads ``input_ids``, ``attention_mask``, ``responses``, ``response_mask`` and, on the
        re-tokenize path, ``non_tensor_batch["raw_prompt"]``.
        """
        if self.module is None:
            raise RuntimeError("RewardModelWorker.compute_rm_score called before init_model()")
        mbs = self.spec.micro_batch_size
        if self.dynamic is not None:
            self.dynamic.before_phase()
        batches = (
            self._retokenized_batches(data, mbs)
            if self.retokenize
            else self._actor_id_batches(data, mbs)
        )
        scores = []
        with torch.no_grad():
            for ids, mask in batches:
                ids, mask = ids.to(self.device), mask.to(self.device)
                scores.append(last_token_scores(self.module, ids, mask).cpu())
        seq_scores = torch.cat(scores) if scores else torch.zeros(0)
        rm_scores = place_on_last_token(seq_scores, data.batch["response_mask"].cpu())
        return DataProto.from_dict(tensors={"rm_scores": rm_scores})


__all__ = ["RewardModelWorker", "last_token_scores", "vocab_fingerprint"]
