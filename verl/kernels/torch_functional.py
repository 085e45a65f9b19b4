"""Memory-lean log-probability and entropy helpers for causal language models.

A full-vocabulary logits tensor is the largest activation in RL post-training: for a batch
of 16 sequences of 256 tokens and a 32k vocabulary it is 0.5 GB in float32, and the naive
``log_softmax(logits.float()).gather(...)`` makes one or two more copies of it. The helpers
here never hold more than ``chunk_size`` rows of float32 logits at a time:

- :func:`logprobs_from_logits` / :func:`entropy_from_logits` work on logits you already
  have, upcasting one row chunk at a time. Their backward passes recompute the softmax per
  chunk from the saved input (no float32 copy is kept for autograd).
- :func:`compute_response_log_probs` runs the base transformer once and applies the LM head
  only to the positions that predict response tokens, chunk by chunk. With gradients
  enabled each chunk is checkpointed, so the head's logits are recomputed in backward
  instead of being stored.

Log-probs are those of the temperature-scaled distribution ``softmax(logits / T)`` before
any top-k / top-p filtering, which is the convention the rollout engines sample with.
"""

from __future__ import annotations

import contextlib
import inspect
import logging

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from verl.kernels import block_attention
from verl.kernels.packing import PackedBatch, pack_sequences
from verl.kernels.prefix_packing import pack_shared_prefix, prompt_groups

logger = logging.getLogger(__name__)

DEFAULT_CHUNK_SIZE = 128  # tokens per chunk; see bench/bench_logprob.py for the trade-off

# oneDNN, which runs torch's bf16/fp16 matmuls on a CPU, builds kernels for every new
# (M, N, K) it sees and keeps them: ~1.7 MiB of heap per new shape of a linear's forward
# and backward that no malloc_trim returns (torch 2.13, measured in docs/memory.md). A
# packed pass has a data-dependent width, so a bf16 run grew ~30 MiB per step on W2 and
# never stopped. Rounding the packed width and the LM head's last chunk up to a multiple of
# this bounds the shapes a run ever sees, at the cost of a few filler columns.
CPU_REDUCED_PRECISION_SHAPE_MULTIPLE = 64

# Model types whose causal-LM head is exactly ``lm_head(model(...).last_hidden_state)``.
# Others (Gemma soft-capping, Cohere logit_scale, Granite logits_scaling, ...) post-process
# the logits, so they take the generic ``model(..., logits_to_keep=...)`` path.
_PLAIN_HEAD_MODEL_TYPES = frozenset(
    {"llama", "qwen2", "qwen3", "mistral", "qwen2_moe", "qwen3_moe", "smollm3"}
)


def _check_chunk_size(chunk_size: int) -> None:
    if chunk_size <= 0:
        raise ValueError(f"chunk_size={chunk_size} must be a positive number of rows")


def _row_chunks(n_rows: int, chunk_size: int):
    for start in range(0, n_rows, chunk_size):
        yield start, min(start + chunk_size, n_rows)


class _ChunkedLogProb(torch.autograd.Function):
    """log softmax(x)[label] over rows of a 2-D ``(rows, vocab)`` tensor, chunk by chunk."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, chunk_size: int):
        n_rows = logits.shape[0]
        out = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        lse = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        for s, e in _row_chunks(n_rows, chunk_size):
            chunk = logits[s:e].float()
            lse[s:e] = torch.logsumexp(chunk, dim=-1)
            out[s:e] = chunk.gather(-1, labels[s:e, None]).squeeze(-1) - lse[s:e]
        ctx.save_for_backward(logits, labels, lse)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, labels, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for s, e in _row_chunks(logits.shape[0], ctx.chunk_size):
            g = grad_out[s:e].float()
            # d/dx_j log p_label = onehot_j - p_j
            chunk = torch.exp(logits[s:e].float() - lse[s:e, None]).mul_(-g[:, None])
            chunk.scatter_add_(-1, labels[s:e, None], g[:, None])
            grad[s:e] = chunk
        return grad, None, None


class _ChunkedEntropy(torch.autograd.Function):
    """Entropy of softmax(x) over rows of a 2-D ``(rows, vocab)`` tensor, chunk by chunk."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, chunk_size: int):
        n_rows = logits.shape[0]
        lse = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        mean_logit = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
        for s, e in _row_chunks(n_rows, chunk_size):
            chunk = logits[s:e].float()
            lse[s:e] = torch.logsumexp(chunk, dim=-1)
            probs = torch.exp(chunk - lse[s:e, None])
            # nansum: a -inf logit (a banned token) has p = 0 and contributes 0 * -inf -> 0
            mean_logit[s:e] = (probs * chunk).nansum(-1)
        ctx.save_for_backward(logits, lse, mean_logit)
        ctx.chunk_size = chunk_size
        # H = logsumexp(x) - E_p[x]
        return lse - mean_logit

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, lse, mean_logit = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for s, e in _row_chunks(logits.shape[0], ctx.chunk_size):
            chunk = logits[s:e].float()  # a view when logits is already float32
            probs = torch.exp(chunk - lse[s:e, None])
            # dH/dx_j = -p_j (x_j - E_p[x])
            centered = chunk - mean_logit[s:e, None]
            centered.masked_fill_(probs == 0, 0.0)  # -inf logits get zero gradient, not nan
            grad[s:e] = centered.mul_(probs).mul_(-grad_out[s:e, None].float())
        return grad, None


class _LogProbEntropy(torch.autograd.Function):
    """Log-probabilities of ``labels`` and (``with_entropy``) entropies of the rows of a
    float32 ``(rows, vocab)`` logits tensor in one pass: one log-sum-exp and one probability
    tensor serve both, and backward recomputes the probabilities once for both gradients
    (the entropy's only when the entropy reached the loss).

    Every vocabulary-wide temporary is a fresh allocation of ``rows x vocab`` floats, which
    a CPU fills page by page (a 100 MB chunk: ~20 ms of page faults per temporary against
    ~6 ms for the arithmetic), so there are as few as the math allows: forward one (the
    shifted exponentials, reused for the entropy's mean logit), backward one (the
    probabilities). ``disposable=True`` lets backward write the gradient into ``logits``
    itself: only for logits that nothing else reads after this function (a checkpointed
    chunk's, which backward recomputes)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, with_entropy: bool, disposable):
        ctx.set_materialize_grads(False)
        top = logits.amax(dim=-1)
        shifted = torch.sub(logits, top[:, None]).exp_()  # exp(x - max)
        total = shifted.sum(-1)
        lse = total.log().add_(top)
        log_probs = logits.gather(-1, labels[:, None]).squeeze(-1) - lse
        entropy = mean_logit = None
        if with_entropy:
            # E_p[x] = sum exp(x - max) x / sum exp(x - max); a -inf logit (a banned token)
            # has p = 0: 0 * -inf is nan, and nansum drops it
            mean_logit = shifted.mul_(logits).nansum(-1).div_(total)
            entropy = lse - mean_logit  # H = logsumexp(x) - E_p[x]
        del shifted
        ctx.save_for_backward(logits, labels, lse, mean_logit)
        ctx.disposable = bool(disposable)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, grad_entropy):
        logits, labels, lse, mean_logit = ctx.saved_tensors
        probs = torch.sub(logits, lse[:, None]).exp_()
        g = grad_log_probs.float() if grad_log_probs is not None else None
        if grad_entropy is not None:
            # dH/dx_j = -p_j (x_j - E_p[x]); d log p_label / dx_j = onehot_j - p_j
            if ctx.disposable:
                grad = logits.sub_(mean_logit[:, None])
            else:
                grad = torch.sub(logits, mean_logit[:, None])
            grad.mul_(-grad_entropy.float()[:, None])
            if g is not None:
                grad.sub_(g[:, None])
            # a -inf logit has p = 0 and an infinite (x - E_p[x]): its 0 * inf is nan -> 0
            grad.mul_(probs).nan_to_num_(nan=0.0)
        elif g is not None:
            grad = probs.mul_(-g[:, None])
        else:
            return None, None, None, None
        if g is not None:
            grad.scatter_add_(-1, labels[:, None], g[:, None])
        return grad, None, None, None


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> torch.Tensor:
    """Log-probabilities of ``labels`` under ``softmax(logits)``.

    Args:
        logits: ``(..., vocab)`` any float dtype; only ``chunk_size`` rows are upcast to
            float32 at a time.
        labels: ``(...)`` integer token ids.
        chunk_size: rows (tokens) processed per chunk.

    Returns:
        ``(...)`` float32 log-probs. Differentiable w.r.t. ``logits``.
    """
    _check_chunk_size(chunk_size)
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"logits shape {tuple(logits.shape)} does not match labels shape "
            f"{tuple(labels.shape)}: expected logits (..., vocab) and labels (...)"
        )
    flat_logits = logits.reshape(-1, logits.shape[-1])
    flat_labels = labels.reshape(-1).long()
    return _ChunkedLogProb.apply(flat_logits, flat_labels, chunk_size).view(labels.shape)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits)`` along the last dim.

    Args:
        logits: ``(..., vocab)`` any float dtype; upcast to float32 one chunk at a time.
        chunk_size: rows (tokens) processed per chunk.

    Returns:
        ``(...)`` float32 entropies. Differentiable w.r.t. ``logits``.
    """
    _check_chunk_size(chunk_size)
    flat_logits = logits.reshape(-1, logits.shape[-1])
    return _ChunkedEntropy.apply(flat_logits, chunk_size).view(logits.shape[:-1])


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
    ``disposable``: backward may overwrite the logits (see :class:`_LogProbEntropy`): only
    when this call is checkpointed, so that backward reads a recomputed copy."""
    # The head's output may be bf16 under autocast; the chunk is small, so upcast it whole
    # before dividing by the temperature to keep the division in float32.
    out = lm_head(hidden)
    logits = out.float()
    if temperature != 1.0:
        # in place on the float32 copy of a bf16 head output (one temporary fewer)
        logits = logits.div_(temperature) if logits is not out else logits / temperature
    log_probs, entropy = _LogProbEntropy.apply(logits, labels, calculate_entropy, disposable)
    sum_pi_squared = None
    if calculate_sum_pi_squared:
        sum_pi_squared = torch.softmax(logits, dim=-1).square().sum(dim=-1).detach()
    return log_probs, entropy, sum_pi_squared


def shape_multiple(model: nn.Module) -> int:
    """Multiple to round the token dimension of ``model``'s passes up to: 1 (any shape)
    except on a CPU in bf16/fp16 (autocast on, or reduced-precision weights), where every
    new matmul shape costs memory that stays (``CPU_REDUCED_PRECISION_SHAPE_MULTIPLE``)."""
    param = next(model.parameters(), None)
    if param is None or param.device.type != "cpu":
        return 1
    reduced = (torch.bfloat16, torch.float16)
    autocast = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") in reduced
    return CPU_REDUCED_PRECISION_SHAPE_MULTIPLE if autocast or param.dtype in reduced else 1


def _has_plain_head(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    return (
        getattr(config, "model_type", None) in _PLAIN_HEAD_MODEL_TYPES
        and isinstance(getattr(model, "model", None), nn.Module)
        and isinstance(getattr(model, "lm_head", None), nn.Module)
    )


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

    Returns:
        ``(log_probs, entropy)``: float32 ``(batch, response_len)`` each; ``entropy`` is
        ``None`` unless ``calculate_entropy``. With ``calculate_sum_pi_squared``,
        ``(log_probs, entropy, sum_pi_squared)``. Padded response positions get finite
        values that the caller masks with ``response_mask``.
    """
    _check_chunk_size(chunk_size)
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
    if sp is not None:  # this rank computes 1/sp of the tokens (verl.kernels.ulysses)
        shard, labels, place = sequence_parallel_inputs(
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

    if pack and _has_plain_head(model):
        hidden, packed = packed_response_hidden(
            model.model, input_ids, attention_mask, response_len, share_prefix
        )
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

    if _has_plain_head(model):
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
        kwargs = {}
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


# attention implementations that take a custom 4D mask as is (transformers passes a 4D
# ``attention_mask`` through ``masking_utils`` untouched): sdpa wants a boolean mask (True =
# attend; autocast would cast a float one), eager adds it to the scores, so it wants 0 / -inf
_MASK_KINDS = {"sdpa": "bool", "eager": "additive"}
_fallback_logged: set[str] = set()
_NO_MASK_PLACEHOLDER = torch.zeros(1, 1, 1, 1, dtype=torch.bool)


def pack_batch(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    share_prefix: bool,
) -> PackedBatch:
    """``input_ids``/``attention_mask`` ``(rows, P + R)`` packed for ``model`` (a HF base or
    causal-LM model): shared-prompt packing (:func:`verl.kernels.prefix_packing.pack_shared_prefix`)
    when ``share_prefix`` is asked for, two rows share a prompt and the model's attention
    takes a custom 4D mask; else plain packing (:func:`verl.kernels.packing.pack_sequences`).
    Feed the model ``packed_attention_mask(model, packed.attention_mask)``. The width is
    rounded up to :func:`shape_multiple` of ``model``."""
    width_multiple = shape_multiple(model)
    groups = prompt_groups(input_ids, attention_mask, response_len) if share_prefix else []
    if not any(len(g) > 1 for g in groups):
        return pack_sequences(
            input_ids, attention_mask, response_len, width_multiple=width_multiple
        )
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in _MASK_KINDS:
        if impl not in _fallback_logged:
            _fallback_logged.add(impl)
            logger.warning(
                "share_prompt_prefix: attn_implementation=%r takes no custom 4D attention "
                "mask; packing without sharing prompts (each row computes its prompt)",
                impl,
            )
        return pack_sequences(
            input_ids, attention_mask, response_len, width_multiple=width_multiple
        )
    return pack_shared_prefix(
        input_ids, attention_mask, response_len, groups=groups, width_multiple=width_multiple
    )


def supports_packing(model: nn.Module) -> bool:
    """Whether ``model`` (a HF base or causal-LM model) derives a block-diagonal mask from
    restarting position ids (the model types of the plain-head path)."""
    return getattr(getattr(model, "config", None), "model_type", None) in _PLAIN_HEAD_MODEL_TYPES


def packed_response_hidden(
    base_model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    share_prefix: bool = False,
) -> tuple[torch.Tensor, PackedBatch]:
    """The base transformer's hidden states that predict the valid response tokens, computed
    on the batch packed (shared-prompt packed with ``share_prefix``).

    Args:
        base_model: the HF base model (``model.model`` of a causal LM or value model).
        input_ids / attention_mask: ``(rows, P + R)`` padded batch.
        response_len: ``R``.

    Returns:
        ``(hidden (n, H), packed)``: ``n`` = valid response tokens in row-major order, as
        ``packed.response_mask (rows, R)`` places them (``packed.labels`` are their ids).
    """
    packed = pack_batch(base_model, input_ids, attention_mask, response_len, share_prefix)
    with packed_forward(base_model, packed) as kwargs:
        out = base_model(input_ids=packed.input_ids, use_cache=False, **kwargs)
    flat = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])
    return flat[packed.response_index], packed


def sequence_parallel_inputs(
    model: nn.Module,
    sp,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
    pack: bool,
    share_prefix: bool,
):
    """A ``(rows, P + R)`` batch split along its tokens for this rank of ``sp``
    (:func:`verl.kernels.ulysses.shard_tokens`), packed (shared-prompt packed with
    ``share_prefix``) or padded, with the wanted positions those that predict the response
    tokens.

    Args:
        model: the causal LM or value model (its ``config`` and body ``model.model``).

    Returns:
        ``(shard, labels (n,), place)``: ``place(values (n,))`` puts per-wanted-position
        values into the ``(rows, R)`` layout (padded response positions 0 when packed).
    """
    from verl.kernels.ulysses import num_attention_layers, padded_blocks, shard_tokens

    if not supports_packing(model):
        raise NotImplementedError(
            f"sequence parallelism: model_type="
            f"{getattr(getattr(model, 'config', None), 'model_type', None)!r} has no plain "
            "head path; set ulysses_sequence_parallel_size=1"
        )
    layers = num_attention_layers(model)
    rows, seq_len = input_ids.shape
    if pack:
        packed = pack_batch(model.model, input_ids, attention_mask, response_len, share_prefix)
        shard = shard_tokens(
            sp, packed.input_ids, packed.position_ids, packed.blocks, packed.response_index, layers
        )
        mask = packed.response_mask

        def place(values: torch.Tensor) -> torch.Tensor:
            return values.new_zeros(mask.shape).masked_scatter(mask, values)

        return shard, packed.labels, place
    columns = torch.arange(seq_len - response_len - 1, seq_len - 1, device=input_ids.device)
    wanted = (torch.arange(rows, device=input_ids.device)[:, None] * seq_len + columns).reshape(-1)
    shard = shard_tokens(sp, input_ids, position_ids, padded_blocks(attention_mask), wanted, layers)
    labels = input_ids[:, -response_len:].reshape(-1)
    return shard, labels, lambda values: values.view(rows, response_len)


def block_attention_layers(model: nn.Module) -> int:
    """Attention layers of ``model`` (a HF base or causal-LM model) that would compute a
    packed batch block by block (:mod:`verl.kernels.block_attention`), or 0 when its attention
    cannot: not transformers' ``sdpa``, a model type outside the plain-head set, or a
    sliding window."""
    if not supports_packing(model):
        return 0
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return 0
    if getattr(config, "sliding_window", None) is not None and getattr(
        config, "use_sliding_window", True
    ):
        return 0
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return 0
    return int(config.num_hidden_layers)


@contextlib.contextmanager
def packed_forward(model: nn.Module, packed: PackedBatch):
    """The keyword arguments of a forward of ``model`` (a HF base model, or a module that
    passes them on to one) on ``packed``: ``position_ids`` and either a block-attention plan
    (each sequence attends its own keys only; used when the packer recorded its blocks, the
    model's attention is ``sdpa`` and the plan computes fewer query-key pairs than the bins'
    full masks) or the packed attention mask. On leaving, checks that every attention layer
    used the plan."""
    layers = block_attention_layers(model) if packed.blocks is not None else 0
    bins, width = packed.input_ids.shape
    plan = None
    if layers:
        plan = block_attention.plan_block_attention(
            packed.blocks, bins * width, packed.input_ids.device
        )
        if plan.pairs >= bins * width * width:
            plan = None
    if plan is None:
        # attention_mask None: block-diagonal causal mask from the restarting positions
        yield {
            "attention_mask": packed_attention_mask(model, packed.attention_mask),
            "position_ids": packed.position_ids,
        }
        return
    block_attention.install()
    yield {
        # transformers passes a 4D mask through untouched; all-False so that a layer which
        # ignored the plan would attend nowhere (NaN) rather than across sequences
        "attention_mask": _NO_MASK_PLACEHOLDER,
        "position_ids": packed.position_ids,
        block_attention.PLAN_KWARG: plan,
    }
    plan.check_used(layers)


def packed_attention_mask(model: nn.Module, allowed: torch.Tensor | None) -> torch.Tensor | None:
    """``allowed (bins, q, k)`` (a packed batch's boolean mask, or None) as the 4D
    ``attention_mask`` the model's attention implementation takes (None stays None)."""
    if allowed is None:
        return None
    allowed = allowed[:, None]
    if _MASK_KINDS[model.config._attn_implementation] == "bool":
        return allowed
    dtype = next(model.parameters()).dtype
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min
    )


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
    multiple = shape_multiple(head)
    log_prob_chunks, entropy_chunks, sps_chunks = [], [], []
    # no valid token (a packed micro-batch of empty responses): one empty chunk keeps the
    # outputs in the autograd graph
    for s, e in list(_row_chunks(hidden.shape[0], chunk_size)) or [(0, 0)]:
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
