"""Export a run checkpoint to a HuggingFace model directory.

    python -m verl.model_merger --checkpoint checkpoints/verl/default/global_step_100 --out hf/
    python -m verl.model_merger --checkpoint .../global_step_100 --out hf_critic/ --role critic
    python -m verl.model_merger merge --backend fsdp --local_dir .../global_step_100/actor \
        --target_dir hf/                      # upstream verl's command: ``verl merge``'s flags

``--checkpoint`` is a complete ``global_step_N`` directory written by the RL trainer (see
``verl/trainer/checkpoint.py``). The weights are read from the role's engine checkpoint in
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
folded into the weights: a plain model, loadable without peft.

Exit codes: 0 written, 2 bad input (missing / incomplete checkpoint, existing output).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from pathlib import Path

import torch

from verl.config.roles import ROLES as ROLE_SPECS
from verl.config.roles import TRAINABLE_ROLES
from verl.models.lora import ADAPTER_CONFIG, adapter_scaling, merged_state_dict
from verl.trainer.checkpoint import HF_CONFIG_DIR, CheckpointError, read_manifest
from verl.utils.atomic_io import replace_dir_atomically

logger = logging.getLogger(__name__)

__all__ = ["load_role_state_dict", "main", "merge_checkpoint"]

# role -> the worker group whose checkpoint directory holds it (verl.config.roles)
ROLES = {role: ROLE_SPECS[role].group for role in TRAINABLE_ROLES}
# Files of the stored HF directory that save_pretrained writes itself.
_MODEL_FILES = {"config.json", "generation_config.json", ADAPTER_CONFIG}


def _is_model_file(name: str) -> bool:
    """Written by the export itself: configs, and weights (a checkpoint saved with
    ``save_contents`` ``hf_model`` keeps the model's own beside the tokenizer)."""
    return name in _MODEL_FILES or name.endswith((".safetensors", ".bin", ".index.json"))


EXIT_BAD_INPUT = 2


def load_role_state_dict(role_dir: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The full (unsharded) model state dict of a role directory in a checkpoint.

    Reads ``model.safetensors`` (single engine) or the ``model_optim/`` DCP shards (fsdp2
    engine, any number of ranks). Keys are the module's parameter names
    (``model.layers.0...``, ``lm_head.weight``); a tied weight may appear under one name.
    """
    from safetensors.torch import load_file

    from verl.engine.dcp_io import read_dcp_tensors
    from verl.engine.fsdp import DCP_DIR
    from verl.engine.single import MODEL_FILE

    role_dir = Path(role_dir)
    if (role_dir / MODEL_FILE).is_file():
        return load_file(role_dir / MODEL_FILE)
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


def merge_checkpoint(
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    role: str = "actor",
    *,
    overwrite: bool = False,
    trust_remote_code: bool = False,
) -> Path:
    """Write ``role``'s weights in ``checkpoint`` as a HF model directory at ``out``.

    Raises:
        CheckpointError: the checkpoint is missing, incomplete, or lacks the role.
        FileExistsError: ``out`` exists and is not empty, and ``overwrite`` is False.
    """
    if role not in ROLES:
        raise ValueError(f"role={role!r}: choose one of {sorted(ROLES)}")
    checkpoint, out = Path(checkpoint), Path(out)
    manifest = read_manifest(checkpoint)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out} exists and is not empty; pass --overwrite to replace it")
    if out.resolve().is_relative_to(checkpoint.resolve()):
        raise ValueError(f"--out {out} must not be inside the checkpoint {checkpoint}")
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

    state = load_role_state_dict(role_dir)
    scaling = adapter_scaling(hf_dir)
    if scaling is not None:  # a LoRA actor: the adapters folded into the base weights
        state = merged_state_dict(state, scaling)
    with replace_dir_atomically(out) as tmp:
        if role == "actor":
            model = _build_actor(hf_dir, state, trust_remote_code)
            model.save_pretrained(tmp, safe_serialization=True)
        else:
            _write_critic(hf_dir, state, tmp, trust_remote_code)
        for item in hf_dir.iterdir():  # tokenizer files, chat template
            if item.is_file() and not _is_model_file(item.name):
                shutil.copy2(item, tmp / item.name)
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
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="allow model code shipped with it"
    )
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Command-line entry; returns the exit code. ``merge ...`` (upstream verl's command
    line) is read by ``verl merge`` (:mod:`verl.cli.merge`), which calls back here."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["merge"]:
        from verl.cli.merge import main as merge_main

        return merge_main(argv, prog=prog or "python -m verl.model_merger")
    args = (build_parser() if prog is None else build_parser(prog)).parse_args(argv)
    try:
        out = merge_checkpoint(
            args.checkpoint,
            args.out,
            args.role,
            overwrite=args.overwrite,
            trust_remote_code=args.trust_remote_code,
        )
    except (CheckpointError, FileExistsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
