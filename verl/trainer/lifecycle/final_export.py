"""The end-of-run export of the trained model, which never loses the run.

A run ends by writing the trained model (RL: the actor) to
``{trainer.default_local_dir}/huggingface``. With the default ``trainer.save_freq=-1`` that
export is the only thing a run leaves, so a full disk there would throw the whole training
away. :func:`export_final_model` therefore:

1. estimates the export's size (the model's parameter count, from its HF config on the
   ``meta`` device, times the bytes of its ``model.dtype``, plus a margin) and compares it
   with the free space of the checkpoint directory's file system;
2. writes the export (atomically: a failed write leaves no partial directory);
3. when either says no (too little space, or the write failed for any reason), saves the
   run's state after the last step as a checkpoint instead (unless that step is saved
   already) and raises :class:`FinalExportError` saying where it is and how to export it
   later; when the checkpoint cannot be written either, the error says that neither fits.

The errors are :class:`~verl.trainer.lifecycle.checkpoint.CheckpointError`, as a failed checkpoint
save is, and their wording names a full disk the same way
(:func:`~verl.trainer.lifecycle.checkpoint.describe_write_error`).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from verl.trainer.lifecycle.checkpoint import (
    HF_CONFIG_DIR,
    CheckpointError,
    checkpoint_name,
    describe_write_error,
)

if TYPE_CHECKING:
    from verl.trainer.lifecycle.driver import Trainee

logger = logging.getLogger(__name__)

__all__ = ["FinalExportError", "estimated_export_bytes", "export_final_model"]

# Beyond the weights: config, generation config, tokenizer files, file system overhead.
_MARGIN_BYTES = 16 << 20


class FinalExportError(CheckpointError):
    """The final export failed; the message says what was saved instead (or that nothing
    could be)."""


def estimated_export_bytes(model_cfg: Any) -> int | None:
    """Bytes the final HF export of a model section (``path``, ``dtype``,
    ``override_config``, ``trust_remote_code``) takes, estimated without loading weights:
    the parameter count of the model its config describes (built on ``meta``; tied weights
    counted once) times the element size of its ``dtype``, plus a margin. None when the
    config cannot be read (the check is then skipped)."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        from verl.models.loading import resolve_model_path
        from verl.models.precision import resolve_dtype

        path = resolve_model_path(model_cfg.path)
        trust = bool(getattr(model_cfg, "trust_remote_code", False))
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust, local_files_only=True)
        for key, value in (getattr(model_cfg, "override_config", None) or {}).items():
            setattr(config, key, value)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust)
        count = sum(p.numel() for p in model.parameters())
        dtype = resolve_dtype(model_cfg.dtype) or torch.float32
        return count * dtype.itemsize + _MARGIN_BYTES
    except Exception as err:  # an estimate only: any failure skips the check
        logger.debug("no size estimate for the final export: %s", err)
        return None


def _free_bytes(path: Path) -> int | None:
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def export_final_model(
    trainer: Trainee, root: Path, need: int | None, what: str = "the model"
) -> dict[str, str]:
    """Write ``what`` (the trained model) to ``root/huggingface`` (``trainer.save_hf``);
    returns ``{"hf_dir": path}``. ``need``: the export's estimated bytes (None: not
    checked).

    Raises:
        FinalExportError: the export did not fit or failed; the run's state after the last
            step was saved as a checkpoint instead (named in the message), or could not be
            saved either (the message says so).
    """
    root = Path(root)
    out = root / HF_CONFIG_DIR
    free = _free_bytes(root)
    cause: BaseException | None = None
    if need is not None and free is not None and free < need:
        problem = (
            f"the disk is full: the export needs about {need / 2**20:.1f} MiB and "
            f"{free / 2**20:.1f} MiB are free under {root} (checked before writing)"
        )
    else:
        try:
            return {"hf_dir": str(trainer.save_hf(out))}
        except Exception as err:
            cause = err
            problem = describe_write_error(
                err, root, fix="free space or point trainer.default_local_dir elsewhere"
            )
    step = trainer.global_step
    logger.error("the final export to %s after step %d failed: %s", out, step, problem)
    last = trainer.last_checkpoint
    if last is not None and Path(last).name == checkpoint_name(step) and Path(last).is_dir():
        saved, how = Path(last), "is saved in the checkpoint"
    else:
        logger.warning("saving a checkpoint of step %d instead of the final export", step)
        try:
            saved, how = trainer.save_checkpoint(), "was saved as the checkpoint"
        except CheckpointError as err:
            raise FinalExportError(
                f"the final export of {what} to {out} failed: {problem}; and saving the "
                f"run's state after step {step} as a checkpoint instead failed too: {err}. "
                f"Neither fits: the state after step {step} is lost"
            ) from (cause or err)
    raise FinalExportError(
        f"the final export of {what} to {out} failed: {problem}. The run's state after "
        f"step {step} {how} {saved}: free space, then export it with `verl export "
        f"--checkpoint {saved} --out {out}` (or resume from it)"
    ) from cause
