"""Memory-lean log-probability and entropy helpers for causal language models.

A full-vocabulary logits tensor is the largest activation in RL post-training: for a batch
of 16 sequences of 256 tokens and a 32k vocabulary it is 0.5 GB in float32, and the naive
``log_softmax(logits.float()).gather(...)`` makes one or two more copies of it. The helpers
here never hold more than ``chunk_size`` rows of float32 logits at a time:

- :func:`logprobs_from_logits` / :func:`entropy_from_logits` work on logits you already
  have, upcasting one row chunk at a time. Their backward passes recompute the softmax per
  chunk from the saved input (no float32 copy is kept for autograd). They are defined in
  :mod:`verl.kernels.logprob_kernels`.
- :func:`compute_response_log_probs` runs the base transformer once and applies the LM head
  only to the positions that predict response tokens, chunk by chunk. With gradients
  enabled each chunk is checkpointed, so the head's logits are recomputed in backward
  instead of being stored.

Log-probs are those of the temperature-scaled distribution ``softmax(logits / T)`` before
any top-k / top-p filtering, which is the convention the rollout engines sample with.

Packed passes (``pack=True``) run through :mod:`verl.kernels.packed_model`.
"""

from __future__ import annotations

import inspect
import logging

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from verl.kernels import packed_model, vision_packing
from verl.kernels.logprob_kernels import (
    DEFAULT_CHUNK_SIZE,
    LogProbEntropy,
    check_chunk_size,
    entropy_from_logits,
    logprobs_from_logits,
    row_chunks,
)
from verl.kernels.vocab_parallel import local_logits, vocab_parallel_log_probs, vocab_parallel_of

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "compute_response_log_probs",
    "entropy_from_logits",
    "logprobs_from_logits",
]


def _head_logprobs(
    lm_head: nn.Module,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    calculate_entropy: bool,
    calculate_sum_pi_squared: bool = False,
    disposable: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Apply the LM head to ``hidden (rows, H)`` and score ``labels (rows,)``.
    ``disposable``: backward may overwrite the logits (see :class:`LogProbEntropy`): only
    when this call is checkpointed, so that backward reads a recomputed copy."""
    shard = vocab_parallel_of(lm_head)
    if shard is not None:  # tensor parallelism: score this rank's logit columns
        with local_logits():
            logits = lm_head(hidden).float()
        if temperature != 1.0:
            logits = logits / temperature
        return vocab_parallel_log_probs(
            logits, labels, shard, calculate_entropy, calculate_sum_pi_squared
        )
    # The head's output may be bf16 under autocast; the chunk is small, so upcast it whole
    # before dividing by the temperature to keep the division in float32.
    out = lm_head(hidden)
    logits = out.float()
    if temperature != 1.0:
        # in place on the float32 copy of a bf16 head output (one temporary fewer)
        logits = logits.div_(temperature) if logits is not out else logits / temperature
    log_probs, entropy = LogProbEntropy.apply(logits, labels, calculate_entropy, disposable)
    sum_pi_squared = None
    if calculate_sum_pi_squared:
        sum_pi_squared = torch.softmax(logits, dim=-1).square().sum(dim=-1).detach()
    return log_probs, entropy, sum_pi_squared


def compute_response_log_probs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    calculate_entropy: bool = False,
    calculate_sum_pi_squared: bool = False,
    pack: bool = False,
    share_prefix: bool = False,
    model_inputs: dict[str, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    """Log-probs (and optionally entropies) of the response tokens under a causal LM.

    The sequence is ``cat(prompt, response)`` with the response in the last
    ``response_len`` columns. Hidden state ``t`` predicts token ``t + 1``, so the positions
    ``[-response_len - 1, -1)`` are the only ones sent through the LM head, ``chunk_size``
    tokens at a time. Runs under whatever grad mode the caller set: in train mode gradients
    flow to all parameters, and each head chunk is checkpointed (its logits are recomputed
    in backward rather than stored).

    For Llama / Qwen2 / Qwen3 / Mistral the base transformer (``model.model``) and the head
    (``model.lm_head``) are called separately; other models fall back to
    ``model(..., logits_to_keep=response_len + 1)`` and score the returned logits chunk-wise.

    Args:
        model: a Hugging Face causal LM.
        input_ids: ``(batch, seq_len)`` prompt (left-padded) + response (right-padded).
        attention_mask: ``(batch, seq_len)`` 1 for real tokens.
        position_ids: ``(batch, seq_len)``.
        response_len: number of response columns ``R`` at the end of the sequence.
        temperature: the rollout sampling temperature; log-probs are of ``softmax(logits/T)``.
        chunk_size: tokens per LM-head chunk.
        calculate_entropy: also return per-token entropies of ``softmax(logits/T)``.
        calculate_sum_pi_squared: also return, as a third element, ``sum_v pi(v)^2`` of
            ``softmax(logits/T)`` per token (detached; the optimal token baseline's
            ``||grad_logits log pi(y_t)||^2 = 1 - 2 pi(y_t) + sum_v pi(v)^2`` needs it).
        pack: run the base transformer on the rows' real tokens packed end to end
            (:func:`verl.kernels.packing.pack_sequences`: no padding compute, attention kept
            within each sequence) and the head on the valid response tokens only. Models
            without the plain head path run padded. Padded response positions are then 0.
        share_prefix: with ``pack``, rows with identical real prompt ids share one copy of
            the prompt (:func:`verl.kernels.prefix_packing.pack_shared_prefix`, an explicit
            attention mask; same results). Attention implementations that take no custom
            4D mask (flash-attention varlen, flex) use plain packing, logged once.
        model_inputs: more keyword arguments of the model's forward (a vision-language
            model's ``pixel_values`` and ``image_grid_thw``, ``position_ids`` then its
            ``(4, batch, seq_len)`` multimodal rope index; ``{}`` for an image batch whose
            rows have none): the padded ``model(..., logits_to_keep)`` path, or with ``pack``
            the image batch packed (:mod:`verl.kernels.vision_packing`); no sequence
            parallelism.

    Returns:
        ``(log_probs, entropy)``: float32 ``(batch, response_len)`` each; ``entropy`` is
        ``None`` unless ``calculate_entropy``. With ``calculate_sum_pi_squared``,
        ``(log_probs, entropy, sum_pi_squared)``. Padded response positions get finite
        values that the caller masks with ``response_mask``.
    """
    check_chunk_size(chunk_size)
    batch, seq_len = input_ids.shape
    if not 0 < response_len < seq_len:
        raise ValueError(
            f"response_len={response_len} must be in [1, seq_len - 1] for input_ids of shape "
            f"{tuple(input_ids.shape)} (the first response token needs one prompt token)"
        )
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 (greedy decoding uses 1.0 here)")
    labels = input_ids[:, -response_len:].reshape(-1)
    # a peft model (LoRA) runs its adapters inside the base model's layers
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base):
        model = get_base()

    from verl.kernels.ulysses import sequence_parallel_of

    sp = sequence_parallel_of(model)
    if model_inputs and sp is not None:
        raise ValueError(
            f"model inputs {sorted(model_inputs)} (images) take no sequence parallelism: set "
            "ulysses_sequence_parallel_size=1"
        )
    if sp is not None:  # this rank computes 1/sp of the tokens (verl.kernels.ulysses)
        shard, labels, place = packed_model.sequence_parallel_inputs(
            model, sp, input_ids, attention_mask, position_ids, response_len, pack, share_prefix
        )
        with shard.forward_kwargs() as kwargs:
            out = model.model(input_ids=shard.input_ids, use_cache=False, **kwargs)
        results = _score_chunks(
            model.lm_head,
            shard.select(out.last_hidden_state),
            shard.select_wanted(labels),
            temperature,
            chunk_size,
            calculate_entropy,
            calculate_sum_pi_squared,
        )
        # one gather for all per-token outputs: (rows, k) -> every rank's, in batch order
        present = [v for v in results if v is not None]
        gathered = shard.gather(torch.stack(present, dim=-1)).unbind(-1)
        it = iter(gathered)
        log_probs, entropy, sps = (None if v is None else place(next(it)) for v in results)
        if sps is not None:
            sps = sps.detach()
        return (log_probs, entropy, sps) if calculate_sum_pi_squared else (log_probs, entropy)

    if pack and model_inputs is not None:  # an image batch (verl.kernels.vision_packing)
        hidden, packed = vision_packing.packed_image_response_hidden(
            model, input_ids, attention_mask, position_ids, response_len, model_inputs, share_prefix
        )
    elif pack and packed_model.has_plain_head(model):
        hidden, packed = packed_model.packed_response_hidden(
            model.model, input_ids, attention_mask, response_len, share_prefix
        )
    if pack and (model_inputs is not None or packed_model.has_plain_head(model)):
        results = _score_chunks(
            model.lm_head,
            hidden,
            packed.labels,
            temperature,
            chunk_size,
            calculate_entropy,
            calculate_sum_pi_squared,
        )
        mask = packed.response_mask

        def unpack(values):
            if values is None:
                return None
            return values.new_zeros(mask.shape).masked_scatter(mask, values)

        log_probs, entropy, sps = (unpack(v) for v in results)
        return (log_probs, entropy, sps) if calculate_sum_pi_squared else (log_probs, entropy)

    if packed_model.has_plain_head(model) and not model_inputs:
        out = model.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        )
        hidden = out.last_hidden_state[:, -response_len - 1 : -1]
        hidden = hidden.reshape(batch * response_len, hidden.shape[-1])
        head = model.lm_head
    else:
        logger.debug(
            "model_type=%r has no plain LM-head path; scoring model(..., logits_to_keep) output",
            getattr(getattr(model, "config", None), "model_type", None),
        )
        kwargs = dict(model_inputs or {})
        if "logits_to_keep" in inspect.signature(model.forward).parameters:
            kwargs["logits_to_keep"] = response_len + 1
        logits = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **kwargs,
        ).logits[:, -response_len - 1 : -1]
        hidden = logits.reshape(batch * response_len, logits.shape[-1])
        head = nn.Identity()

    log_probs, entropy, sps = (
        None if v is None else v.view(batch, response_len)
        for v in _score_chunks(
            head,
            hidden,
            labels,
            temperature,
            chunk_size,
            calculate_entropy,
            calculate_sum_pi_squared,
        )
    )
    if calculate_sum_pi_squared:
        return log_probs, entropy, sps
    return log_probs, entropy


def _score_chunks(
    head: nn.Module,
    hidden: torch.Tensor,
    labels: torch.Tensor,
    temperature: float,
    chunk_size: int,
    calculate_entropy: bool,
    calculate_sum_pi_squared: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """:func:`_head_logprobs` over ``hidden (rows, H)`` ``chunk_size`` rows at a time (each
    chunk checkpointed under grad); returns ``(log_probs, entropy, sum_pi_squared)``, each
    ``(rows,)`` or None."""
    use_checkpoint = torch.is_grad_enabled() and hidden.requires_grad
    multiple = packed_model.shape_multiple(head)
    log_prob_chunks, entropy_chunks, sps_chunks = [], [], []
    # no valid token (a packed micro-batch of empty responses): one empty chunk keeps the
    # outputs in the autograd graph
    for s, e in list(row_chunks(hidden.shape[0], chunk_size)) or [(0, 0)]:
        chunk_hidden, chunk_labels = hidden[s:e], labels[s:e]
        pad = -(e - s) % multiple  # zero rows, scored and dropped: few distinct shapes
        if pad:
            chunk_hidden = torch.cat([chunk_hidden, chunk_hidden.new_zeros(pad, hidden.shape[1])])
            chunk_labels = torch.cat([chunk_labels, chunk_labels.new_zeros(pad)])
        args = (
            head,
            chunk_hidden,
            chunk_labels,
            temperature,
            calculate_entropy,
            calculate_sum_pi_squared,
        )
        if use_checkpoint:
            lp, ent, sps = checkpoint(_head_logprobs, *args, True, use_reentrant=False)
        else:
            lp, ent, sps = _head_logprobs(*args)
        rows = slice(0, e - s)
        log_prob_chunks.append(lp[rows])
        entropy_chunks.append(None if ent is None else ent[rows])
        sps_chunks.append(None if sps is None else sps[rows])
    return (
        torch.cat(log_prob_chunks),
        torch.cat(entropy_chunks) if calculate_entropy else None,
        torch.cat(sps_chunks) if calculate_sum_pi_squared else None,
    )
