"""Pieces shared by the trainable workers: the PPO update loop (epochs, mini-batches,
micro-batches through the engine's one ``forward_backward``), micro-batch loss weights
(exact across data-parallel ranks), metric accumulation and atomic HuggingFace export.

Data parallelism: a role with several ranks lives in processes that share one
``torch.distributed`` default group (the Ray backend sets it up before the worker is
built). FSDP2 averages gradients over that group, so loss weights computed here are
scaled by the group size: the averaged gradient is then the gradient of the loss
aggregated over the *global* mini-batch, whatever the ranks' token counts.

Sequence parallelism (``ulysses_sequence_parallel_size``, ``verl.kernels.ulysses``): the
ranks of one sequence group compute on the same rows. A worker joins its group's
dispatched chunks with :func:`sequence_group_batch` and returns its own rows'
outputs; the weights above then count every group's rows once per rank of the group, and
the engine's gradient gather makes that exact (see ``verl.kernels.ulysses``).

Tensor parallelism (``tensor_parallel_size``, ``verl.engine.tensor_parallel``): the ranks of
one tensor group also join their chunks (:func:`sequence_group_batch`) and compute the same
rows; FSDP2 averages over the ``world / t`` data-parallel groups only, and the weights
above, counting every group's rows ``t`` times and scaled by ``world``, are then exact.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from verl.algorithms.rollout_correction import rollout_mismatch_metrics
from verl.kernels.prefix_packing import prompt_groups
from verl.models.vision_processor import save_processor_files
from verl.protocol import DataProto
from verl.registry import LOSS_AGG_MODES
from verl.utils.atomic_io import replace_dir_atomically
from verl.utils.distributed import (
    destroy_distributed,
    find_free_port,
    init_distributed,
    is_distributed,
)
from verl.workers.micro_batching import MicroBatch, split_micro_batches

logger = logging.getLogger(__name__)


def iter_ppo_mini_batches(
    data: DataProto,
    mini_batch_size: int,
    epochs: int,
    shuffle: bool,
    seed: int,
    by_group: bool = False,
) -> Iterator[DataProto]:
    """Yield ``epochs`` passes of mini-batches of ``mini_batch_size`` samples.

    With ``shuffle`` the samples are permuted once per epoch by a generator seeded with
    ``seed + epoch`` (reproducible, independent of the global RNG). A trailing partial
    mini-batch is kept (never dropped), so every sample contributes to every epoch.
    ``by_group`` (shared-prompt packing): the prompt groups (rows with identical real
    prompt ids, ``verl.kernels.prefix_packing.prompt_groups``) are shuffled instead of the
    rows, so a group's rows stay adjacent and share micro-batches.
    """
    if mini_batch_size <= 0:
        raise ValueError(f"mini_batch_size must be positive, got {mini_batch_size}")
    groups = None
    if shuffle and by_group:
        groups = prompt_groups(
            data.batch["input_ids"],
            data.batch["attention_mask"],
            data.batch["response_mask"].shape[1],
        )
    for epoch in range(epochs):
        epoch_data = data
        if shuffle:
            gen = torch.Generator().manual_seed(seed * 1_000 + epoch)
            if groups is None:
                order = torch.randperm(len(data), generator=gen)
            else:
                order = torch.tensor(
                    [i for g in torch.randperm(len(groups), generator=gen) for i in groups[g]]
                )
            epoch_data = data[order]
        yield from epoch_data.split(mini_batch_size)


def shares_prompt_prefix(batching: Any) -> bool:
    """Whether a role packs sequences with shared prompts (``pack_sequences`` and
    ``share_prompt_prefix``; roles without those keys do not)."""
    return bool(
        getattr(batching, "pack_sequences", False)
        and getattr(batching, "share_prompt_prefix", False)
    )


def micro_batch_weights(micro_batches: Sequence[DataProto], loss_agg_mode: str) -> list[float]:
    """Weights that make the sum of weighted micro-batch losses equal the mini-batch loss.

    For ``token-mean`` a micro-batch's loss is a mean over its valid tokens, so it is
    weighted by its share of the mini-batch's valid tokens; for the sequence-mean modes, by
    its share of the non-empty sequences (empty ones are left out of the mean);
    ``seq-mean-token-sum-norm`` divides by a constant and the batch size, so it is weighted
    by its share of all sequences. Which count applies is the mode's registry entry's
    ``micro_batch_weight`` (``tokens``, ``sequences`` or ``rows``).
    """
    counted_in = LOSS_AGG_MODES.info(loss_agg_mode)["micro_batch_weight"]
    if counted_in == "tokens":
        per_mb = [mb.batch["response_mask"].sum() for mb in micro_batches]
    elif counted_in == "sequences":
        # these modes average over sequences with at least one valid token
        per_mb = [(mb.batch["response_mask"].sum(-1) > 0).sum() for mb in micro_batches]
    else:  # "rows"
        per_mb = None
    if per_mb is None:
        counts = [float(len(mb)) for mb in micro_batches]
    else:  # one host read for all micro-batches
        counts = torch.stack([c.double().cpu() for c in per_mb]).tolist()
    total, ranks = dp_sum(sum(counts)), dp_world_size()
    if total == 0:
        return [0.0 for _ in counts]
    return [c * ranks / total for c in counts]


def run_ppo_update(
    engine: Any,
    data: DataProto,
    loss_fn: Callable[[torch.nn.Module, MicroBatch], tuple[torch.Tensor, dict[str, Any]]],
    *,
    batching: Any,
    mini_batch_size: int,
    seed: int,
    device: torch.device,
    prefix: str,
) -> MetricsAccumulator:
    """PPO epochs over mini-batches (one optimizer step each) of ``data`` for one role.

    Each mini-batch is cut into micro-batches on the host (:func:`micro_batches`: by
    ``batching.ppo_micro_batch_size_per_device`` rows when set, else by the role's token
    budget), weighted by :func:`micro_batch_weights` for ``batching.loss_agg_mode``, moved
    to ``device`` and run through ``engine.forward_backward(micro_batches, loss_fn,
    weights)``: gradient sync is deferred to the last micro-batch and the micro-batch
    metrics come back in one host read. Then ``engine.optimizer_step()`` (clipping, the
    non-finite guard, fp16 loss scaling).

    Args:
        engine: the role's ``TrainEngine``.
        data: the update batch on the host; its ``response_mask`` gives the response width.
        loss_fn: ``loss_fn(module, micro_batch) -> (loss, metrics)`` for one
            :class:`~verl.workers.micro_batching.MicroBatch` (already on ``device``).
        batching: the role's :class:`~verl.workers.specs.BatchingSpec` (``ppo_epochs``,
            ``shuffle``, ``loss_agg_mode`` and the micro-batch split).
        mini_batch_size: samples per mini-batch on this rank.
        seed: seeds the per-epoch shuffle.
        prefix: metric name prefix (``"actor"``, ``"critic"``).

    Returns:
        The accumulator holding ``{prefix}/{metric}`` per micro-batch (``loss_fn``'s, its
        default ``loss`` left out) and ``grad_norm``, ``lr``, ``skipped_steps``
        (``loss_scale`` with fp16) per optimizer step. Call ``result()`` on every rank.
    """
    response_len = data.batch["response_mask"].shape[1]
    acc = MetricsAccumulator()
    with engine.train_mode():
        for mini in iter_ppo_mini_batches(
            data,
            mini_batch_size=mini_batch_size,
            epochs=batching.ppo_epochs,
            shuffle=batching.shuffle,
            seed=seed,
            by_group=shares_prompt_prefix(batching),
        ):
            engine.zero_grad()
            micro = micro_batches(
                mini, response_len, None, batching, sequence_parallel_size(engine)
            )
            weights = micro_batch_weights([mb.data for mb in micro], batching.loss_agg_mode)
            on_device = [dataclasses.replace(mb, data=to_device(mb.data, device)) for mb in micro]
            for metrics in engine.forward_backward(on_device, loss_fn, weights):
                for key, value in metrics.items():
                    if key != "loss":
                        acc.add(f"{prefix}/{key}", value)
            step = engine.optimizer_step()
            acc.add(f"{prefix}/grad_norm", step["grad_norm"])
            acc.add(f"{prefix}/lr", step["lr"])
            acc.add(f"{prefix}/skipped_steps", step.get("skipped", 0.0), reduce="sum")
            acc.add(f"{prefix}/nonfinite_loss_steps", step.get("nonfinite_loss", 0.0), reduce="sum")
            if "loss_scale" in step:
                acc.add(f"{prefix}/loss_scale", step["loss_scale"])
    return acc


def dp_world_size() -> int:
    """Ranks of this process's data-parallel group (1 without ``torch.distributed``)."""
    return dist.get_world_size() if is_distributed() else 1


def dp_sum(value: float) -> float:
    """``value`` summed over the data-parallel group (itself without one)."""
    if dp_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item())


def dp_max(value: int) -> int:
    """``value``'s maximum over the data-parallel group (itself without one)."""
    if dp_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def sequence_parallel_size(engine: Any) -> int:
    """Ranks of ``engine``'s sequence groups (1 without sequence parallelism)."""
    sp = getattr(engine, "sequence_parallel", None)
    return 1 if sp is None else sp.size


def micro_batches(
    data: DataProto,
    response_len: int,
    micro_batch_size: int | None,
    batching: Any = None,
    sequence_parallel_size: int = 1,
) -> list[MicroBatch]:
    """The micro-batches of one forward/backward pass of a role.

    ``batching``: how the role splits its passes: its :class:`~verl.workers.specs.BatchingSpec`
    (or its config section, which has the same attributes). ``micro_batch_size``: the
    pass's own row count (``None``: the role's update's). Row
    counts apply unless ``batching.use_dynamic_bsz`` is true; without any row count the
    pass is packed by the role's token budget (``batching.token_budget`` tokens, the same
    count of micro-batches on every data-parallel rank; real tokens when the role packs
    sequences, ``pack_sequences``, else rows x padded length): see
    ``verl.config.schema_roles.MicroBatchSplit``. Either way each micro-batch is cut to the
    columns it uses (see ``verl/workers/micro_batching.py``).

    ``sequence_parallel_size``: the role's sequence groups split each micro-batch's tokens
    over that many ranks, so a token budget (per device) admits that many times as many
    tokens per micro-batch (as upstream's ``ppo_max_token_len_per_gpu``); row counts are
    per micro-batch, as they are.
    """
    rows = micro_batch_size
    if batching is not None:
        rows = batching.rows_per_micro_batch(micro_batch_size)
        share = shares_prompt_prefix(batching)
        if rows is None or share:
            # whole prompt groups per micro-batch when they share their prompt; the count
            # may then differ between ranks, so it is agreed on in both modes
            return split_micro_batches(
                data,
                response_len,
                micro_batch_size=rows,
                max_token_len=(
                    batching.token_budget * sequence_parallel_size if rows is None else None
                ),
                agree=dp_max,
                packed=getattr(batching, "pack_sequences", False),
                share_prefix=share,
            )
    if rows is None:
        raise ValueError("micro_batches: give micro_batch_size or a batching with a token budget")
    return split_micro_batches(data, response_len, micro_batch_size=rows)


def row_sharing_group(engine: Any) -> Any:
    """The group of ranks of ``engine`` that compute on the same rows: its sequence group
    (``engine.sequence_parallel``) or its tensor group (``engine.tensor_parallel``), each
    with ``group`` / ``size`` / ``rank``; ``None`` when every rank has rows of its own."""
    for attr in ("sequence_parallel", "tensor_parallel"):
        group = getattr(engine, attr, None)
        if group is not None and group.size > 1:
            return group
    return None


def sequence_group_batch(engine: Any, data: DataProto) -> tuple[DataProto, slice]:
    """The rows ``engine`` computes on, and where this rank's own rows are among them.

    Without sequence or tensor parallelism: ``data`` itself. With either, the chunks the
    worker group dispatched to the ranks of this rank's sequence / tensor group
    (:func:`row_sharing_group`), joined in group-rank order (every rank of the group then
    holds the same rows), and the slice of them that is ``data``: a method returns
    ``out[rows]`` of a per-row output (each rank its own rows of the group's one result).
    Collective over the group.
    """
    group = row_sharing_group(engine)
    if group is None:
        return data, slice(0, len(data))
    return join_in_group(data, group)


def join_in_group(data: DataProto, group: Any) -> tuple[DataProto, slice]:
    """The ``data`` of every rank of ``group`` (``group`` / ``rank``, as
    :func:`row_sharing_group` gives) joined in group-rank order, and where this rank's rows
    are among them. Collective over the group."""
    from verl.kernels.ulysses import gather_in_group

    parts = gather_in_group(data, group)
    start = sum(len(part) for part in parts[: group.rank])
    return DataProto.concat(parts), slice(start, start + len(data))


def apply_inference_precision(precision: str, module: torch.nn.Module) -> torch.nn.Module:
    """Quantize an inference role's (reference, reward) weights when its ``precision`` is fp8
    or int4 (weight-only: ``verl.models.fp8`` / ``verl.models.int4`` replace the linear layers
    in place; compute runs in the activations' dtype). Other precisions return ``module`` as
    is."""
    if precision == "fp8":
        from verl.models.fp8 import quantize_model_fp8_

        quantize_model_fp8_(module)
    elif precision == "int4":
        from verl.models.int4 import quantize_model_int4_

        quantize_model_int4_(module)
    return module


def dynamic_precision(
    role: str,
    module: torch.nn.Module,
    device: torch.device,
    min_free_gb: float | None,
    reload: Any = None,
) -> Any:
    """A :class:`~verl.workers.dynamic_precision.DynamicPrecision` for an inference role
    when its spec has a threshold (``min_free_gb``, see
    ``verl.workers.specs.dynamic_precision_threshold``), else ``None``.

    ``reload`` returns the role's original state dict (``None``: keep a host copy)."""
    if min_free_gb is None:
        return None
    from verl.workers.dynamic_precision import DynamicPrecision

    return DynamicPrecision(role, module, device, min_free_gb, reload)


# Whether this process made a private one-rank group (ensure_process_group).
_PRIVATE_GROUP = False


def ensure_process_group(rank: int, world_size: int, device_type: str) -> None:
    """Make sure a ``torch.distributed`` group exists for an FSDP2 engine.

    Multi-rank groups are created by the worker-group backend before the worker exists;
    a one-rank FSDP2 run in the driver process (local backend) gets a private group on a
    free loopback port here, which :func:`release_private_process_group` leaves.
    """
    global _PRIVATE_GROUP
    if is_distributed():
        return
    if world_size != 1:
        raise RuntimeError(
            f"rank {rank} of {world_size}: no torch.distributed group; multi-rank FSDP2 "
            "workers must be started by the ray backend (trainer.backend=ray)"
        )
    init_distributed(0, 1, "127.0.0.1", find_free_port(), device_type=device_type)
    _PRIVATE_GROUP = True


def release_private_process_group() -> None:
    """Leave the one-rank group :func:`ensure_process_group` made in this process, if any
    (a later run in the same process, e.g. one that must refuse FSDP2 without a launcher,
    would otherwise find a group it did not make). Groups made by a launcher stay."""
    global _PRIVATE_GROUP
    if _PRIVATE_GROUP and is_distributed():
        destroy_distributed()
    _PRIVATE_GROUP = False


def to_device(data: DataProto, device: torch.device) -> DataProto:
    """``data``'s tensors on ``device`` (a new object: the caller's batch is not moved)."""
    if all(t.device == device for t in data.batch.values()):
        return data
    return data.select().to(device)


class MetricsAccumulator:
    """Collects scalar metrics over micro-batches and steps; reduces by mean (or sum)."""

    def __init__(self) -> None:
        self._values: dict[str, list[float]] = defaultdict(list)
        self._reduce: dict[str, str] = {}

    def add(self, key: str, value: float, reduce: str = "mean") -> None:
        self._values[key].append(float(value))
        self._reduce[key] = reduce

    def result(self) -> dict[str, float]:
        """Reduced metrics; with several data-parallel ranks, also reduced across them.

        ``mean`` metrics average every value of every rank; ``sum`` metrics are summed per
        rank and those sums averaged over ranks. A collective when distributed: every rank
        of the group must call it.
        """
        local = {key: (sum(values), len(values)) for key, values in self._values.items()}
        parts = [local]
        if dp_world_size() > 1:
            parts = [None] * dp_world_size()
            dist.all_gather_object(parts, local)
        out = {}
        for key in sorted({k for part in parts for k in part}):
            have = [part[key] for part in parts if key in part]
            if self._reduce[key] == "sum":
                # a sum per rank (e.g. skipped optimizer steps, the same on every rank)
                out[key] = sum(total for total, _ in have) / len(have)
            else:
                out[key] = sum(total for total, _ in have) / sum(count for _, count in have)
        return out


def atomic_save_pretrained(
    module: Any,
    tokenizer: Any,
    out_dir: str | os.PathLike[str],
    state_dict: dict[str, torch.Tensor] | None = None,
    extra: Callable[[Path], Any] | None = None,
) -> Path:
    """``save_pretrained`` into a temporary sibling directory, then rename into place.

    A crash mid-write never leaves a half-written ``out_dir``; an existing ``out_dir`` is
    replaced only after the new one is complete. ``state_dict`` (e.g. the full dict an
    FSDP2 engine gathered) replaces the module's own, whose tensors may be shards.
    ``extra(tmp)`` writes more files into the directory before it is renamed.
    """
    out = Path(out_dir)
    with replace_dir_atomically(out) as tmp:
        module.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
            save_processor_files(module, tokenizer, tmp)  # a vision-language model's
        if extra is not None:
            extra(Path(tmp))
    return out


def save_hf_model(
    module: Any,
    tokenizer: Any,
    out_dir: str | os.PathLike[str],
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write a trained model as a HF directory, atomically (:func:`atomic_save_pretrained`).

    ``state_dict``: the full weights when the module holds shards (FSDP2). A LoRA module
    (``verl.models.lora``) is written as the plain base model with its adapters folded into
    the weights, plus the adapters alone in ``lora_adapter/`` for peft.
    """
    from verl.models.lora import (
        LORA_ADAPTER_DIR,
        is_lora_model,
        lora_scaling,
        merged_state_dict,
        write_adapter,
    )

    if not is_lora_model(module):
        return atomic_save_pretrained(module, tokenizer, out_dir, state_dict=state_dict)
    state = state_dict if state_dict is not None else module.state_dict()
    merged = merged_state_dict(state, lora_scaling(module))
    if getattr(module.config, "tie_word_embeddings", False):
        merged.pop("lm_head.weight", None)  # the embedding matrix, stored once
    return atomic_save_pretrained(
        module.get_base_model(),
        tokenizer,
        out_dir,
        state_dict=merged,
        extra=lambda tmp: write_adapter(module, state, tmp / LORA_ADAPTER_DIR),
    )


def save_critic_model(
    module: Any,
    tokenizer: Any,
    out_dir: str | os.PathLike[str],
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write a critic (``CausalLMWithValueHead``) as ``verl export --role critic`` does: the
    body as a HF directory plus ``value_head.safetensors``, atomically. ``state_dict``: the
    full weights when the module holds shards (FSDP2)."""
    from verl.models.value_model import save_value_head, split_critic_state

    body, head = split_critic_state(state_dict if state_dict is not None else module.state_dict())
    return atomic_save_pretrained(
        module.model,
        tokenizer,
        out_dir,
        state_dict=body,
        extra=lambda tmp: save_value_head(head, tmp),
    )


def own_old_log_prob_metrics(data: DataProto, recorded: list) -> dict[str, float]:
    """The old-log-prob pass's metrics from an update that stood in for it.

    ``recorded``: ``(row_index, log_probs, entropy)`` per micro-batch (trimmed widths).
    Returns ``actor/entropy`` (mean over valid response tokens) and, when the batch has
    ``rollout_log_probs``, the ``rollout/*`` drift metrics.
    """
    mask = data.batch["response_mask"]
    rows, width = mask.shape
    log_probs = torch.zeros(rows, width)
    entropy = torch.zeros(rows, width)
    for index, lp, ent in recorded:
        index = index.cpu()
        log_probs[index, : lp.shape[1]] = lp.float().cpu()
        entropy[index, : ent.shape[1]] = ent.float().cpu()
    valid = mask.bool()
    metrics = {"actor/entropy": entropy[valid].mean().item() if valid.any() else 0.0}
    if "rollout_log_probs" in data.batch:
        metrics |= rollout_mismatch_metrics(log_probs, data.batch["rollout_log_probs"], mask)
    return metrics
