"""Tensor parallelism on DTensor: Llama / Qwen2 layers split column/row-wise over a mesh dim.

With ``tensor_parallel_size = t`` the fsdp2 engine (``verl.engine.fsdp``) arranges its
``world`` ranks as a ``(data, tensor)`` device mesh (``rank = data_rank * t + tensor_rank``)
and :func:`apply_tensor_parallel` cuts the model over the ``tensor`` dimension with
``torch.distributed.tensor.parallel.parallelize_module`` before FSDP2 shards it over the
``data`` dimension:

- **Attention**: ``q_proj`` / ``k_proj`` / ``v_proj`` column-wise (each tensor rank holds
  ``heads / t`` query heads and ``kv_heads / t`` key/value heads, biases included), ``o_proj``
  row-wise (its partial outputs are summed by an all-reduce). The attention itself runs on
  the local heads unchanged (transformers reshapes the projections with ``-1`` heads), so
  padded batches and packed sequences (position ids restarting per sequence) work as in
  one process.
- **MLP**: ``gate_proj`` / ``up_proj`` column-wise, ``down_proj`` row-wise.
- **Vocabulary**: the input embedding row-wise (each rank looks up its vocabulary rows, the
  outputs are summed) and the LM head column-wise over the vocabulary; a tied head is tied
  again to the sharded embedding. The head is marked vocabulary-parallel
  (:mod:`verl.kernels.vocab_parallel`): ``compute_response_log_probs`` scores its logit
  shards with cross-rank reductions of ``rows`` numbers, never gathering the vocabulary;
  any other call of the head (generation, ``model(...).logits``) receives the gathered
  full logits.
- Norms and rotary embeddings stay whole on every tensor rank (the norms' weights as
  replicated DTensors, so that all parameters share one mesh).
- **Value models** (``verl.models.value_model.CausalLMWithValueHead``: a body and a
  ``value_head`` its forward reads directly): the body is split as above, the value head is
  replicated; the body's final norm hands the head a replicated DTensor, and the model's
  output (the values) leaves as a plain tensor.

Every rank of a tensor group must run the same forwards on the same rows (each forward
runs collectives over the group); the loss is computed identically on each, and DTensor's
backward sums the partial input gradients. Gradients of split weights are sharded like
the weights; of whole ones (norms), identical on the ranks of a group.

Refused with a message naming ``tensor_parallel_size``: a model type other than Llama /
Qwen2, heads, key/value heads, the MLP width or the vocabulary not divisible by ``t``, a
peft (LoRA) model, a module with neither an ``lm_head`` nor a ``value_head``, and (in the
engine) ``t`` not dividing the world or combined with sequence parallelism.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from verl.kernels.vocab_parallel import VocabShard, mark_vocab_parallel, wants_local_logits
from verl.utils.tensor_split import SUPPORTED_MODEL_TYPES, model_split_problem, split_counts

logger = logging.getLogger(__name__)

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "TensorParallel",
    "apply_tensor_parallel",
    "build_tensor_parallel",
    "check_tensor_parallel",
    "grad_norm",
    "unaliased",
]

KEY = "tensor_parallel_size"


@dataclass(frozen=True)
class TensorParallel:
    """This rank's place in the ``(data, tensor)`` mesh: ``group`` (the ``size`` ranks that
    split the weights; ``rank`` is this rank's index in it), ``dp_size`` / ``dp_rank``."""

    mesh: Any
    group: Any
    size: int
    rank: int
    dp_size: int
    dp_rank: int


def build_tensor_parallel(device_type: str, size: int, options: Any = None) -> TensorParallel:
    """The ``(data, tensor)`` mesh over the default process group with ``size`` ranks per
    tensor group. Collective: every rank calls it (once per engine). ``options``: the
    engine's :class:`~verl.engine.options.EngineOptions`, whose combinations with tensor
    parallelism that are not implemented are refused here."""
    from torch.distributed.device_mesh import init_device_mesh

    sp = getattr(options, "sequence_parallel_size", 1)
    if size > 1 and sp > 1:
        raise NotImplementedError(
            f"{KEY}={size} with ulysses_sequence_parallel_size={sp}: a (data, sequence, "
            "tensor) mesh is not implemented; set one of them to 1"
        )
    world = dist.get_world_size()
    if size < 1 or world % size:
        raise ValueError(
            f"{KEY}={size} must divide the role's {world} ranks; use a divisor of {world}"
        )
    mesh = init_device_mesh(device_type, (world // size, size), mesh_dim_names=("data", "tensor"))
    return TensorParallel(
        mesh=mesh,
        group=mesh.get_group("tensor"),
        size=size,
        rank=mesh.get_local_rank("tensor"),
        dp_size=world // size,
        dp_rank=mesh.get_local_rank("data"),
    )


def check_tensor_parallel(config: Any, size: int) -> None:
    """Raise unless a model with HF ``config`` splits over ``size`` tensor ranks (the rule of
    :func:`verl.utils.tensor_split.model_split_problem`): ``NotImplementedError`` for a model
    type without a plan, ``ValueError`` naming the count that does not divide."""
    counts = split_counts(config)
    problem = model_split_problem(counts, KEY, size)
    if problem is not None:
        unsupported = counts["model_type"] not in SUPPORTED_MODEL_TYPES
        raise (NotImplementedError if unsupported else ValueError)(problem)


def _layer_plan() -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }


def _head_output(module: nn.Module, args: Any, output: Any) -> torch.Tensor:
    """The vocabulary-parallel head's output: this rank's logit shard inside
    ``local_logits()``, else the full logits (all-gathered, differentiable)."""
    if not isinstance(output, DTensor):
        return output
    return output.to_local() if wants_local_logits() else output.full_tensor()


def _to_replicated(module: nn.Module, inputs: tuple, mesh: Any) -> tuple:
    return tuple(
        DTensor.from_local(x, mesh, [Replicate()], run_check=False)
        if isinstance(x, torch.Tensor) and not isinstance(x, DTensor)
        else x
        for x in inputs
    )


def _to_local(module: nn.Module, output: Any, mesh: Any) -> Any:
    return output.to_local() if isinstance(output, DTensor) else output


def _values_to_local(module: nn.Module, args: Any, output: Any) -> Any:
    return output.to_local() if isinstance(output, DTensor) else output


def _replicate_whole_modules(module: nn.Module, mesh: Any, keep: tuple = ()) -> None:
    """The modules whose own parameters no plan split (the norms) hold them as replicated
    DTensors on the tensor mesh, so that every parameter lives on the one ``(data, tensor)``
    mesh after FSDP2 (clipping and the optimizer's foreach kernels take one mesh). Their
    inputs enter as replicated DTensors and leave as local tensors, so the computation is
    the plain one; the gradient of a replicated weight is the full one on every rank.
    The modules in ``keep`` hand their output on as the replicated DTensor."""
    from torch.distributed.tensor import distribute_module

    for sub in list(module.modules()):
        own = [p for _, p in sub.named_parameters(recurse=False)]
        if own and not any(isinstance(p, DTensor) for p in own):
            output_fn = None if any(sub is k for k in keep) else _to_local
            distribute_module(sub, mesh, input_fn=_to_replicated, output_fn=output_fn)


def apply_tensor_parallel(module: nn.Module, tp: TensorParallel) -> None:
    """Split ``module`` (a Llama / Qwen2 causal LM, parameters on the mesh's device) over
    ``tp``'s tensor dimension in place (see the module docstring). Call before FSDP2."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if callable(getattr(module, "get_base_model", None)):
        raise NotImplementedError(
            f"{KEY}={tp.size} with a LoRA (peft) model is not supported: the adapters' "
            "layers have no tensor-parallel plan; set it to 1 or train without LoRA"
        )
    config = getattr(module, "config", None)
    check_tensor_parallel(config, tp.size)
    body = getattr(module, "model", None)
    head = getattr(module, "lm_head", None)
    layers = getattr(body, "layers", None)
    value_head = getattr(module, "value_head", None)
    if isinstance(layers, nn.ModuleList) and isinstance(value_head, nn.Linear) and head is None:
        _apply_to_value_model(module, body, tp)
        return
    if not (isinstance(layers, nn.ModuleList) and isinstance(head, nn.Linear)):
        raise NotImplementedError(
            f"{KEY}={tp.size}: {type(module).__name__} is neither a causal LM with "
            "model.layers and an lm_head nor a value model with a value_head (a sequence "
            "classifier is not supported); set it to 1"
        )
    mesh = tp.mesh["tensor"]
    tied = head.weight is body.embed_tokens.weight
    for layer in layers:
        parallelize_module(layer, mesh, _layer_plan())
    parallelize_module(body.embed_tokens, mesh, RowwiseParallel(input_layouts=Replicate()))
    parallelize_module(
        head, mesh, ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    )
    if tied:  # parallelize_module gave each its own sharded copy of the one matrix
        head.weight = body.embed_tokens.weight
    head.register_forward_hook(_head_output)
    _replicate_whole_modules(module, mesh)
    vocab = int(config.vocab_size)
    size = vocab // tp.size
    mark_vocab_parallel(head, VocabShard(tp.group, tp.rank * size, size, vocab))
    logger.info(
        "tensor parallel: %d tensor ranks x %d data-parallel groups (this rank: tensor %d, "
        "data %d; tied head: %s)",
        tp.size,
        tp.dp_size,
        tp.rank,
        tp.dp_rank,
        tied,
    )


def _apply_to_value_model(module: nn.Module, body: nn.Module, tp: TensorParallel) -> None:
    """A value model's split (see the module docstring): its forward computes
    ``F.linear(hidden, value_head.weight, ...)`` itself, so the final norm leaves its
    output a replicated DTensor for the replicated head weights, and the values are made
    plain again on the way out."""
    from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

    mesh = tp.mesh["tensor"]
    for layer in body.layers:
        parallelize_module(layer, mesh, _layer_plan())
    parallelize_module(body.embed_tokens, mesh, RowwiseParallel(input_layouts=Replicate()))
    _replicate_whole_modules(module, mesh, keep=(body.norm,))
    module.register_forward_hook(_values_to_local)
    logger.info(
        "tensor parallel (value model): %d tensor ranks x %d data-parallel groups (this "
        "rank: tensor %d, data %d)",
        tp.size,
        tp.dp_size,
        tp.rank,
        tp.dp_rank,
    )


def grad_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """Global L2 norm of gradients, DTensor shards or plain, that may live on different
    meshes (with tensor parallelism: split weights on the ``(data, tensor)`` mesh, whole
    ones on ``data`` only): one norm per mesh, each reduced over its own mesh, combined. A
    plain 0-d tensor, the same on every rank."""
    by_mesh: dict[Any, list[torch.Tensor]] = {}
    for grad in grads:
        by_mesh.setdefault(grad.device_mesh if isinstance(grad, DTensor) else None, []).append(grad)
    norms = []
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm(group, norm_type=2.0)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if len(norms) == 1:
        return norms[0]
    if not norms:
        return torch.zeros(())
    return torch.stack([n.float() for n in norms]).square().sum().sqrt()


def unaliased(state: dict[str, torch.Tensor], module: nn.Module) -> dict[str, torch.Tensor]:
    """``state`` (a full state dict) with copies of the values that share memory with
    ``module``'s live parameters: the full tensor of a weight that is whole on this rank
    (every weight on one rank; a norm's replicated over the tensor ranks with one
    data-parallel rank) is its local tensor itself, which the next optimizer step would
    change under the caller. Values that shared one tensor (a tied embedding and LM head)
    share one copy, so an export still sees them tied."""
    live = set()
    for p in module.parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        live.add(local.untyped_storage().data_ptr())
    copies: dict[tuple[int, int, tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}
    out = {}
    for key, value in state.items():
        ptr = value.untyped_storage().data_ptr()
        if ptr not in live:
            out[key] = value
            continue
        view = (ptr, value.storage_offset(), tuple(value.shape), tuple(value.stride()))
        if view not in copies:
            copies[view] = value.clone()
        out[key] = copies[view]
    return out
