"""Export a run checkpoint to a HuggingFace model directory.

    python -m verl.model_merger --checkpoint checkpoints/verl/default/global_step_100 --out hf/
    python -m verl.model_merger --checkpoint .../global_step_100 --out hf_critic/ --role critic
    python -m verl.model_merger merge --backend fsdp --local_dir .../global_step_100/actor \
        --target_dir hf/                      # upstream verl's command: ``verl merge``'s flags

``--checkpoint`` is a complete ``global_step_N`` directory written by the RL trainer (see
``verl/trainer/lifecycle/checkpoint.py``). The weights are read from the role's engine checkpoint in
whichever form it has: the single-process engine's ``model.safetensors``, or the FSDP2
engine's sharded ``torch.distributed.checkpoint`` (any number of ranks), which is merged in
this one process without a process group (``verl.engine.dcp_io.read_dcp_tensors``); the
optimizer state is never read. The model is built from the HF config the checkpoint stores
(on the ``meta`` device, so no time is spent on a random initialisation), filled with the
weights and written with ``save_pretrained`` (safetensors) plus the tokenizer files, into a
temporary sibling directory renamed to ``--out`` when complete.

The actor becomes an ``AutoModelForCausalLM`` directory. The critic (``--role critic``)
becomes what ``CausalLMWithValueHead.from_pretrained`` reads: its body as an ``AutoModel``
directory plus ``value_head.safetensors``. Weights keep the dtype they were trained in
(fp32 master weights unless the model itself was loaded in another dtype). A LoRA actor
(its checkpoint's HF directory holds ``adapter_config.json``) is exported with the adapters
folded into the weights: a plain model, loadable without peft; beside it,
``lora_adapter/`` holds the adapters alone (peft's ``adapter_config.json`` and
``adapter_model.safetensors``, what ``PeftModel.from_pretrained(base, out/lora_adapter)``
loads onto the base model), as the run's final export does. A LoRA critic is exported
merged only: its adapters sit in a value model's body, which peft cannot load onto a base.

Before anything is read, every file of the checkpoint is compared with the size and CRC-32
its manifest recorded (the check resume makes, :func:`verl.trainer.lifecycle.checkpoint.read_manifest`):
a damaged file is named and nothing is written. A manifest without the CRC-32 of each file
is refused unless ``--allow-missing-checksums`` (files without one are then checked by size
alone).

The output (:func:`check_output`) never overlaps a run: ``--out`` may not be, contain or lie
inside a checkpoint (``global_step_N``, a directory holding ``checkpoint.json``, the
checkpoint exported) or a run directory (one holding ``global_step_*``,
``latest_checkpointed_iteration.txt`` or ``.verl-run.lock``); inside a run directory it may
be a new folder of another name than those and ``huggingface`` (the run's final export).
Upstream's habit of merging into ``global_step_N/actor/huggingface`` is refused: that
folder is part of the checkpoint (its files are in the manifest, and retention deletes it
with the checkpoint); the message suggests a folder beside the run instead.
``--overwrite`` replaces only a previous export: a directory of files (and at most a
``lora_adapter/`` folder of files) holding the :data:`EXPORT_MARKER` every export writes,
or (exports written before the marker) ``config.json`` and ``*.safetensors``.

The output location is created before the weights are read (an unwritable one fails
first), the free space is compared with the weights' size, and everything is written into
a temporary sibling renamed into place at the end, so a full disk or any error leaves no
half-written export and the previous one untouched.

Exit codes: 0 written, 2 bad input (missing / incomplete / damaged checkpoint, unsafe or
existing output), 1 the export could not be written (disk full, permissions).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from verl.config.roles import ROLES as ROLE_SPECS
from verl.config.roles import TRAINABLE_ROLES
from verl.models.lora import (
    ADAPTER_CONFIG,
    LORA_ADAPTER_DIR,
    adapter_scaling,
    adapter_state_dict,
    merged_state_dict,
)
from verl.trainer.lifecycle.checkpoint import (
    HF_CONFIG_DIR,
    LATEST_FILE,
    MANIFEST_FILE,
    CheckpointError,
    ChecksumsMissing,
    describe_write_error,
    read_manifest,
)
from verl.trainer.lifecycle.run_lock import LOCK_FILE
from verl.utils.atomic_io import replace_dir_atomically

logger = logging.getLogger(__name__)

__all__ = [
    "EXPORT_MARKER",
    "ExportWriteError",
    "UnsafeOutput",
    "check_output",
    "load_role_state_dict",
    "main",
    "merge_checkpoint",
    "suggested_output",
]

# role -> the worker group whose checkpoint directory holds it (verl.config.roles)
ROLES = {role: ROLE_SPECS[role].group for role in TRAINABLE_ROLES}
# Files of the stored HF directory that save_pretrained writes itself.
_MODEL_FILES = {"config.json", "generation_config.json", ADAPTER_CONFIG}


def _is_model_file(name: str) -> bool:
    """Written by the export itself: configs, and weights (a checkpoint saved with
    ``save_contents`` ``hf_model`` keeps the model's own beside the tokenizer)."""
    return name in _MODEL_FILES or name.endswith((".safetensors", ".bin", ".index.json"))


EXIT_BAD_INPUT = 2
EXIT_WRITE_FAILED = 1
# Written into every export (last): what --overwrite recognises as a previous export.
EXPORT_MARKER = ".verl-export.json"
_CHECKPOINT_NAME = re.compile(r"^\.?global_step_\d+")  # also .tmp- / .damaged- / .deleting-
# Names a run writes in its directory (besides global_step_*): never an export's output.
_RUN_NAMES = frozenset({LATEST_FILE, LOCK_FILE, HF_CONFIG_DIR})
# Room left beside an export's estimated size (configs, tokenizer, file system overhead).
_SPACE_MARGIN = 16 << 20


class UnsafeOutput(ValueError):
    """The export's output would replace or overlap a checkpoint, a run, or something that
    is not a previous export."""


class ExportWriteError(RuntimeError):
    """The export could not be written (disk full, no permission); nothing was left."""


def _checkpoint_reason(path: Path) -> str | None:
    """Why ``path`` is a checkpoint directory, or None."""
    if (path / MANIFEST_FILE).is_file():
        return f"it holds {MANIFEST_FILE}"
    if _CHECKPOINT_NAME.match(path.name) and path.is_dir():
        return "it is named like a checkpoint"
    return None


def _run_reason(path: Path) -> str | None:
    """Why ``path`` is a run directory (what it holds), or None."""
    held = [name for name in (LATEST_FILE, LOCK_FILE) if (path / name).exists()]
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if _CHECKPOINT_NAME.match(entry.name) and entry.is_dir(follow_symlinks=False):
                    held.append(entry.name)
                    break
    except OSError:
        pass
    return f"it holds {', '.join(held)}" if held else None


def _only_files(path: Path) -> bool:
    with os.scandir(path) as entries:
        return all(entry.is_file(follow_symlinks=False) for entry in entries)


def _is_previous_export(path: Path) -> bool:
    """A directory of regular files (and at most a ``lora_adapter/`` folder of regular
    files, a LoRA export's) with the export marker, or (older exports) with
    ``config.json`` and ``*.safetensors``."""
    names = []
    for entry in os.scandir(path):
        if entry.name == LORA_ADAPTER_DIR and entry.is_dir(follow_symlinks=False):
            if not _only_files(Path(entry.path)):
                return False
            continue
        if not entry.is_file(follow_symlinks=False):
            return False
        names.append(entry.name)
    if EXPORT_MARKER in names:
        return True
    return "config.json" in names and any(n.endswith(".safetensors") for n in names)


def check_output(
    out: str | os.PathLike[str], checkpoint: str | os.PathLike[str], overwrite: bool
) -> None:
    """Refuse an output that would overlap a checkpoint or a run, or replace anything but
    a previous export (the rules in the module docstring).

    Raises:
        UnsafeOutput: naming the path and why.
        FileExistsError: ``out`` is a non-empty previous export and ``overwrite`` is False.
    """
    out, checkpoint = Path(out), Path(checkpoint)
    real_out, real_ckpt = out.resolve(), checkpoint.resolve()
    keep = (
        "choose an output directory outside the checkpoint and run directories, e.g. "
        f"--out {suggested_output(checkpoint)}"
    )
    owned = (
        f"a checkpoint's files (its {HF_CONFIG_DIR}/ folder too) belong to it, and retention "
        "deletes it whole"
    )
    if real_out == real_ckpt or real_out.is_relative_to(real_ckpt):
        where = "is" if real_out == real_ckpt else "is inside"
        raise UnsafeOutput(
            f"--out {out} {where} the checkpoint {checkpoint} being exported: {owned}; {keep}"
        )
    if real_ckpt.is_relative_to(real_out):
        raise UnsafeOutput(
            f"--out {out} contains the checkpoint {checkpoint} being exported: writing the "
            f"export there would delete it; {keep}"
        )
    for above in [real_out, *real_out.parents]:
        why = _checkpoint_reason(above) if above.is_dir() else None
        if why is not None:
            what = "is" if above == real_out else "is inside"
            raise UnsafeOutput(
                f"--out {out} {what} the checkpoint {above} ({why}): {owned}; {keep}"
            )
    why = _run_reason(real_out) if real_out.is_dir() else None
    if why is not None:
        raise UnsafeOutput(
            f"--out {out} is a run directory ({why}); replacing it would delete the run's "
            f"checkpoints; {keep}"
        )
    for run in real_out.parents:
        why = _run_reason(run)
        if why is None:
            continue
        first = real_out.relative_to(run).parts[0]
        if first in _RUN_NAMES or _CHECKPOINT_NAME.match(first):
            raise UnsafeOutput(
                f"--out {out} is {run / first}, which the run in {run} writes ({why}); "
                f"write the export to another folder"
            )
    if real_out.exists() and not real_out.is_dir():
        raise UnsafeOutput(f"--out {out} exists and is not a directory")
    if real_out.is_dir() and any(real_out.iterdir()):
        previous = _is_previous_export(real_out)
        if not overwrite:
            hint = (
                "pass --overwrite to replace it"
                if previous
                else "it is not a previous export, which is all --overwrite replaces; "
                "choose another --out"
            )
            raise FileExistsError(f"{out} exists and is not empty; {hint}")
        if not previous:
            raise UnsafeOutput(
                f"--out {out} is not empty and is not a previous export (no {EXPORT_MARKER}, "
                "or it holds folders or links): --overwrite replaces only an export "
                "directory; remove it yourself or choose another --out"
            )


def suggested_output(checkpoint: str | os.PathLike[str]) -> Path:
    """A fresh export location beside the run that holds ``checkpoint`` (outside it):
    ``<runs>/<run>_<global_step_N>_hf``, or a numbered variant when that exists."""
    ckpt = Path(os.path.abspath(checkpoint))
    run = ckpt.parent
    base = run.parent / f"{run.name or 'run'}_{ckpt.name}_hf"
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}{n}")
    return candidate


@contextmanager
def _export_dir(out: Path) -> Iterator[Path]:
    """The temporary sibling the export is written into (created first: an unwritable
    location fails before any weight is read), published as ``out`` when the block ends;
    a failed write is an :class:`ExportWriteError` and leaves nothing behind."""
    fix = "free space or choose another --out"
    try:
        with replace_dir_atomically(out) as tmp:
            yield tmp
    except (CheckpointError, UnsafeOutput, ExportWriteError):
        raise
    except Exception as err:
        from safetensors import SafetensorError

        if not isinstance(err, OSError | SafetensorError):
            raise
        parent = out.parent if out.parent.exists() else Path(os.path.abspath(os.sep))
        raise ExportWriteError(
            f"writing the export to {out} failed: {describe_write_error(err, parent, fix)}; "
            f"nothing was left at {out} (a previous export there is untouched)"
        ) from err


def _check_space(
    tmp: Path, state: dict[str, torch.Tensor], hf_dir: Path, *more: dict[str, torch.Tensor]
) -> None:
    seen, need = set(), _SPACE_MARGIN
    for tensor in [t for part in (state, *more) for t in part.values()]:
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.shape)
        if key not in seen:
            seen.add(key)
            need += tensor.numel() * tensor.element_size()
    need += sum(p.stat().st_size for p in hf_dir.iterdir() if p.is_file())
    free = shutil.disk_usage(tmp).free
    if free < need:
        raise ExportWriteError(
            f"not enough space to export to {tmp.parent}: the export needs about "
            f"{need / 2**20:.1f} MiB and {free / 2**20:.1f} MiB are free; free space or "
            "choose another --out (nothing was written)"
        )


def load_role_state_dict(role_dir: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The full (unsharded) model state dict of a role directory in a checkpoint.

    Reads ``model.safetensors`` (single engine) or the ``model_optim/`` DCP shards (fsdp2
    engine, any number of ranks). Keys are the module's parameter names
    (``model.layers.0...``, ``lm_head.weight``); a tied weight may appear under one name.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from verl.engine.dcp_io import read_dcp_tensors
    from verl.engine.fsdp import DCP_DIR
    from verl.engine.single import MODEL_FILE

    role_dir = Path(role_dir)
    if (role_dir / MODEL_FILE).is_file():
        try:
            return load_file(role_dir / MODEL_FILE)
        except (SafetensorError, OSError) as err:
            raise CheckpointError(
                f"{role_dir / MODEL_FILE} is not a readable safetensors file (truncated or "
                f"damaged?): {err}"
            ) from err
    if (role_dir / DCP_DIR).is_dir():
        return read_dcp_tensors(str(role_dir / DCP_DIR), "model")
    raise CheckpointError(
        f"{role_dir} holds no engine checkpoint (neither {MODEL_FILE} nor {DCP_DIR}/)"
    )


def _float_dtype(state: dict[str, torch.Tensor]) -> torch.dtype:
    for tensor in state.values():
        if tensor.is_floating_point():
            return tensor.dtype
    return torch.float32


def _fill(module: torch.nn.Module, state: dict[str, torch.Tensor], what: str) -> None:
    """Copy ``state`` into ``module`` (materialised from ``meta``), exactly.

    A key may be absent only when it is tied to one that is present (the single engine
    stores a shared tensor once).
    """
    result = module.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise CheckpointError(
            f"{what}: the checkpoint has weights the stored config's model does not: "
            f"{result.unexpected_keys[:5]}"
        )
    own = module.state_dict()
    loaded = {own[key].data_ptr() for key in state}
    untied = [key for key in result.missing_keys if own[key].data_ptr() not in loaded]
    if untied:
        raise CheckpointError(f"{what}: the checkpoint lacks weights {untied[:5]}")


def _build_actor(hf_dir: Path, state: dict[str, torch.Tensor], trust_remote_code: bool):
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(hf_dir, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=_float_dtype(state), trust_remote_code=trust_remote_code
        )
    model.to_empty(device="cpu")
    model.tie_weights()
    _fill(model, state, "actor")
    if (hf_dir / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(hf_dir)
    return model


def _write_critic(
    hf_dir: Path, state: dict[str, torch.Tensor], out: Path, trust_remote_code: bool
) -> None:
    from transformers import AutoConfig, AutoModel

    from verl.models.value_model import save_value_head, split_critic_state

    body_state, head_state = split_critic_state(state)
    if not head_state:
        raise CheckpointError("critic: the checkpoint has no value_head.* weights")
    config = AutoConfig.from_pretrained(hf_dir, trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        body = AutoModel.from_config(
            config, dtype=_float_dtype(body_state), trust_remote_code=trust_remote_code
        )
    body.to_empty(device="cpu")
    _fill(body, body_state, "critic body")
    body.save_pretrained(out, safe_serialization=True)
    save_value_head(head_state, out)


def _write_adapter(hf_dir: Path, adapters: dict[str, torch.Tensor], out: Path) -> None:
    """The LoRA adapters alone, as peft saves them: ``adapter_model.safetensors`` (keys
    ``base_model.model.<layer>.lora_A.weight``) and the checkpoint's own
    ``adapter_config.json`` (its rank, alpha and target modules)."""
    from safetensors.torch import save_file

    for config in (hf_dir / ADAPTER_CONFIG, hf_dir / LORA_ADAPTER_DIR / ADAPTER_CONFIG):
        if config.is_file():
            break
    else:  # adapter_scaling found one of the two
        raise CheckpointError(f"{hf_dir} has no {ADAPTER_CONFIG}")
    out.mkdir()
    shutil.copy2(config, out / ADAPTER_CONFIG)
    save_file(adapters, out / "adapter_model.safetensors", {"format": "pt"})


def merge_checkpoint(
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    role: str = "actor",
    *,
    overwrite: bool = False,
    trust_remote_code: bool = False,
    allow_missing_checksums: bool = False,
) -> Path:
    """Write ``role``'s weights in ``checkpoint`` as a HF model directory at ``out``.

    Args:
        allow_missing_checksums: export a checkpoint whose manifest lacks files' CRC-32
            (they are checked by size only); refused otherwise.

    Raises:
        CheckpointError: the checkpoint is missing, incomplete, damaged (a file's size or
            CRC-32 differs from its manifest), lacks checksums or lacks the role.
        UnsafeOutput: ``out`` overlaps a checkpoint or run, or is not a previous export.
        FileExistsError: ``out`` is a previous export and ``overwrite`` is False.
        ExportWriteError: writing failed (full disk, permissions); nothing was left.
    """
    if role not in ROLES:
        raise ValueError(f"role={role!r}: choose one of {sorted(ROLES)}")
    checkpoint, out = Path(checkpoint), Path(out)
    read_manifest(checkpoint)  # a clear error for a missing / incomplete directory first
    check_output(out, checkpoint, overwrite)
    try:
        manifest = read_manifest(
            checkpoint, verify=True, require_checksums=not allow_missing_checksums
        )
    except ChecksumsMissing as err:
        raise ChecksumsMissing(
            f"{err}; pass --allow-missing-checksums to export it with sizes checked only"
        ) from err
    saved_role = manifest["roles"].get(ROLES[role])
    if saved_role is None:
        raise CheckpointError(
            f"checkpoint {checkpoint} has no {role} (roles saved: "
            f"{', '.join(sorted(manifest['roles']))})"
        )
    role_dir = checkpoint / saved_role["dir"]
    hf_dir = role_dir / HF_CONFIG_DIR
    if not (hf_dir / "config.json").is_file():
        raise CheckpointError(
            f"{hf_dir} has no config.json: the {role} of this checkpoint is not a HF model, "
            "so it cannot be exported"
        )

    with _export_dir(out) as tmp:
        state = load_role_state_dict(role_dir)
        scaling = adapter_scaling(hf_dir)
        adapters: dict[str, torch.Tensor] = {}
        if scaling is not None:  # LoRA: the adapters folded into the base weights
            if role == "actor":
                adapters = adapter_state_dict(state)
            state = merged_state_dict(state, scaling)
        _check_space(tmp, state, hf_dir, adapters)
        if role == "actor":
            model = _build_actor(hf_dir, state, trust_remote_code)
            model.save_pretrained(tmp, safe_serialization=True)
            if adapters:
                _write_adapter(hf_dir, adapters, tmp / LORA_ADAPTER_DIR)
        else:
            _write_critic(hf_dir, state, tmp, trust_remote_code)
        for item in hf_dir.iterdir():  # tokenizer files, chat template
            if item.is_file() and not _is_model_file(item.name):
                shutil.copy2(item, tmp / item.name)
        marker = {
            "exported_by": "verl export",
            "checkpoint": str(checkpoint.resolve()),
            "global_step": manifest["global_step"],
            "role": role,
        }
        (tmp / EXPORT_MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    logger.info(
        "exported the %s of %s (step %s, saved by %d rank(s), %s) to %s",
        role,
        checkpoint,
        manifest["global_step"],
        saved_role["world_size"],
        saved_role["strategy"],
        out,
    )
    return out


def build_parser(prog: str = "python -m verl.model_merger") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Export a verl checkpoint (global_step_N directory) to a HuggingFace "
        "model directory. See docs/checkpoints.md.",
    )
    parser.add_argument("--checkpoint", required=True, metavar="DIR", help="global_step_N dir")
    parser.add_argument("--out", required=True, metavar="HFDIR", help="output model directory")
    parser.add_argument("--role", choices=sorted(ROLES), default="actor", help="default: actor")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a previous export at --out"
    )
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="allow model code shipped with it"
    )
    parser.add_argument(
        "--allow-missing-checksums",
        action="store_true",
        help="export a checkpoint whose manifest lacks CRC-32 checksums (sizes checked only)",
    )
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Command-line entry; returns the exit code. (Upstream verl's command line,
    ``python -m verl.model_merger merge ...``, is read by ``verl merge``,
    :mod:`verl.cli.merge`, which translates it to these flags.)"""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = (build_parser() if prog is None else build_parser(prog)).parse_args(argv)
    try:
        out = merge_checkpoint(
            args.checkpoint,
            args.out,
            args.role,
            overwrite=args.overwrite,
            trust_remote_code=args.trust_remote_code,
            allow_missing_checksums=args.allow_missing_checksums,
        )
    except (CheckpointError, FileExistsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ExportWriteError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_WRITE_FAILED
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
