"""LoRA adapters through ``peft``: wrap a causal LM, and turn its weights back into plain ones.

``actor_rollout_ref.model.lora_rank > 0`` (or ``model.lora_rank`` of SFT/DPO) trains low-rank
adapters instead of the whole model: :func:`apply_lora` wraps the loaded model in a
``peft.PeftModel`` whose only trainable parameters are the adapters' ``lora_A`` / ``lora_B``.
The base weights stay frozen and shared, which is what makes LoRA cheap here:

- the reference policy is the same module with its adapters disabled
  (``PeftModel.disable_adapter()``), so no second copy of the weights is loaded;
- the optimizer holds Adam moments for the adapters only.

A ``PeftModel``'s state dict names the base weights ``base_model.model.<name>.base_layer
.weight`` and the adapters ``...<name>.lora_A.default.weight``.
:func:`merged_state_dict` folds the adapters into the base weights
(``W + (alpha / r) * B @ A``) under the plain HF names, for export and for engines that
take whole weights; :func:`adapter_state_dict` keeps only the adapters, in the layout
``PeftModel.from_pretrained`` reads.

The critic (``critic.model.lora_rank > 0``) is a value model, not a causal LM:
:func:`apply_lora_to_value_model` injects the adapters into its transformer body in place
(names ``model.<name>.base_layer.weight``, ``model.<name>.lora_A.default.weight``, no
``PeftModel`` wrapper) and leaves the scalar value head fully trainable, since it starts
from a random initialisation. :func:`merged_state_dict` folds those adapters the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "ADAPTER_CONFIG",
    "LORA_ADAPTER_DIR",
    "LoraSpec",
    "adapter_scaling",
    "adapter_state_dict",
    "apply_lora",
    "apply_lora_to_value_model",
    "is_lora_model",
    "lora_config_of",
    "lora_scaling",
    "lora_spec_from_config",
    "merged_state_dict",
    "write_adapter",
]

ADAPTER_CONFIG = "adapter_config.json"
# the subdirectory of an exported model that holds the adapters alone
LORA_ADAPTER_DIR = "lora_adapter"
_PREFIX = "base_model.model."
_ADAPTER = "default"


class LoraSpec:
    """What :func:`apply_lora` needs: rank, alpha, dropout, target and excluded modules."""

    def __init__(
        self,
        rank: int,
        alpha: float = 16.0,
        dropout: float = 0.0,
        target_modules: str | Sequence[str] = "all-linear",
        exclude_modules: Sequence[str] | None = None,
    ) -> None:
        if rank < 1:
            raise ValueError(f"lora_rank must be >= 1 to apply LoRA, got {rank}")
        self.rank, self.alpha, self.dropout = int(rank), float(alpha), float(dropout)
        targets = [target_modules] if isinstance(target_modules, str) else list(target_modules)
        if not targets:
            raise ValueError("LoRA target_modules is empty: name modules, or all-linear")
        # peft spells "every linear layer but the output head" as the bare string
        self.target_modules: str | list[str] = (
            "all-linear" if targets == ["all-linear"] else targets
        )
        self.exclude_modules = list(exclude_modules) if exclude_modules else None


def lora_spec_from_config(model_cfg: Any) -> LoraSpec | None:
    """The :class:`LoraSpec` of a ``model`` config section, or None when ``lora_rank`` is 0."""
    if not getattr(model_cfg, "lora_rank", 0):
        return None
    return LoraSpec(
        model_cfg.lora_rank,
        model_cfg.lora_alpha,
        model_cfg.lora_dropout,
        model_cfg.target_modules,
        model_cfg.exclude_modules,
    )


def _peft() -> Any:
    try:
        import peft
    except ImportError as exc:  # pragma: no cover - peft is a dependency
        raise ImportError("LoRA (model.lora_rank > 0) needs peft: pip install peft") from exc
    return peft


@contextlib.contextmanager
def _seeded(seed: int | None) -> Iterator[None]:
    """Draw from torch's generators seeded with ``seed`` (untouched afterwards); nothing
    changes when ``seed`` is None."""
    if seed is None:
        yield
        return
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if cuda else []):
        torch.manual_seed(seed)
        yield


def apply_lora(module: torch.nn.Module, spec: LoraSpec, seed: int | None = None) -> torch.nn.Module:
    """Wrap ``module`` in a ``PeftModel`` with fresh adapters; only the adapters train.

    ``lora_B`` starts at zero (peft's default), so the wrapped model computes exactly what
    ``module`` did until the first update. ``seed`` draws ``lora_A`` from a generator of its
    own: every rank of a sharded run (whose global generators are seeded per rank) then
    starts from the adapters one process would.
    """
    peft = _peft()
    try:
        with _seeded(seed):
            wrapped = peft.get_peft_model(module, _lora_config(spec, task_type="CAUSAL_LM"))
    except ValueError as exc:
        raise _no_match(spec, module, exc) from exc
    return wrapped


def apply_lora_to_value_model(
    module: torch.nn.Module, spec: LoraSpec, seed: int | None = None
) -> torch.nn.Module:
    """Inject fresh adapters into a value model's body (``module.model``), in place.

    Only the adapters of the body and the whole value head (``module.value_head``) train
    afterwards. ``lora_B`` starts at zero, so the values are unchanged until the first
    update. ``seed`` as for :func:`apply_lora`. Returns ``module``.
    """
    inject_lora(module.model, spec, seed)
    module.value_head.requires_grad_(True)
    return module


def inject_lora(body: torch.nn.Module, spec: LoraSpec, seed: int | None = None) -> None:
    """Inject fresh adapters into ``body`` in place (a value or reward model's transformer,
    whose head the caller leaves trainable); ``seed`` as for :func:`apply_lora`."""
    peft = _peft()
    try:
        with _seeded(seed):
            peft.inject_adapter_in_model(_lora_config(spec, task_type=None), body)
    except ValueError as exc:
        raise _no_match(spec, body, exc) from exc


def _lora_config(spec: LoraSpec, task_type: str | None) -> Any:
    return _peft().LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=spec.target_modules,
        exclude_modules=spec.exclude_modules,
        bias="none",
        task_type=task_type,
    )


def _no_match(spec: LoraSpec, module: torch.nn.Module, exc: Exception) -> ValueError:
    return ValueError(
        f"LoRA: target_modules={spec.target_modules!r} "
        f"(exclude_modules={spec.exclude_modules!r}) matched no layer of "
        f"{type(module).__name__}: {exc}"
    )


def lora_config_of(module: torch.nn.Module) -> Any:
    """The peft ``LoraConfig`` of a module LoRA was applied to: a ``PeftModel`` (the actor)
    or a value model whose body holds injected adapters (the critic)."""
    for holder in (module, getattr(module, "model", None)):
        config = getattr(holder, "peft_config", None)
        if config and _ADAPTER in config:
            return config[_ADAPTER]
    raise ValueError(f"{type(module).__name__} has no LoRA adapters (no peft_config)")


def is_lora_model(module: torch.nn.Module) -> bool:
    """Whether ``module`` (possibly wrapped by FSDP2) is a ``PeftModel`` with adapters."""
    return any(".lora_A." in name for name, _ in module.named_parameters())


_LORA_KEY = re.compile(r"^(?P<layer>.+)\.lora_(?P<ab>[AB])\.(?P<adapter>[^.]+)\.weight$")


def merged_state_dict(state: Mapping[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A ``PeftModel`` state dict as the base model's, adapters folded into the weights.

    ``W = W_base + scaling * (B @ A)`` for every adapted layer (computed in fp32, stored in
    the base weight's dtype); names lose the ``base_model.model.`` prefix and the
    ``.base_layer`` step. A state dict without adapters comes back with its names only
    unprefixed.
    """
    adapters: dict[str, dict[str, torch.Tensor]] = {}
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        match = _LORA_KEY.match(key)
        if match is not None:
            adapters.setdefault(match["layer"], {})[match["ab"]] = value
            continue
        out[key.removeprefix(_PREFIX).replace(".base_layer.", ".")] = value
    for layer, ab in adapters.items():
        if set(ab) != {"A", "B"}:
            raise ValueError(f"LoRA layer {layer}: has lora_{''.join(ab)} without its pair")
        name = layer.removeprefix(_PREFIX) + ".weight"
        if name not in out:
            raise ValueError(f"LoRA layer {layer}: no base weight {name} in the state dict")
        base = out[name]
        delta = ab["B"].float() @ ab["A"].float()
        out[name] = (base.float() + scaling * delta).to(base.dtype)
    return out


def adapter_state_dict(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters of a ``PeftModel`` state dict, named as ``adapter_model.safetensors``
    stores them (``...lora_A.weight``, without the adapter name)."""
    out = {}
    for key, value in state.items():
        match = _LORA_KEY.match(key)
        if match is not None:
            out[f"{match['layer']}.lora_{match['ab']}.weight"] = value.contiguous()
    if not out:
        raise ValueError("the state dict holds no LoRA adapter weights")
    return out


def write_adapter(
    module: torch.nn.Module, state: Mapping[str, torch.Tensor], out_dir: str | os.PathLike[str]
) -> Path:
    """Write the adapters of ``state`` and ``module``'s LoRA config to ``out_dir`` as
    ``adapter_model.safetensors`` + ``adapter_config.json`` (what
    ``PeftModel.from_pretrained(base, out_dir)`` loads)."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(adapter_state_dict(state), out / "adapter_model.safetensors", {"format": "pt"})
    peft_config = getattr(module, "peft_config", None)
    if not peft_config:
        raise ValueError(f"{type(module).__name__} is not a PeftModel: no LoRA config to write")
    peft_config[_ADAPTER].save_pretrained(str(out))
    return out


def lora_scaling(source: torch.nn.Module | Mapping[str, Any]) -> float:
    """``lora_alpha / r``: the factor of ``B @ A`` in the layers' output, and so in
    :func:`merged_state_dict`. ``source``: a module LoRA was applied to (see
    :func:`lora_config_of`; also FSDP2-wrapped) or the mapping of an ``adapter_config.json``."""
    if isinstance(source, Mapping):
        alpha, rank = source["lora_alpha"], source["r"]
    else:
        config = lora_config_of(source)
        alpha, rank = config.lora_alpha, config.r
    return float(alpha) / float(rank)


def adapter_scaling(config_dir: str | os.PathLike[str]) -> float | None:
    """:func:`lora_scaling` of the ``adapter_config.json`` in ``config_dir`` (or in its
    ``lora_adapter/``, where a HF export keeps the adapters), if there is one."""
    for path in (
        Path(config_dir) / ADAPTER_CONFIG,
        Path(config_dir) / LORA_ADAPTER_DIR / ADAPTER_CONFIG,
    ):
        if path.is_file():
            return lora_scaling(json.loads(path.read_text()))
    return None
