"""The training-engine interface: one model + AdamW + LR schedule, stepped in micro-batches.

A :class:`TrainEngine` owns a module, its optimizer, scheduler and (for fp16) grad scaler.
Workers call it in this shape::

    with engine.train_mode():
        metrics = engine.forward_backward(micro_batches, loss_fn, loss_scales)
        step = engine.optimizer_step()   # {"grad_norm", "lr", "skipped"}

    with engine.eval_mode():             # eval + no_grad + autocast
        log_probs, _ = compute_response_log_probs(engine.module, ...)

Everything that is the same for every backend (the optimizer, the schedule, gradient
accumulation, clipping, the non-finite guard) lives here. A backend (``single``,
``fsdp2``) supplies how the module is placed/wrapped, how the gradient norm is
reduced, how backward sync is deferred across micro-batches, how state is saved and loaded,
and how memory is offloaded: the abstract methods and ``_``-hooks below. Generation on the
training weights runs inside ``with engine.gathered_params():`` (a no-op unless sharded).

Note for the fsdp2 backend: ``compute_response_log_probs`` calls ``module.model(...)`` and
``module.lm_head`` directly, bypassing the root module's forward hook, so every parameter
must belong to an ``fully_shard`` unit whose own hooks fire on those calls. ``fsdp2`` makes
the body (``module.model``) the FSDP root and groups the input embedding with the head(s)
in one unit, which also keeps tied embeddings tied (see ``verl.engine.fsdp``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from verl.engine.optim import OptimSpec, build_adamw, build_lr_scheduler
from verl.engine.options import EngineOptions
from verl.models.precision import is_activation_checkpointing, resolve_dtype

logger = logging.getLogger(__name__)

LossFn = Callable[[nn.Module, Any], tuple[torch.Tensor, dict[str, Any]]]


class TrainEngine(ABC):
    """A module with its optimizer, scheduler and precision policy on one or more devices.

    Args:
        module: the model. The engine moves (and for distributed backends wraps) it; use
            :attr:`module` afterwards.
        optimizer_cfg: AdamW + schedule, or ``None`` for an inference-only engine (e.g. the
            reference policy): then :meth:`optimizer_step` raises.
        options: the engine arguments (:class:`~verl.engine.options.EngineOptions`: device,
            precision, clipping, the non-finite guard, offloading); ``None``: the defaults.
        overrides: :class:`~verl.engine.options.EngineOptions` fields replacing those of
            ``options`` (``grad_clip=1.0``).
    """

    def __init__(
        self,
        module: nn.Module,
        optimizer_cfg: OptimSpec | None,
        options: EngineOptions | None = None,
        **overrides: Any,
    ) -> None:
        options = EngineOptions.of(options, **overrides)
        self.options = options
        grad_clip, device = options.grad_clip, options.device
        param_dtype, autocast_dtype = options.param_dtype, options.autocast_dtype
        grad_scaling = options.grad_scaling
        max_consecutive_nonfinite = options.max_consecutive_nonfinite
        if grad_clip is not None and not grad_clip > 0:
            raise ValueError(f"grad_clip={grad_clip} must be > 0, or None to disable clipping")
        self.device = torch.device(device)
        self.param_dtype = resolve_dtype(param_dtype)
        autocast_dtype = resolve_dtype(autocast_dtype)
        self.autocast_dtype = None if autocast_dtype == torch.float32 else autocast_dtype
        if self.autocast_dtype == torch.float16 and self.param_dtype == torch.float16:
            raise ValueError(
                "autocast_dtype=float16 needs float32 master weights for loss scaling; "
                "got param_dtype=float16. Use param_dtype=None or float32"
            )
        self.grad_clip = grad_clip
        self.optim_spec = optimizer_cfg
        self.skipped_steps = 0
        self.consecutive_skipped = 0
        if max_consecutive_nonfinite < 0:
            raise ValueError(
                f"max_consecutive_nonfinite={max_consecutive_nonfinite} must be >= 0 (0 = never stop)"
            )
        self.max_consecutive_nonfinite = max_consecutive_nonfinite
        # True (a device tensor) once a micro-batch loss of this step was inf/nan; read in
        # optimizer_step together with the gradient norm, so backward never syncs.
        self._nonfinite_loss: torch.Tensor | None = None
        if grad_scaling is None:
            grad_scaling = self.autocast_dtype == torch.float16

        self.module = self._prepare_module(module)
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        self.scaler: torch.amp.GradScaler | None = None
        if optimizer_cfg is not None:
            params = [p for p in self.module.parameters() if p.requires_grad]
            if not params:
                raise ValueError("module has no parameters with requires_grad=True to optimize")
            self.optimizer = build_adamw(params, optimizer_cfg)
            self.scheduler = build_lr_scheduler(self.optimizer, optimizer_cfg)
            if grad_scaling:
                self.scaler = torch.amp.GradScaler(self.device.type)
        self.offload_params = bool(options.offload_params)
        self.offload_optimizer = bool(options.offload_optimizer) and self.optimizer is not None
        self._resident_depth = 0
        if self.offload_params or self.offload_optimizer:
            self.offload_to_cpu(self.offload_params, self.offload_optimizer)

    # Ulysses sequence parallelism (verl.kernels.ulysses): this rank's place in the
    # (data, sequence) mesh, or None (a backend with sequence parallelism sets it).
    sequence_parallel = None

    @property
    def data_parallel_size(self) -> int:
        """Data-parallel groups: ranks that compute on different rows (ranks of one sequence
        group share their rows). 1 for a one-process engine."""
        return 1

    # ---- backend hooks ---------------------------------------------------------------

    @abstractmethod
    def _prepare_module(self, module: nn.Module) -> nn.Module:
        """Place (cast, wrap) the module; return the module the engine trains."""

    def _backward_context(self, is_last_micro_batch: bool) -> contextlib.AbstractContextManager:
        """Context around one micro-batch backward (FSDP defers grad sync until the last)."""
        return contextlib.nullcontext()

    def _grad_norm(self) -> torch.Tensor:
        """Global L2 norm of all gradients (0-d tensor; a distributed backend all-reduces)."""
        grads = [p.grad for p in self._trainable_params() if p.grad is not None]
        return torch.nn.utils.get_total_norm(grads, norm_type=2.0)

    @abstractmethod
    def state_dict_for_save(self) -> dict[str, torch.Tensor]:
        """The full (unsharded) model state dict as CPU tensors, safe to keep while training."""

    def _model_optim_state(self) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The module's and the optimizer's state dicts (the optimizer's None without one)."""
        optim = None if self.optimizer is None else self.optimizer.state_dict()
        return self.module.state_dict(), optim

    def _load_model_optim_state(self, model: Any, optim: Any) -> None:
        """Restore what :meth:`_model_optim_state` returned (either may be None: skipped)."""
        if model is not None:
            self.module.load_state_dict(model, strict=True)
        if optim is not None:
            self.optimizer.load_state_dict(optim)  # moves state to each parameter's device

    # ---- state -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The engine's training state: ``model`` and ``optimizer`` (this rank's shards under
        fsdp2; ``optimizer`` None for an inference-only engine), ``scheduler`` and
        ``scaler`` (None where the engine has none) and the non-finite step counters.

        Values reference the live tensors (torch's convention): copy them to keep them
        across steps. :meth:`save_checkpoint` writes this state; :meth:`load_state_dict`
        restores it.
        """
        model, optim = self._model_optim_state()
        return {
            "model": model,
            "optimizer": optim,
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "scaler": None if self.scaler is None else self.scaler.state_dict(),
            "skipped_steps": self.skipped_steps,
            "consecutive_skipped": self.consecutive_skipped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output. A key left out is left alone (a checkpoint
        reader that loaded the weights itself passes no ``model``)."""
        parts = (("optimizer", self.optimizer), ("scheduler", self.scheduler))
        for key, part in (*parts, ("scaler", self.scaler)):
            if key in state and (state[key] is None) != (part is None):
                raise ValueError(
                    f"the engine state has {key}={state[key] is not None} but this engine has "
                    f"{key}={part is not None}; build the engine with the same optimizer_cfg / "
                    "autocast_dtype it was saved with"
                )
        self._load_model_optim_state(state.get("model"), state.get("optimizer"))
        if state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.skipped_steps = int(state.get("skipped_steps", self.skipped_steps))
        self.consecutive_skipped = int(state.get("consecutive_skipped", 0))

    @abstractmethod
    def save_checkpoint(self, path: str) -> None:
        """Write :meth:`state_dict` under directory ``path``."""

    @abstractmethod
    def load_checkpoint(self, path: str) -> None:
        """Restore the state written by :meth:`save_checkpoint`."""

    def _state_lives_on_host(self) -> bool:
        """True when offloading has nothing to move (the engine's device is the CPU)."""
        return self.device.type == "cpu"

    def offload_to_cpu(self, model: bool = True, optimizer: bool = True) -> None:
        """Move parameters/gradients and/or optimizer state to host memory (no-op when they
        already live there)."""
        if self._state_lives_on_host():
            return
        self._move(torch.device("cpu"), model, optimizer)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def load_to_device(self, model: bool = True, optimizer: bool = True) -> None:
        """Undo :meth:`offload_to_cpu`."""
        if self._state_lives_on_host():
            return
        self._move(self.device, model, optimizer)

    def _move(self, device: torch.device, model: bool, optimizer: bool) -> None:
        if model:
            # Module.to moves .data in place (and .grad), keeping Parameter identity, so the
            # optimizer stays valid; an FSDP2 module reshards first and moves its shards.
            self.module.to(device)
        if optimizer and self.optimizer is not None:
            for group in self.optimizer.param_groups:
                # Adam's "step" counter lives on the host unless the kernel is fused/capturable.
                step_on_device = group.get("fused") or group.get("capturable")
                for param in group["params"]:
                    param_state = self.optimizer.state.get(param, {})
                    for key, value in param_state.items():
                        if not isinstance(value, torch.Tensor):
                            continue
                        if key == "step" and not step_on_device and device.type != "cpu":
                            continue
                        param_state[key] = value.to(device)

    # ---- modes -----------------------------------------------------------------------

    @contextlib.contextmanager
    def resident(self, optimizer: bool = False) -> Iterator[None]:
        """The offloaded state (see ``offload_params`` / ``offload_optimizer``) on the device
        for the block; offloaded again when the outermost block ends."""
        model = self.offload_params
        optim = optimizer and self.offload_optimizer
        if not (model or optim):
            yield
            return
        self.load_to_device(model, optim)
        self._resident_depth += 1
        try:
            yield
        finally:
            self._resident_depth -= 1
            if self._resident_depth == 0:
                self.offload_to_cpu(model, optim)

    @contextlib.contextmanager
    def train_mode(self) -> Iterator[None]:
        """``module.train()`` for the block (parameters and optimizer state resident); the
        previous mode is restored after."""
        was_training = self.module.training
        self.module.train()
        try:
            with self.resident(optimizer=True):
                yield
        finally:
            self.module.train(was_training)

    @contextlib.contextmanager
    def eval_mode(self) -> Iterator[None]:
        """``module.eval()`` + ``torch.no_grad()`` + :meth:`autocast` for the block."""
        was_training = self.module.training
        self.module.eval()
        try:
            with self.resident(), torch.no_grad(), self.autocast():
                yield
        finally:
            self.module.train(was_training)

    def gathered_params(self) -> contextlib.AbstractContextManager:
        """Full, unsharded weights on :attr:`module` for the block (hybrid-engine generation).

        A no-op here: a single-process module is never sharded. Sharded backends gather once
        on entry and reshard on exit, so many forwards (decoding) run without collectives.
        """
        return _yielding(self.resident(), self.module)

    def autocast(self, cache_enabled: bool = True) -> contextlib.AbstractContextManager:
        """``torch.autocast`` in ``autocast_dtype``, or a no-op when training in float32.

        ``cache_enabled=False``: no cache of cast weights (each use casts its weight anew).
        """
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(
            device_type=self.device.type, dtype=self.autocast_dtype, cache_enabled=cache_enabled
        )

    # ---- training --------------------------------------------------------------------

    def forward_backward(
        self,
        micro_batches: Sequence[Any],
        loss_fn: LossFn,
        loss_scales: Sequence[float] | None = None,
    ) -> list[dict[str, float]]:
        """Accumulate gradients over micro-batches (no optimizer step).

        For each micro-batch ``mb_i``: ``loss_i, metrics_i = loss_fn(module, mb_i)`` runs in
        train mode under :meth:`autocast`, then ``(loss_i * loss_scales[i]).backward()``.
        The accumulated gradient is that of ``sum_i loss_scales[i] * loss_i``, so the caller
        chooses the mini-batch aggregation exactly:

        - sample mean: ``loss_i`` = mean over ``mb_i``, scale ``len(mb_i) / len(mini_batch)``;
        - token mean over the whole mini-batch: ``loss_i`` = token-mean over ``mb_i``, scale
          ``tokens_i / tokens_total`` (or ``loss_i`` = token-sum / ``tokens_total``, scale 1).

        Default scales are ``1 / len(micro_batches)`` (equal-size micro-batches).

        Gradient reduction is deferred to the last micro-batch (on fsdp2 the earlier ones
        accumulate unsharded gradients locally, see ``_backward_context``). Metrics may be
        0-dim tensors or Python numbers; the tensors of all micro-batches are read back to
        the host together, once, after the last backward.

        Returns:
            one metrics dict per micro-batch: ``loss_fn``'s metrics as Python floats, plus
            ``"loss"`` (the unscaled ``loss_i``) unless ``loss_fn`` reported one.
        """
        n = len(micro_batches)
        if n == 0:
            raise ValueError("forward_backward got no micro-batches")
        if loss_scales is None:
            loss_scales = [1.0 / n] * n
        if len(loss_scales) != n:
            raise ValueError(f"got {len(loss_scales)} loss_scales for {n} micro-batches")

        # With activation checkpointing a forward keeps only the blocks' inputs, and
        # autocast's cache of cast weights (a reduced-precision copy of every weight, alive
        # until the forward ends) would be the largest thing it holds: it is off then, each
        # weight is cast where it is used, as the recomputation in backward does anyway.
        cache_casts = not is_activation_checkpointing(self.module)
        collected: list[dict[str, Any]] = []
        with self.train_mode():
            for i, (micro_batch, scale) in enumerate(zip(micro_batches, loss_scales)):
                with self.autocast(cache_enabled=cache_casts):
                    loss, metrics = loss_fn(self.module, micro_batch)
                if not (isinstance(loss, torch.Tensor) and loss.dim() == 0):
                    raise TypeError(
                        f"loss_fn must return (scalar tensor, metrics), got loss={loss!r}"
                    )
                self.backward(loss * scale, is_last_micro_batch=i == n - 1)
                collected.append({"loss": loss.detach(), **metrics})
        return _metrics_to_host(collected)

    def backward(self, loss: torch.Tensor, is_last_micro_batch: bool = True) -> None:
        """Backward of one already-weighted micro-batch loss (applies the fp16 loss scale).

        For callers that run their own micro-batch loop instead of :meth:`forward_backward`.
        Pass ``is_last_micro_batch=False`` for all but the last micro-batch of a step so a
        distributed backend can defer its gradient reduction; ``True`` is always correct.
        """
        nonfinite = ~torch.isfinite(loss.detach())  # the next optimizer_step is skipped
        if self._nonfinite_loss is None:
            self._nonfinite_loss = nonfinite
        else:
            self._nonfinite_loss = self._nonfinite_loss | nonfinite.to(self._nonfinite_loss.device)
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        with self._backward_context(is_last_micro_batch=is_last_micro_batch):
            loss.backward()

    def optimizer_step(self) -> dict[str, float]:
        """Clip, step the optimizer (unless gradients are non-finite), step the schedule.

        Returns:
            ``{"grad_norm": pre-clip global L2 norm, "lr": the lr this step used,
            "skipped": 1.0 if the step was skipped because a micro-batch loss or the norm
            was inf/nan else 0.0, "nonfinite_loss": 1.0 if a micro-batch loss itself was
            inf/nan (the model, not only a gradient, broke) else 0.0}``, plus ``"loss_scale"`` (the scale this step used) with
            fp16 loss scaling. The schedule advances on skipped steps too, so the lr stays a
            function of the trainer's step count. Gradients are cleared afterwards.

        Raises:
            NonFiniteLossError: ``max_consecutive_nonfinite`` steps in a row were skipped.
        """
        if self.optimizer is None:
            raise RuntimeError("this engine was built with optimizer_cfg=None (inference only)")
        lr = self.lr
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        total_norm = self._grad_norm()
        # One host read for the norm and the non-finite-loss flag together.
        checks = [total_norm.detach().float().reshape(())]
        if self._nonfinite_loss is not None:
            checks.append(self._nonfinite_loss.float().to(checks[0].device))
        grad_norm, *loss_flag = torch.stack(checks).tolist()
        self._nonfinite_loss = None
        # A non-finite loss skips the step even when its gradient happens to be finite.
        finite = math.isfinite(grad_norm) and not any(loss_flag)
        scale_before = self.scaler.get_scale() if self.scaler is not None else None
        if finite:
            if self.grad_clip is not None:
                torch.nn.utils.clip_grads_with_norm_(
                    self._trainable_params(), self.grad_clip, total_norm
                )
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
            else:
                self.optimizer.step()
            self.consecutive_skipped = 0
        else:
            self.skipped_steps += 1
            self.consecutive_skipped += 1
            logger.warning(
                "non-finite loss or grad norm (%s): skipping the optimizer step "
                "(%d skipped so far, %d in a row)",
                grad_norm,
                self.skipped_steps,
                self.consecutive_skipped,
            )
        if self.scaler is not None:
            self.scaler.update()
        with warnings.catch_warnings():
            # Skipping the very first optimizer step is deliberate, not a call-order bug.
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            self.scheduler.step()
        self.zero_grad()
        out = {
            "grad_norm": grad_norm,
            "lr": lr,
            "skipped": 0.0 if finite else 1.0,
            "nonfinite_loss": 1.0 if any(loss_flag) else 0.0,
        }
        if self.scaler is not None:
            out["loss_scale"] = float(scale_before)
        limit = self.max_consecutive_nonfinite
        if limit and self.consecutive_skipped >= limit:
            raise NonFiniteLossError(
                f"{self.consecutive_skipped} optimizer steps in a row had a non-finite loss or "
                f"gradient norm (last grad norm {grad_norm}); stopping "
                f"(trainer.max_consecutive_nonfinite_steps={limit}). No checkpoint was written "
                "after the bad steps: resume from the last one with a lower learning rate, "
                "fp32/bf16 instead of fp16, or a smaller max_grad_norm"
            )
        return out

    def zero_grad(self) -> None:
        """Drop all gradients (``set_to_none``)."""
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.module.zero_grad(set_to_none=True)

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step will use."""
        if self.optimizer is None:
            return 0.0
        return float(self.optimizer.param_groups[0]["lr"])

    @property
    def global_step(self) -> int:
        """Optimizer steps taken (skipped ones included)."""
        return 0 if self.scheduler is None else int(self.scheduler.last_epoch)

    def _trainable_params(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]


@contextlib.contextmanager
def _yielding(context: contextlib.AbstractContextManager, value: Any) -> Iterator[Any]:
    """``context``, but yielding ``value``."""
    with context:
        yield value


class NonFiniteLossError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite loss or gradient norm."""


def _metrics_to_host(rows: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per-micro-batch metrics as Python floats, reading every tensor value (0-dim or one
    element) back to the host in one transfer."""
    tensors = [
        (i, key, value)
        for i, row in enumerate(rows)
        for key, value in row.items()
        if isinstance(value, torch.Tensor)
    ]
    for i, key, value in tensors:
        if value.numel() != 1:
            raise TypeError(
                f"loss_fn metric {key!r} of micro-batch {i} must be a scalar, "
                f"got a tensor of shape {tuple(value.shape)}"
            )
    out = [{k: float(v) for k, v in row.items() if not isinstance(v, torch.Tensor)} for row in rows]
    if tensors:
        device = tensors[0][2].device
        flat = torch.stack([v.detach().float().reshape(()).to(device) for _, _, v in tensors])
        for (i, key, _), number in zip(tensors, flat.tolist()):
            out[i][key] = number
    # loss_fn's own keys first (its "loss" wins over the default), then "loss"
    return [
        {**{k: o[k] for k in row if k != "loss"}, "loss": o["loss"]} for row, o in zip(rows, out)
    ]
