"""The FSDP2 train engine: one process per device, parameters sharded with ``fully_shard``.

:func:`apply_fsdp2` is the one place that decides how a model is cut into FSDP units;
:class:`FSDP2Engine` adds the :class:`~verl.engine.base.TrainEngine` backend hooks on top
(deferred gradient sync, a global norm over DTensor gradients, full and sharded state
dicts, the hybrid-engine :meth:`FSDP2Engine.gathered_params`). The default process group
must exist first (``verl.utils.distributed.init_distributed``).

Design decisions:

- **Units.** Every decoder layer is its own unit. verl calls a Hugging Face model in two
  ways: through its root forward (``generate``, the native rollout) and, for the log-prob
  path of ``compute_response_log_probs`` / the reward-model scorer, as
  ``model.model(...)`` followed by ``model.lm_head(hidden)`` (or ``model.score``) applied
  chunk by chunk outside the root forward. So for a HF ``PreTrainedModel`` with a body
  (``model.base_model`` is not the model itself) the FSDP root is the *body*, and the
  input embedding plus every head module form one grouped unit
  (``fully_shard([embed_tokens, lm_head])``). Both call patterns are then "body, then head
  module": every parameter is gathered by a hook of the module that uses it. The top module
  itself is not wrapped. Grouping the input and output embeddings is also what makes tied
  embeddings correct: the one shared parameter lives in one unit, its gradient collects the
  embedding and head contributions, and it is reduced once per use (torch documents this
  grouped, partially-run unit as its "chunked loss" pattern). Any other module (e.g. the
  critic's ``CausalLMWithValueHead``, whose forward reads ``value_head.weight`` directly) is
  wrapped the usual way: layers, then the whole module as root, so it must be called
  through its forward.
- **Precision.** The sharded parameters are the fp32 master weights (``param_dtype=None``);
  ``mixed_precision={"param_dtype": "bf16", "reduce_dtype": "fp32"}`` makes FSDP gather
  and compute in bf16 and reduce gradients in fp32
  (:class:`torch.distributed.fsdp.MixedPrecisionPolicy`). ``buffer_dtype`` casts floating
  buffers once at wrap time. fp16 autocast (which needs a sharded grad scaler) is refused.
- **Checkpoints** are directories written by all ranks: ``model_optim/`` is a
  ``torch.distributed.checkpoint`` (DCP) of the sharded model and optimizer state (each
  rank writes its shards; loading re-shards, so the world size may change), and
  ``engine_state.json`` (rank 0) holds the scheduler, skipped-step count and layout. Each
  part is written under a temporary name and renamed; the JSON is written last and removed
  first, so a directory with a JSON is a complete checkpoint. Nothing is unpickled freely on
  load: DCP's ``.metadata`` goes through an unpickler that only admits DCP's metadata
  classes, and the optimizer's non-tensor values are read with ``torch.load(weights_only=True)``
  (``verl.engine.dcp_io``).
- **Hybrid engine.** :meth:`FSDP2Engine.gathered_params` gathers every unit once, keeps the
  full weights registered on the module for any number of forwards (generation), then
  reshards. No second copy of the weights is made. Forwards inside it run no collective, so
  ranks may generate different amounts (different batches, early stops); outside it every
  forward all-gathers, so every rank must run the same number of forwards.
- **Sequence parallelism.** ``sequence_parallel_size = sp > 1`` arranges the ranks as a
  ``(data, sequence)`` mesh (``verl.kernels.ulysses``): the ranks of a sequence group split
  each micro-batch's tokens, and their attention trades the token split for a head split
  with all-to-alls. Parameters stay sharded over all ranks (FSDP's mesh is the whole
  world); the per-token gather's backward scales each rank's share by ``sp``, so FSDP's
  average over ``dp x sp`` ranks is the mean over the ``dp`` data-parallel groups.
  :attr:`FSDP2Engine.data_parallel_size` is ``world / sp``; a caller gives every rank of a
  sequence group the same rows.
- **Tensor parallelism.** ``tensor_parallel_size = t > 1`` arranges the ranks as a
  ``(data, tensor)`` mesh (``verl.engine.tensor_parallel``): the layers are split column/row
  wise over ``tensor`` (DTensor), the LM head over the vocabulary, and FSDP2 shards over
  ``data`` only. :attr:`FSDP2Engine.data_parallel_size` is ``world / t``; the ranks of a
  tensor group run the same forwards on the same rows.
- **Inference mode.** FSDP allocates a unit's gathered-parameter tensors on its first
  all-gather and reuses them; allocated under ``torch.inference_mode`` they would be
  inference tensors that a later training step cannot write. The engine therefore gathers
  every unit once at construction, and gathers in ``gathered_params`` with inference mode
  off.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor, Shard

from verl.engine.base import OptimSpec, TrainEngine, resolve_dtype
from verl.engine.dcp_io import load_dcp_state
from verl.engine.options import EngineOptions
from verl.engine.sharded_checkpoint import (
    DCP_DIR,
    FORMAT_VERSION,
    SINGLE_ENGINE_MODEL_FILE,
    STATE_FILE,
    check_sharded_state,
    scalar_state,
)
from verl.engine.tensor_parallel import (
    TensorParallel,
    apply_tensor_parallel,
    build_tensor_parallel,
    grad_norm,
    unaliased,
)
from verl.kernels.ulysses import SequenceParallel, apply_ulysses, build_sequence_parallel
from verl.utils.atomic_io import publish_dir, write_text_atomic

logger = logging.getLogger(__name__)

__all__ = [
    "FSDP2Engine",
    "apply_fsdp2",
    "find_decoder_layers",
    "mixed_precision_policy",
]

_MP_KEYS = ("param_dtype", "reduce_dtype", "buffer_dtype", "output_dtype")


# ---- wrapping ------------------------------------------------------------------------


def find_decoder_layers(module: nn.Module) -> list[nn.Module]:
    """The transformer blocks of ``module``, in forward order.

    Modules whose class name is in ``module._no_split_modules`` (what HF uses for
    ``device_map``, e.g. ``["Qwen2DecoderLayer"]``); else the children of ``model.layers``
    / ``layers`` when that is a ``ModuleList``; else ``[]``.
    """
    names = set(getattr(module, "_no_split_modules", None) or [])
    if names:
        found = [m for m in module.modules() if type(m).__name__ in names and m is not module]
        if found:
            return found
    for owner in (getattr(module, "model", None), module):
        layers = getattr(owner, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers) > 0:
            return list(layers)
    return []


def _hf_body(module: nn.Module) -> nn.Module | None:
    """The HF body (``model.model``) of a model with a head, or None for other modules."""
    from transformers import PreTrainedModel

    if not isinstance(module, PreTrainedModel):
        return None
    body = getattr(module, "base_model", None)
    if not isinstance(body, nn.Module) or body is module:
        return None
    return body


def apply_fsdp2(
    module: nn.Module,
    mesh: DeviceMesh,
    *,
    reshard_after_forward: bool = True,
    mp_policy: MixedPrecisionPolicy | None = None,
    offload_policy: OffloadPolicy | None = None,
    shard_dim: int = 0,
) -> list[FSDPModule]:
    """Shard ``module`` in place with FSDP2 (see the module docstring for the unit layout).

    Args:
        module: a HF causal LM / sequence classifier (or a peft model wrapping one: its base
            model is sharded, adapters with their layers), or any module called through its
            forward. Parameters must already be on the mesh's device (or on ``meta``).
        mesh: 1-D data-parallel device mesh.
        reshard_after_forward: ``True`` frees gathered parameters after each unit's forward
            and gathers again in backward (ZeRO-3, FSDP1's FULL_SHARD); ``False`` keeps them
            until the end of backward (ZeRO-2, SHARD_GRAD_OP).
        mp_policy / offload_policy: passed to every ``fully_shard`` call.
        shard_dim: the dimension each parameter is sharded along (``shard_placement_fn``):
            0 splits a ``[out, in]`` weight by rows, 1 by columns; a parameter with fewer
            dimensions (biases, norms) is sharded along 0. Results are the same for either
            dim (the gathered parameter is the same tensor); the shard shapes differ.

    Returns:
        The FSDP units, root last. ``module`` itself is a unit only when it is the root.
    """
    get_base = getattr(module, "get_base_model", None)
    if callable(get_base):  # a peft model: shard the HF model its adapters live in
        module = get_base()
    kwargs: dict[str, Any] = dict(mesh=mesh, reshard_after_forward=reshard_after_forward)
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    if offload_policy is not None:
        kwargs["offload_policy"] = offload_policy
    if shard_dim not in (0, 1):
        raise ValueError(f"shard_dim={shard_dim}: a shard dim is 0 or 1")
    if shard_dim != 0:
        kwargs["shard_placement_fn"] = lambda p: Shard(shard_dim if p.ndim > shard_dim else 0)

    layers = find_decoder_layers(module)
    if not layers:
        logger.warning(
            "found no decoder layers in %s (no _no_split_modules / model.layers): "
            "sharding it as one unit, which gathers the whole model at once",
            type(module).__name__,
        )
    units: list[FSDPModule] = [fully_shard(layer, **kwargs) for layer in layers]

    body = _hf_body(module)
    if body is None:
        units.append(fully_shard(module, **kwargs))
        return units

    heads = [
        child
        for child in module.children()
        if child is not body and any(True for _ in child.parameters())
    ]
    direct = [name for name, _ in module.named_parameters(recurse=False)]
    if direct:
        raise ValueError(
            f"{type(module).__name__} has parameters outside its body and head modules "
            f"({direct}); apply_fsdp2 cannot place them in a unit"
        )
    group = [m for m in (body.get_input_embeddings(), *heads) if m is not None]
    if group:
        # One unit for both vocabulary matrices: required when they are tied, and the head
        # (called after the body's forward) still has its own forward hooks to gather it.
        fully_shard(group, **kwargs)
        units.append(group[0])  # any module of a grouped unit reaches its state
    units.append(fully_shard(body, **kwargs))
    return units


def mixed_precision_policy(cfg: dict[str, Any] | None) -> MixedPrecisionPolicy | None:
    """``{"param_dtype": "bf16", "reduce_dtype": "fp32", ...}`` -> ``MixedPrecisionPolicy``.

    Keys: ``param_dtype`` (gather / compute dtype), ``reduce_dtype`` (gradient reduction),
    ``output_dtype`` (cast of unit outputs) and ``buffer_dtype`` (handled by the engine, not
    by FSDP2). Missing keys keep the parameter's own dtype. ``None`` or ``{}`` -> ``None``.
    """
    if not cfg:
        return None
    unknown = set(cfg) - set(_MP_KEYS)
    if unknown:
        raise ValueError(f"unknown mixed_precision keys {sorted(unknown)}; use {_MP_KEYS}")
    return MixedPrecisionPolicy(
        param_dtype=resolve_dtype(cfg.get("param_dtype")),
        reduce_dtype=resolve_dtype(cfg.get("reduce_dtype")),
        output_dtype=resolve_dtype(cfg.get("output_dtype")),
    )


# ---- the engine ----------------------------------------------------------------------


class FSDP2Engine(TrainEngine):
    """:class:`TrainEngine` over an FSDP2-sharded module, one process per device.

    Args: the base class's (``module, optimizer_cfg, options, **overrides``); of the
    :class:`~verl.engine.options.EngineOptions` this engine reads also:
        reshard_after_forward: ``True`` = FULL_SHARD, ``False`` = SHARD_GRAD_OP.
        mixed_precision: see :func:`mixed_precision_policy`; ``None`` computes in the
            parameters' dtype.
        cpu_offload: keep sharded parameters, gradients and optimizer state on the host
            (``CPUOffloadPolicy``); only meaningful with a CUDA device.
        full_state_dict_from_rank0: the weights are loaded only on rank 0; other ranks may
            pass the same architecture on the ``meta`` device (or randomly initialised).
            Rank 0's weights and buffers are broadcast after sharding.
        shard_dim: the parameter dimension the shards split (:func:`apply_fsdp2`).
        sequence_parallel_size: Ulysses sequence-parallel ranks per group (1 = off; must
            divide the world size and split the model's attention heads, see
            ``verl.kernels.ulysses``). The module's log-prob / value forwards
            (``compute_response_log_probs``, the critic's) then split their tokens over the
            group; :attr:`sequence_parallel` is this rank's place in the mesh.

    The engine's :attr:`module` is the original module object, sharded in place: call it
    like the unwrapped model (``module(...)``, ``module.model(...)`` + ``module.lm_head``).
    Every rank must make the same sequence of calls (forwards, ``state_dict_for_save``,
    checkpoints), as each one runs collectives.
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer_cfg: OptimSpec | None,
        options: EngineOptions | None = None,
        **overrides: Any,
    ) -> None:
        options = EngineOptions.of(options, **overrides)
        sequence_parallel_size = options.sequence_parallel_size
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "the fsdp2 engine needs torch.distributed to be initialised first: call "
                "verl.utils.distributed.init_distributed(rank, world_size, master_addr, "
                "master_port) in every worker process before building it"
            )
        if resolve_dtype(options.autocast_dtype) == torch.float16 or options.grad_scaling:
            raise NotImplementedError(
                "autocast_dtype=float16 is not supported by the fsdp2 engine (its loss scaler "
                "would need a sharded inf check); use bf16"
            )
        self.reshard_after_forward = bool(options.reshard_after_forward)
        self.shard_dim = int(options.shard_dim)
        self.mixed_precision = dict(options.mixed_precision or {})
        self.mp_policy = mixed_precision_policy(self.mixed_precision)
        self.cpu_offload = bool(options.cpu_offload)
        self.full_state_dict_from_rank0 = bool(options.full_state_dict_from_rank0)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        if sequence_parallel_size < 1 or self.world_size % sequence_parallel_size:
            raise ValueError(
                f"ulysses_sequence_parallel_size={sequence_parallel_size} must divide the "
                f"{self.world_size} ranks of the engine; use a divisor of {self.world_size}"
            )
        self.sequence_parallel_size = int(sequence_parallel_size)
        self.sequence_parallel: SequenceParallel | None = None
        self.tensor_parallel_size = int(options.tensor_parallel_size)
        self.tensor_parallel: TensorParallel | None = None
        self.units: list[FSDPModule] = []
        self._gathered = False
        super().__init__(module, optimizer_cfg, options.replace(grad_scaling=False))

    # ---- backend hooks ---------------------------------------------------------------

    def _prepare_module(self, module: nn.Module) -> nn.Module:
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        full_sd: dict[str, torch.Tensor] = {}
        if self.full_state_dict_from_rank0 and self.rank == 0:
            # A copy: set_model_state_dict replaces the values it is given with DTensors.
            full_sd = {k: v.detach().clone() for k, v in module.state_dict().items()}
        on_meta = any(p.is_meta for p in module.parameters())
        if on_meta and not (self.full_state_dict_from_rank0 and self.rank != 0):
            raise ValueError(
                "module has parameters on the meta device: that is only allowed on ranks > 0 "
                "with full_state_dict_from_rank0=True"
            )
        if on_meta and self.cpu_offload and self.device.type != "cpu":
            raise NotImplementedError(
                "cpu_offload with a meta-device module on an accelerator is not supported: "
                "load the weights on every rank, or drop cpu_offload"
            )
        if not on_meta:
            module.to(self.device)
        if self.param_dtype is not None:
            module.to(self.param_dtype)
        buffer_dtype = resolve_dtype(self.mixed_precision.get("buffer_dtype"))
        if buffer_dtype is not None:
            for buf in module.buffers():
                if buf.is_floating_point():
                    buf.data = buf.data.to(buffer_dtype)

        if self.sequence_parallel_size > 1:
            self.sequence_parallel = build_sequence_parallel(
                self.device.type, self.sequence_parallel_size
            )
            apply_ulysses(module, self.sequence_parallel)
        offload = None
        if self.cpu_offload:
            offload = CPUOffloadPolicy(pin_memory=self.device.type == "cuda")
        mesh = init_device_mesh(self.device.type, (self.world_size,), mesh_dim_names=("fsdp",))
        if self.tensor_parallel_size > 1:  # split over "tensor" first, FSDP2 over "data"
            tp = build_tensor_parallel(self.device.type, self.tensor_parallel_size, self.options)
            self.tensor_parallel, mesh = tp, tp.mesh["data"]
            apply_tensor_parallel(module, tp)
        self.units = apply_fsdp2(
            module,
            mesh,
            reshard_after_forward=self.reshard_after_forward,
            mp_policy=self.mp_policy,
            offload_policy=offload,
            shard_dim=self.shard_dim,
        )
        if on_meta:
            module.to_empty(device=self.device)
        if self.full_state_dict_from_rank0:
            self._broadcast_from_rank0(module, full_sd)
        not_sharded = [n for n, p in module.named_parameters() if not isinstance(p, DTensor)]
        if not_sharded:
            raise RuntimeError(f"apply_fsdp2 left parameters unsharded: {not_sharded}")
        # FSDP allocates each unit's gathered-parameter tensors on its first all-gather and
        # reuses them for good. Made inside torch.inference_mode (a first forward in a
        # rollout), they would be inference tensors that training can never write again:
        # gather once now, in normal mode.
        with torch.inference_mode(False), torch.no_grad():
            for unit in self.units:
                unit.unshard()
                unit.reshard()
        logger.info(
            "fsdp2: %d units over %d ranks (reshard_after_forward=%s, mp=%s, cpu_offload=%s, "
            "sequence parallel=%d, tensor parallel=%d)",
            len(self.units),
            self.world_size,
            self.reshard_after_forward,
            self.mixed_precision or None,
            self.cpu_offload,
            self.sequence_parallel_size,
            self.tensor_parallel_size,
        )
        return module

    @property
    def data_parallel_size(self) -> int:
        """``world / (sequence_parallel_size * tensor_parallel_size)``: the ranks of a sequence
        or tensor group share rows."""
        return self.world_size // (self.sequence_parallel_size * self.tensor_parallel_size)

    def _broadcast_from_rank0(self, module: nn.Module, full_sd: dict[str, torch.Tensor]) -> None:
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(module, full_sd, options=options)
        # Buffers that are not in the state dict (rotary inv_freq) must come from rank 0 too.
        for buf in module.buffers():
            if buf.is_meta:
                raise RuntimeError("a buffer is still on the meta device after sharding")
            dist.broadcast(buf, src=0)

    def _backward_context(self, is_last_micro_batch: bool) -> contextlib.AbstractContextManager:
        """Reduce-scatter gradients only on the last micro-batch (earlier ones accumulate
        unsharded gradients locally)."""
        return self._gradient_sync(is_last_micro_batch)

    @contextlib.contextmanager
    def _gradient_sync(self, enabled: bool) -> Iterator[None]:
        for unit in self.units:
            unit.set_requires_gradient_sync(enabled, recurse=False)
        try:
            yield
        finally:
            if not enabled:
                for unit in self.units:
                    unit.set_requires_gradient_sync(True, recurse=False)

    def _grad_norm(self) -> torch.Tensor:
        """Global L2 norm over all ranks' gradient shards: a plain 0-d tensor, the same
        value on every rank (so every rank clips and skips identically)."""
        # one norm per mesh (with tensor parallelism: split weights and whole ones), combined
        return grad_norm([p.grad for p in self._trainable_params() if p.grad is not None])

    # ---- hybrid engine -----------------------------------------------------------------

    @contextlib.contextmanager
    def gathered_params(self) -> Iterator[nn.Module]:
        """Gather every unit once and keep the full weights on the module for the block.

        For generation (the native rollout, HF ``generate``): the forwards inside run
        without any collective. Yields :attr:`module`. All ranks must enter together.
        Afterwards the parameters are resharded and ``reshard_after_forward`` restored.
        """
        if self._gathered:  # nested: the outer block owns the gathered state
            yield self.module
            return
        with self.resident():
            yield from self._gather_all()

    def _gather_all(self) -> Iterator[nn.Module]:
        self._gathered = True
        for unit in self.units:
            unit.set_reshard_after_forward(False, recurse=False)
        try:
            with torch.inference_mode(False), torch.no_grad():
                for unit in self.units:
                    unit.unshard()
            yield self.module
        finally:
            for unit in self.units:
                unit.set_reshard_after_forward(self.reshard_after_forward, recurse=False)
            self._gathered = False
            self._reset_fsdp_iteration()

    @contextlib.contextmanager
    def eval_mode(self) -> Iterator[None]:
        """As the base class; also clears FSDP's per-forward bookkeeping afterwards, which
        only a backward pass would otherwise reset. Reduced (sharded) gradients survive;
        do not use it between ``backward(..., is_last_micro_batch=False)`` calls."""
        with super().eval_mode():
            yield
        if not self._gathered:
            self._reset_fsdp_iteration()

    def _reset_fsdp_iteration(self) -> None:
        # Clears the per-forward trackers (forward order, partially run grouped units) that
        # only a backward pass resets otherwise; then every unit goes back to its shards.
        self.units[-1].reset_iter_state()
        for unit in self.units:
            unit.reshard()

    # ---- state -----------------------------------------------------------------------

    def state_dict_for_save(self) -> dict[str, torch.Tensor]:
        """The full model state dict (HF names, plain CPU tensors) on rank 0; ``{}`` on the
        other ranks. Collective: every rank must call it."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.module, options=options)
        # a weight whole on this rank (one rank, or replicated over tensor ranks) comes back
        # as the live tensor itself: copy those, the caller keeps the dict across steps
        return unaliased(state, self.module) if self.rank == 0 else {}

    def save_checkpoint(self, path: str) -> None:
        """Write the sharded model + optimizer (DCP) and ``engine_state.json`` under ``path``.

        Collective. ``path`` must be on a filesystem every rank sees.
        """
        final_dir = os.path.join(path, DCP_DIR)
        tmp_dir = final_dir + ".tmp"
        state_file = os.path.join(path, STATE_FILE)
        if self.rank == 0:
            os.makedirs(path, exist_ok=True)
            shutil.rmtree(tmp_dir, ignore_errors=True)
        dist.barrier()
        engine_state = self.state_dict()
        dcp_state = {"model": engine_state["model"]}
        if engine_state["optimizer"] is not None:
            dcp_state["optim"] = engine_state["optimizer"]
        dcp.save(dcp_state, checkpoint_id=tmp_dir)
        dist.barrier()
        if self.rank == 0:
            state = {
                "format_version": FORMAT_VERSION,
                "world_size": self.world_size,
                "sequence_parallel_size": self.sequence_parallel_size,
                "tensor_parallel_size": self.tensor_parallel_size,
                "param_names": self._param_names(),
                "skipped_steps": engine_state["skipped_steps"],
                "consecutive_skipped": engine_state["consecutive_skipped"],
                "has_optimizer": self.optimizer is not None,
                "scheduler": engine_state["scheduler"],
            }
            text = json.dumps(state, indent=1, allow_nan=True)  # fails before touching files
            with contextlib.suppress(FileNotFoundError):
                os.remove(state_file)  # invalidate first: a crash below leaves no JSON
            publish_dir(tmp_dir, final_dir)
            write_text_atomic(state_file, text)
        dist.barrier()
        logger.info("saved fsdp2 engine checkpoint to %s (step %d)", path, self.global_step)

    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote, on any number of ranks. Collective.

        The sharded state is re-sharded to this engine's world size by DCP. A checkpoint of
        the single-process engine (full tensors in safetensors, no DCP) is refused.
        """
        state_file = os.path.join(path, STATE_FILE)
        dcp_dir = os.path.join(path, DCP_DIR)
        if os.path.isfile(os.path.join(path, SINGLE_ENGINE_MODEL_FILE)):
            raise ValueError(
                f"the engine checkpoint at {path} was written by the single-process engine; "
                f"the fsdp2 engine ({self.world_size} ranks) reads only its own sharded (DCP) "
                "checkpoints. Resume it with one process and strategy=single, or run the "
                "original training with strategy=fsdp2 (which also works on one process)"
            )
        if not (os.path.isfile(state_file) and os.path.isdir(dcp_dir)):
            raise FileNotFoundError(
                f"incomplete fsdp2 engine checkpoint at {path}: need {STATE_FILE} and {DCP_DIR}/"
            )
        with open(state_file) as f:
            state = json.load(f)
        check_sharded_state(state, path, self._param_names(), self.optimizer is not None)
        load_dcp_state(self.module, self.optimizer, dcp_dir)  # the model and optimizer parts
        self.load_state_dict(scalar_state(state, self.optimizer is not None))
        dist.barrier()
        logger.info(
            "loaded fsdp2 engine checkpoint from %s (step %d, saved by %s ranks with sequence "
            "parallel %s, now %d with %d)",
            path,
            self.global_step,
            state.get("world_size"),
            state.get("sequence_parallel_size", 1),
            self.world_size,
            self.sequence_parallel_size,
        )

    def _model_optim_state(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """This rank's shards (DTensor values, keyed by parameter name), as DCP saves them."""
        if self.optimizer is None:
            return get_model_state_dict(self.module), None
        return get_state_dict(self.module, self.optimizer)

    def _load_model_optim_state(self, model: Any, optim: Any) -> None:
        options = StateDictOptions(strict=True)
        if model is not None:
            set_model_state_dict(self.module, model, options=options)
        if optim is not None:
            set_optimizer_state_dict(self.module, self.optimizer, optim, options=options)

    def _param_names(self) -> list[str]:
        return [name for name, p in self.module.named_parameters() if p.requires_grad]

    # ---- memory ------------------------------------------------------------------------

    def _state_lives_on_host(self) -> bool:
        # With cpu_offload FSDP2 keeps shards and optimizer state on the host already.
        return self.device.type == "cpu" or self.cpu_offload
