"""GKD-style mixing of on-policy and fixed responses for distillation
(``algorithm.distill.fixed_fraction``, docs/distillation.md).

With ``fixed_fraction = f > 0`` each training step is, with probability ``f``, a *fixed*
step: its prompt batch is not generated from; every prompt's response is the one its data
row holds (``algorithm.distill.response_key`` / ``response_dict_keys``, the SFT data's
convention), tokenized and laid out as a rollout would be (:func:`fixed_response_batch`).
Otherwise the step is the usual on-policy one. The loss is the distillation loss either way.

The choice is made **per step** (the whole batch is fixed or on-policy) and is a function of
``trainer.seed`` and the step alone (:func:`is_fixed_step`): a resumed run, which restores
the step counter, makes the same choices as the uninterrupted run, and a fixed step spends
no generation at all.

What travels with a prompt row is its ``reward_model.ground_truth`` (the batch's
``ground_truth``) and its ``extra_info``, so the fixed response is read from one of them:
``response_key=reward_model`` with ``response_dict_keys=[ground_truth]`` (the default: the
built-in arithmetic data's answer) or ``response_key=extra_info`` with the keys into it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.rollout.base import SamplingParams, assemble_rollout_output

logger = logging.getLogger(__name__)

__all__ = [
    "FIXED_METRIC",
    "RESPONSE_COLUMNS",
    "MixedDistillSource",
    "distill_kind_metrics",
    "fixed_response_batch",
    "fixed_response_texts",
    "is_fixed_step",
    "mixed_distill_source",
]

# The prompt row's columns that reach the trainer, and the batch key each arrives under:
# reward_model arrives as its ground_truth alone, extra_info whole.
RESPONSE_COLUMNS = {"reward_model": "ground_truth", "extra_info": "extra_info"}
FIXED_METRIC = "distill/fixed_fraction"  # the step's share of fixed rows (0 or 1)
_STREAM = 0x474B44  # "GKD": keeps this stream apart from other uses of the seed


def _objects(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def is_fixed_step(seed: int, step: int, fraction: float) -> bool:
    """Whether step ``step`` trains on the fixed responses: a draw from a generator seeded
    by ``(seed, step)`` alone, below ``fraction`` (0: never, 1: always)."""
    if fraction <= 0:
        return False
    if fraction >= 1:
        return True
    draw = np.random.default_rng([_STREAM, int(seed) & 0xFFFFFFFF, int(step)]).random()
    return bool(draw < fraction)


def fixed_response_texts(
    prompts: DataProto, response_key: str, response_dict_keys: Sequence[str]
) -> list[str]:
    """Each prompt row's fixed response text (module docstring for where it is read).

    Raises ``ValueError`` naming the key path and the row's data ``index`` when a row has
    no such value, and for a ``response_key`` whose column does not reach the trainer.
    """
    if response_key not in RESPONSE_COLUMNS:
        raise ValueError(
            f"algorithm.distill.response_key={response_key!r}: the prompt rows bring "
            f"{sorted(RESPONSE_COLUMNS)} to the trainer; put the fixed response in "
            "extra_info (e.g. extra_info.response) and set response_key=extra_info, "
            "response_dict_keys=[response]"
        )
    keys = list(response_dict_keys)
    column = RESPONSE_COLUMNS[response_key]
    if response_key == "reward_model":
        if keys[:1] != ["ground_truth"]:
            raise ValueError(
                f"algorithm.distill.response_key=reward_model with response_dict_keys={keys}: "
                "only reward_model.ground_truth reaches the trainer; use "
                "response_dict_keys=[ground_truth]"
            )
        keys = keys[1:]
    values = prompts.non_tensor_batch.get(column)
    if values is None:
        raise ValueError(f"the prompt batch has no {column!r}: no fixed responses to read")
    indices = prompts.non_tensor_batch.get("index", np.arange(len(prompts)))
    path = ".".join([response_key, *list(response_dict_keys)])
    texts = []
    for value, index in zip(values, indices):
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if value is None or (isinstance(value, str) and not value):
            raise ValueError(
                f"data row {index} has no fixed response at {path} "
                "(algorithm.distill.response_key / response_dict_keys); every training row "
                "needs one with algorithm.distill.fixed_fraction > 0"
            )
        texts.append(value if isinstance(value, str) else str(value))
    return texts


def fixed_response_batch(
    prompts: DataProto,
    texts: Sequence[str],
    tokenizer: Any,
    *,
    n: int,
    max_response_length: int,
    temperature: float,
) -> DataProto:
    """The rollout layout (:mod:`verl.rollout.base`) of ``prompts`` answered by ``texts``.

    Each text is encoded without special tokens and ends with the tokenizer's eos (as a
    sampled response ends), cut to ``max_response_length`` tokens; each prompt's response is
    repeated ``n`` times (``repeat_interleave`` order, the rollout's), so the batch has the
    rows the update's mini-batches expect. ``response_mask`` covers exactly those tokens;
    ``responses`` is padded with ``pad_token_id`` after them. There are no
    ``rollout_log_probs``: the fixed responses have no behaviour policy.
    ``meta_info["temperature"]`` is ``temperature`` (the student's log-probs and the
    teacher's scores use it).

    Returns ``(len(prompts) * n)`` rows with ``prompts``, ``responses``, ``response_mask``,
    ``input_ids``, ``attention_mask``, ``position_ids`` and the prompts' other fields.
    """
    if len(texts) != len(prompts):
        raise ValueError(f"{len(texts)} fixed responses for {len(prompts)} prompts")
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    rows = len(prompts) * n
    responses = torch.full((rows, max_response_length), pad, dtype=torch.long)
    mask = torch.zeros((rows, max_response_length), dtype=torch.long)
    cut = 0
    for i, ids in enumerate(encoded):
        ids = list(ids) + ([eos] if eos is not None else [])
        if len(ids) > max_response_length:
            ids, cut = ids[:max_response_length], cut + 1
        for j in range(i * n, (i + 1) * n):
            responses[j, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[j, : len(ids)] = 1
    if cut:
        logger.warning(
            "%d of %d fixed responses are longer than data.max_response_length=%d tokens "
            "(eos included) and were cut",
            cut,
            len(prompts),
            max_response_length,
        )
    params = SamplingParams(n=n, temperature=temperature, max_new_tokens=max_response_length)
    gen = assemble_rollout_output(
        prompts, params, responses, mask, torch.zeros(rows, max_response_length)
    )
    gen.batch.pop("rollout_log_probs")
    gen.meta_info["temperature"] = params.logprob_temperature
    return gen


Scored = tuple[DataProto, dict[str, Any]]


class MixedDistillSource:
    """A batch source (:mod:`verl.trainer.rl.batch_source`) that answers the steps
    :func:`is_fixed_step` picks with the data's fixed responses, and the others with
    ``base`` (the student's samples).

    Args:
        base: the on-policy source.
        score: ``(gen, metrics, prompts) -> (gen, metrics)``, the trainer's scoring (the
            fixed responses are scored and logged like samples).
        step: the step being taken (``global_step``, restored on resume).
        make_fixed: ``prompts -> gen``, :func:`fixed_response_batch` with the run's settings.
        seed / fraction: ``trainer.seed``, ``algorithm.distill.fixed_fraction``.
    """

    def __init__(
        self,
        base: Any,
        *,
        score: Callable[..., Scored],
        step: Callable[[], int],
        make_fixed: Callable[[DataProto], DataProto],
        seed: int,
        fraction: float,
    ) -> None:
        self.base, self.score, self.step, self.make_fixed = base, score, step, make_fixed
        self.seed, self.fraction = seed, fraction

    def next(self, draw: Callable[[], DataProto]) -> Scored:
        if not is_fixed_step(self.seed, self.step(), self.fraction):
            gen, metrics = self.base.next(draw)
            metrics[FIXED_METRIC] = 0.0
            return gen, metrics
        prompts = draw()
        prompts.non_tensor_batch["uid"] = np.array(
            [str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object
        )
        gen = self.make_fixed(prompts)
        gen, metrics = self.score(gen, {}, prompts)
        metrics[FIXED_METRIC] = 1.0
        return gen, metrics


def mixed_distill_source(cfg: Any, base: Any, tokenizer: Any, trainer: Any) -> Any:
    """``base`` unchanged unless ``algorithm.distill.fixed_fraction > 0`` (with distillation
    on); then a :class:`MixedDistillSource` over it with the run's settings, scoring with
    ``trainer.score_responses`` at ``trainer.global_step`` (both read when a step runs)."""
    d = cfg.algorithm.distill
    if not d.enable or d.fixed_fraction <= 0:
        return base
    rollout = cfg.actor_rollout_ref.rollout
    n = rollout.n
    temperature = float(rollout.temperature) if rollout.temperature > 0 else 1.0
    max_len = cfg.data.max_response_length
    dataset = getattr(trainer, "train_dataset", None)
    if dataset is not None and len(dataset):  # a missing response fails now, not at a step
        item = dataset[0]
        first = {
            k: _objects([item[k]]) for k in ("ground_truth", "extra_info", "index") if k in item
        }
        fixed_response_texts(
            DataProto.from_dict(non_tensors=first), d.response_key, d.response_dict_keys
        )

    def make_fixed(prompts: DataProto) -> DataProto:
        texts = fixed_response_texts(prompts, d.response_key, d.response_dict_keys)
        return fixed_response_batch(
            prompts, texts, tokenizer, n=n, max_response_length=max_len, temperature=temperature
        )

    return MixedDistillSource(
        base,
        score=lambda gen, metrics, prompts: trainer.score_responses(gen, metrics, prompts),
        step=lambda: trainer.global_step,
        make_fixed=make_fixed,
        seed=cfg.trainer.seed,
        fraction=d.fixed_fraction,
    )


def distill_kind_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The step's distillation loss again under the kind of its rows:
    ``distill/loss_fixed`` or ``distill/loss_on_policy`` (empty without mixing)."""
    if FIXED_METRIC not in metrics or "actor/distill_loss" not in metrics:
        return {}
    kind = "fixed" if metrics[FIXED_METRIC] >= 0.5 else "on_policy"
    return {f"distill/loss_{kind}": metrics["actor/distill_loss"]}
