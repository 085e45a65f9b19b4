"""The no-gradient scoring passes of the hybrid actor worker: log-probs of the sampled
tokens under a policy (the actor's old policy, the reference, the teacher), and the
teacher's top-k scores for distillation: in one pass over both models when the teacher is
colocated (:func:`teacher_topk_scores`), or split when it has a worker group of its own (the
actor's :func:`student_topk_ids`, then the teacher's :func:`teacher_scores_at` of them).

Contract: the passes read ``input_ids``, ``attention_mask``, ``position_ids`` and
``response_mask`` (``(batch, seq_len)``, responses the last ``response_len`` columns) and
the log-prob ``temperature`` of ``meta_info``, cut the batch with the actor's micro-batch
split (:class:`~verl.workers.specs.BatchingSpec`; the pass's own row count when set) and
return float32 host tensors ``(batch, response_len)`` in the batch's row order. They run
under the *actor* engine's autocast, whichever module they score, so every policy is
scored in the precision the actor trains in. The caller holds the module's engine in
``eval_mode`` (and joins a sequence group's rows first, ``sequence_group_batch``). An image
batch (a vision-language model) also forwards each micro-batch's images and multimodal
rope index (:mod:`verl.workers.vision_inputs`; padded micro-batches only).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from verl.kernels.torch_functional import compute_response_log_probs
from verl.kernels.ulysses import sequence_parallel_of
from verl.protocol import DataProto
from verl.utils.memory import release_memory
from verl.workers.common import micro_batches, to_device
from verl.workers.micro_batching import gather_response_outputs
from verl.workers.specs import ActorSpec
from verl.workers.teacher import response_log_softmax
from verl.workers.vision_inputs import check_image_batching, forward_inputs, image_keys

__all__ = [
    "PROMPT_KEYS",
    "TEACHER_KEYS",
    "response_log_probs",
    "student_topk_ids",
    "teacher_scores_at",
    "teacher_topk_scores",
]

PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")
# What the teacher pass returns and the update reads (algorithm.distill).
TEACHER_KEYS = ("teacher_log_probs", "teacher_topk_log_probs", "distill_topk_ids")


def response_log_probs(
    engine: Any,
    module: torch.nn.Module,
    data: DataProto,
    micro_batch_size: int | None,
    actor: ActorSpec | Any,
    device: torch.device,
    with_entropy: bool,
    with_sum_pi_squared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Log-probs of the sampled tokens under ``module``, and the entropy and
    ``sum_v pi(v)^2`` per token when asked (else ``None``).

    ``engine``: the actor's engine (its autocast); ``micro_batch_size``: the pass's rows
    per micro-batch (``None``: as the actor's update). ``actor``: what splits and chunks
    the pass (``batching``, ``logprob_chunk_size``): the actor's spec, or the teacher pool's
    (:class:`~verl.workers.specs.TeacherPoolSpec`, which carries the actor's).
    """
    temperature = data.meta_info.get("temperature", 1.0)
    response_len = data.batch["response_mask"].shape[1]
    batching = actor.batching
    log_probs, entropies, sum_pi_squared = [], [], []
    inputs = to_device(data.select(batch_keys=[*PROMPT_KEYS, *image_keys(data)]), device)
    with torch.no_grad(), engine.autocast():
        sp = sequence_parallel_of(module)
        sp_size = 1 if sp is None else sp.size
        check_image_batching(inputs, batching, sp_size)
        for mb in micro_batches(inputs, response_len, micro_batch_size, batching, sp_size):
            x = mb.data.batch
            position_ids, model_inputs = forward_inputs(mb.data, device)
            lp, ent, *sps = compute_response_log_probs(
                module,
                x["input_ids"],
                x["attention_mask"],
                position_ids,
                response_len=mb.response_len,
                temperature=temperature,
                chunk_size=actor.logprob_chunk_size,
                calculate_entropy=with_entropy,
                calculate_sum_pi_squared=with_sum_pi_squared,
                pack=batching.pack_sequences,
                share_prefix=batching.share_prompt_prefix,
                model_inputs=model_inputs,
            )
            log_probs.append((mb, lp.float().cpu()))
            if ent is not None:
                entropies.append((mb, ent.float().cpu()))
            if sps:
                sum_pi_squared.append((mb, sps[0].float().cpu()))
    rows = len(data)
    release_memory()  # the forwards' activations, before the next phase
    return (
        gather_response_outputs(log_probs, rows, response_len),
        gather_response_outputs(entropies, rows, response_len) if entropies else None,
        gather_response_outputs(sum_pi_squared, rows, response_len) if sum_pi_squared else None,
    )


def _vocab_passes(
    data: DataProto, micro_batch_size: int | None, batching: Any, device: torch.device
) -> Iterator[tuple[Any, tuple, torch.Tensor]]:
    """The micro-batches of a full-vocabulary distillation pass: each micro-batch, the
    arguments of :func:`~verl.workers.teacher.response_log_softmax` after the module, and
    the sampled ids ``(rows, response_len, 1)``."""
    temperature = data.meta_info.get("temperature", 1.0)
    response_len = data.batch["response_mask"].shape[1]
    inputs = to_device(data.select(batch_keys=list(PROMPT_KEYS)), device)
    for mb in micro_batches(inputs, response_len, micro_batch_size, batching, 1):
        x = mb.data.batch
        args = (x["input_ids"], x["attention_mask"], x["position_ids"], mb.response_len)
        yield mb, (*args, temperature), x["input_ids"][:, -mb.response_len :, None]


def _gathered(parts: dict[str, list], data: DataProto) -> dict[str, torch.Tensor]:
    """Each key's micro-batch outputs back in the batch's row order, ``(batch,
    response_len, ...)``, after releasing the passes' memory."""
    release_memory()
    n, response_len = len(data), data.batch["response_mask"].shape[1]
    return {key: gather_response_outputs(values, n, response_len) for key, values in parts.items()}


def teacher_topk_scores(
    engine: Any,
    teacher_engine: Any,
    data: DataProto,
    micro_batch_size: int | None,
    topk: int,
    actor: ActorSpec,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """The teacher's scores for a top-k distillation estimator, by :data:`TEACHER_KEYS`:
    its log-probs of the sampled tokens ``(batch, response_len)``, the student's ``k`` most
    likely ids at each position ``(batch, response_len, k)`` and the teacher's log-probs at
    them. Full-vocabulary log-probs are held one micro-batch at a time."""
    parts: dict[str, list] = {key: [] for key in TEACHER_KEYS}
    with (
        torch.no_grad(),
        engine.eval_mode(),
        teacher_engine.eval_mode(),
        engine.autocast(),
    ):
        for mb, args, labels in _vocab_passes(data, micro_batch_size, actor.batching, device):
            student = response_log_softmax(engine.module, *args)
            teacher = response_log_softmax(teacher_engine.module, *args)
            vocab = min(student.shape[-1], teacher.shape[-1])  # heads may be padded apart
            k = min(topk, vocab)
            ids = student[..., :vocab].topk(k, dim=-1).indices
            del student
            parts["teacher_log_probs"].append((mb, teacher.gather(-1, labels)[..., 0].cpu()))
            parts["teacher_topk_log_probs"].append((mb, teacher.gather(-1, ids).cpu()))
            parts["distill_topk_ids"].append((mb, ids.cpu()))
            del teacher
    return _gathered(parts, data)


def student_topk_ids(
    engine: Any,
    data: DataProto,
    micro_batch_size: int | None,
    topk: int,
    vocab: int | None,
    actor: ActorSpec,
    device: torch.device,
) -> torch.Tensor:
    """The student's ``k`` most likely ids at each response position, ``(batch,
    response_len, k)`` int64, among its first ``vocab`` logits (the teacher's head size:
    heads may be padded apart; ``None``: all of them). The micro-batches, autocast and
    temperature are :func:`teacher_topk_scores`'s, so the ids are the ones it picks."""
    parts: dict[str, list] = {"distill_topk_ids": []}
    with torch.no_grad(), engine.eval_mode(), engine.autocast():
        for mb, args, _ in _vocab_passes(data, micro_batch_size, actor.batching, device):
            student = response_log_softmax(engine.module, *args)
            width = student.shape[-1] if vocab is None else min(vocab, student.shape[-1])
            ids = student[..., :width].topk(min(topk, width), dim=-1).indices
            del student
            parts["distill_topk_ids"].append((mb, ids.cpu()))
    return _gathered(parts, data)["distill_topk_ids"]


def teacher_scores_at(
    teacher_engine: Any,
    data: DataProto,
    ids: torch.Tensor,
    micro_batch_size: int | None,
    spec: Any,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """The teacher's log-probs of the sampled tokens ``(batch, response_len)`` and at the
    student's ``ids`` ``(batch, response_len, k)`` (from :func:`student_topk_ids`), keyed
    as :data:`TEACHER_KEYS` (the ids themselves are the caller's). ``spec``: the teacher
    pool's (the actor's micro-batch split); the teacher engine's autocast is the actor's.
    Full-vocabulary log-probs are held one micro-batch at a time."""
    parts: dict[str, list] = {key: [] for key in TEACHER_KEYS[:2]}
    with torch.no_grad(), teacher_engine.eval_mode(), teacher_engine.autocast():
        for mb, args, labels in _vocab_passes(data, micro_batch_size, spec.batching, device):
            teacher = response_log_softmax(teacher_engine.module, *args)
            at = ids[mb.index, : mb.response_len].to(teacher.device)
            parts["teacher_log_probs"].append((mb, teacher.gather(-1, labels)[..., 0].cpu()))
            parts["teacher_topk_log_probs"].append((mb, teacher.gather(-1, at).cpu()))
            del teacher
    return _gathered(parts, data)
