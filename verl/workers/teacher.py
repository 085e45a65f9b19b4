"""The distillation teacher (``algorithm.distill``): a frozen causal LM in the actor worker.

Like the reference policy, the teacher is an inference-only module in an engine without an
optimizer, colocated with the actor (its own weights, loaded from
``algorithm.distill.teacher_path``; weight-only fp8 / int4 or bf16 / fp16 with
``teacher_precision``). It scores the student's samples: the log-probs of the sampled
tokens (``k1``/``k3``) or, for ``topk``, its log-probs at the student's top-k token ids of
every position. Its parameters have ``requires_grad=False`` and it is only ever run under
``torch.no_grad``: no gradient reaches it.

The student and the teacher must tokenize alike (the KL compares distributions over the
same ids): :func:`check_same_tokenizer` compares the vocabularies and a probe encoding.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

__all__ = ["TOKENIZER_PROBE", "check_same_tokenizer", "response_log_softmax"]

# Digits, operators, whitespace runs, accents and a chat-template-like marker.
TOKENIZER_PROBE = "Compute 12 + 7 * 3 = ?  Answer:\n\t33. Ça va: <|im_start|>user ünïcödé"


def check_same_tokenizer(student: Any, teacher: Any, student_path: str, teacher_path: str) -> None:
    """Raise ``ValueError`` unless ``teacher`` maps text to the ids ``student`` does.

    Compares the token -> id vocabularies (added tokens included) and the encoding of
    :data:`TOKENIZER_PROBE`; the message names both paths and the first difference.
    """
    s_vocab, t_vocab = student.get_vocab(), teacher.get_vocab()
    if s_vocab != t_vocab:
        only_s = sorted(set(s_vocab) - set(t_vocab))[:3]
        only_t = sorted(set(t_vocab) - set(s_vocab))[:3]
        moved = sorted(k for k in set(s_vocab) & set(t_vocab) if s_vocab[k] != t_vocab[k])[:3]
        raise ValueError(
            f"the teacher's tokenizer ({teacher_path}, {len(t_vocab)} tokens) differs from the "
            f"student's ({student_path}, {len(s_vocab)} tokens): only the student's "
            f"{only_s}, only the teacher's {only_t}, different ids {moved}. On-policy "
            "distillation compares next-token distributions over the same ids; use a teacher "
            "of the student's model family (algorithm.distill.teacher_path)"
        )
    s_ids = student(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"]
    t_ids = teacher(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"]
    if s_ids != t_ids:
        raise ValueError(
            f"the teacher's tokenizer ({teacher_path}) encodes {TOKENIZER_PROBE!r} as {t_ids}, "
            f"the student's ({student_path}) as {s_ids}: same vocabulary, different "
            "pre-tokenization or normalisation; use a teacher with the student's tokenizer"
        )


def response_log_softmax(
    module: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Full-vocabulary log-softmax of ``logits / temperature`` at the positions that predict
    the response tokens (the last ``response_len`` columns), float32.

    Runs under the caller's grad mode (differentiable in the actor's update). One
    micro-batch's ``(batch, response_len, vocab)`` float32 tensor is held: callers bound
    it by the micro-batch size.

    Args:
        module: a HF causal LM (a peft model too).
        input_ids / attention_mask / position_ids: ``(batch, seq_len)``.
        response_len: response columns at the end of the sequence, ``< seq_len``.
        temperature: the sampling temperature the student's log-probs use.

    Returns:
        ``(batch, response_len, vocab)``.
    """
    kwargs = {}
    forward = getattr(module, "forward", None)
    try:
        if "logits_to_keep" in inspect.signature(forward).parameters:
            kwargs["logits_to_keep"] = response_len + 1
    except (TypeError, ValueError):
        pass
    logits = module(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        **kwargs,
    ).logits[:, -response_len - 1 : -1]
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)
