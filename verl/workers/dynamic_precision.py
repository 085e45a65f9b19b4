"""Dynamic precision: inference-only roles drop to fp8 weights while memory is short.

With ``trainer.dynamic_precision=true`` the reference policy and the reward model check the
free memory of their device before each inference phase (reference log-probs, reward
scoring). Below ``trainer.dynamic_precision_min_free_gb`` the role's linear layers are
quantized in place to weight-only fp8 (:mod:`verl.models.fp8`), which frees about 3/4 of
their fp32 bytes (1/2 of bf16) at once. Once free memory is back above the threshold
*plus* what the full-precision weights need, the original weights are restored, so the
role does not flip back and forth at the boundary. Every switch is logged (WARNING) and
counted (:attr:`DynamicPrecision.switches`).

Where the original weights come from when restoring: the role's checkpoint on disk
(``reload``: the reference is the initial policy, the reward model is frozen), so while in
fp8 they occupy no memory at all, on a GPU or a CPU. A role built from a module passed in
memory (tests, the Python API) has no path; its weights are then kept as a host copy, which
saves device memory on a GPU but nothing on a CPU.

Free memory: ``torch.cuda.mem_get_info`` on CUDA, ``MemAvailable`` of ``/proc/meminfo``
(``psutil`` elsewhere) on the CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from verl.models.fp8 import Fp8Linear, is_fp8_model, quantize_model_fp8_

logger = logging.getLogger(__name__)

__all__ = ["DynamicPrecision", "free_memory_bytes"]

GiB = 1024**3


def free_memory_bytes(device: torch.device) -> int:
    """Bytes the process could still allocate on ``device`` (see the module docstring)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil

    return int(psutil.virtual_memory().available)


class DynamicPrecision:
    """Switches one inference role's module between its precision and fp8 (see module doc).

    Args:
        role: ``"reference"`` or ``"reward"`` (for the log lines).
        module: the role's frozen module; its layers are replaced in place.
        min_free_gb: the threshold.
        reload: returns the original state dict (``None``: a host copy is taken now).
        probe: free memory in bytes of ``device`` (tests inject a fake one).
    """

    def __init__(
        self,
        role: str,
        module: nn.Module,
        device: torch.device,
        min_free_gb: float,
        reload: Callable[[], dict[str, torch.Tensor]] | None = None,
        probe: Callable[[torch.device], int] = free_memory_bytes,
    ) -> None:
        if is_fp8_model(module):
            raise ValueError(
                f"{role}: dynamic_precision needs a role whose precision is not fp8 already "
                "(it switches to fp8 only under memory pressure)"
            )
        self.role, self.module, self.device = role, module, device
        self.min_free_bytes = int(min_free_gb * GiB)
        self.probe = probe
        if reload is None:
            host = {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
            reload = lambda: host  # noqa: E731 - the copy lives in this closure
        self.reload = reload
        self.switches = 0

    @property
    def in_fp8(self) -> bool:
        return is_fp8_model(self.module)

    def before_phase(self) -> None:
        """Check free memory and switch if needed; call right before the role computes."""
        free = self.probe(self.device)
        if not self.in_fp8 and free < self.min_free_bytes:
            quantize_model_fp8_(self.module)
            self._switched("fp8", free)
        elif self.in_fp8 and free >= self.min_free_bytes + self._restore_bytes():
            self._restore()
            self._switched("its own precision", free)

    def _switched(self, to: str, free: int) -> None:
        self.switches += 1
        logger.warning(
            "dynamic_precision: %s switched to %s (%.2f GiB free on %s, threshold %.2f GiB)",
            self.role,
            to,
            free / GiB,
            self.device,
            self.min_free_bytes / GiB,
        )

    def _fp8_layers(self) -> list[tuple[str, Fp8Linear]]:
        return [(n, m) for n, m in self.module.named_modules() if isinstance(m, Fp8Linear)]

    def _restore_bytes(self) -> int:
        """Extra bytes the full-precision linear weights take over their fp8 form."""
        total = 0
        for _, layer in self._fp8_layers():
            width = torch.empty((), dtype=layer.orig_dtype).element_size()
            total += layer.qweight.numel() * (width - 1)
        return total

    def _restore(self) -> None:
        state = self.reload()
        for name, layer in self._fp8_layers():
            parent_name, _, leaf = name.rpartition(".")
            parent = self.module.get_submodule(parent_name) if parent_name else self.module
            linear = nn.Linear(
                layer.in_features,
                layer.out_features,
                bias=layer.bias is not None,
                device=layer.qweight.device,
                dtype=layer.orig_dtype,
            )
            with torch.no_grad():
                linear.weight.copy_(state[f"{name}.weight"])
                if layer.bias is not None:
                    linear.bias.copy_(state[f"{name}.bias"])
            setattr(parent, leaf, linear.requires_grad_(False))
