"""``verl merge``: ``verl export`` under upstream verl's name, taking its flags too.

Upstream verl merges a checkpoint with
``python -m verl.model_merger merge --backend fsdp --local_dir CKPT/actor --target_dir OUT``.
Here the same line works as ``verl merge --backend fsdp --local_dir CKPT/actor --target_dir
OUT``: ``--local_dir`` is the ``global_step_N`` directory or its ``actor`` / ``critic``
subdirectory (which then also picks ``--role``), ``--target_dir`` the output directory,
and ``--backend`` is accepted for ``fsdp`` (this project's checkpoints are read whatever
engine wrote them). ``verl export``'s own flags (``--checkpoint``, ``--out``, ``--role``,
``--overwrite``, ``--trust-remote-code``, ``--allow-missing-checksums``) work as well.

The output follows ``verl export``'s rules (:func:`verl.cli.export.check_output`): upstream's
habit of writing into ``global_step_N/actor/huggingface`` is refused (that folder is part of
the checkpoint: its files are in the manifest and retention deletes it with the checkpoint),
as is any output that is, contains or lies in a checkpoint or a run's own folders, and
``--overwrite`` replaces only a previous export; the refusal names why and suggests a
folder beside the run. A LoRA actor is written merged, with the adapters alone in
``<target_dir>/lora_adapter/`` (what upstream's merger writes, loadable with peft).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from verl.cli import export as model_merger
from verl.trainer.lifecycle.checkpoint import MANIFEST_FILE

ROLE_DIRS = ("actor", "critic")


def build_parser(prog: str = "verl merge") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Write a checkpoint (global_step_N directory) as a HuggingFace model "
        "directory: verl export with upstream verl's flags. See docs/checkpoints.md.",
    )
    parser.add_argument(
        "action",
        nargs="?",
        choices=["merge"],
        help="upstream's `model_merger merge` subcommand word; optional",
    )
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--local_dir", "--local-dir", metavar="DIR", help="global_step_N[/actor]")
    src.add_argument("--checkpoint", metavar="DIR", help="global_step_N directory")
    out = parser.add_mutually_exclusive_group(required=True)
    out.add_argument("--target_dir", "--target-dir", metavar="HFDIR", help="output directory")
    out.add_argument("--out", metavar="HFDIR", help="output directory")
    parser.add_argument(
        "--backend", choices=["fsdp"], default="fsdp", help="upstream's checkpoint kind: fsdp"
    )
    parser.add_argument("--role", choices=ROLE_DIRS, help="default: actor, or --local_dir's")
    parser.add_argument("--overwrite", action="store_true", help="replace a previous export")
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="allow model code shipped with it"
    )
    parser.add_argument(
        "--allow-missing-checksums",
        action="store_true",
        help="export a checkpoint whose manifest lacks CRC-32 checksums (sizes checked only)",
    )
    return parser


def main(argv: list[str] | None = None, prog: str = "verl merge") -> int:
    """Translate the arguments to ``verl export``'s and run it; returns its exit code."""
    args = build_parser(prog).parse_args(sys.argv[1:] if argv is None else argv)
    checkpoint = Path(args.local_dir or args.checkpoint)
    role = args.role
    if checkpoint.name in ROLE_DIRS and (checkpoint.parent / MANIFEST_FILE).exists():
        role = role or checkpoint.name  # upstream points at global_step_N/actor
        checkpoint = checkpoint.parent
    forwarded = ["--checkpoint", str(checkpoint), "--out", args.target_dir or args.out]
    forwarded += ["--role", role or "actor"]
    forwarded += ["--overwrite"] * args.overwrite + ["--trust-remote-code"] * args.trust_remote_code
    forwarded += ["--allow-missing-checksums"] * args.allow_missing_checksums
    return model_merger.main(forwarded, prog=prog)


if __name__ == "__main__":
    sys.exit(main(prog="python -m verl.cli.merge"))
