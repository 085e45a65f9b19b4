"""``verl generate``: offline rollouts of a model on a prompt dataset, to parquet.

    verl generate --model runs/.../huggingface --data data/arith/test.parquet \\
        --n 8 --temperature 1.0 --out gens.parquet

One row per prompt with its ``n`` responses, their log-probs and scores (the columns:
:mod:`verl.trainer.rl.generation`). Sampling goes through the configured rollout backend and
scoring through the validation reward manager, as in training; ``verl eval
--generations gens.parquet`` turns the file into accuracy and pass@k.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from verl.cli._rollout_args import add_rollout_args, load_rollout_config

OUT_SUFFIXES = (".parquet", ".jsonl")


def build_parser(prog: str = "verl generate") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Sample --n responses for every prompt of --data with --model through the "
        "rollout backend, score them with the reward scorers (or "
        "custom_reward_function), and write one row per prompt: data_source, prompt, "
        "prompt_text, ground_truth, responses, response_lengths, response_log_probs (sum "
        "over the response's tokens), response_token_log_probs, scores, accs. "
        "Greedy when --n 1 (unless --sample), sampled otherwise. See docs/cli.md.",
    )
    parser.add_argument(
        "-o", "--out", required=True, metavar="FILE", help="output file, .parquet or .jsonl"
    )
    add_rollout_args(parser)
    return parser


def main(argv: list[str] | None = None, prog: str = "verl generate") -> int:
    """Write the generations; exit code 0, 2 for bad arguments, config or data (an
    unwritable ``--out`` included, found before the model loads), 1 when the write fails."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser(prog)
    args = parser.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    if not args.out.endswith(OUT_SUFFIXES):
        parser.error(f"--out {args.out!r}: must end with .parquet or .jsonl")
    from verl.utils.writable import OutputPathError, check_output_file

    try:  # before the model loads: a bad path found after generating loses the work
        check_output_file(args.out, "--out")
    except OutputPathError as exc:
        parser.error(str(exc))
    missing = [f for f in args.data if not Path(f).is_file()]
    if missing:
        parser.error(f"--data {missing[0]!r}: no such file")
    from verl.config import ConfigError

    try:
        cfg = load_rollout_config(args, parser)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    from verl.data import DatasetValidationError, write_records
    from verl.trainer.rl.generation import generate_rows

    try:
        rows = generate_rows(cfg, args.data, batch_size=args.batch_size, limit=args.limit)
    except (DatasetValidationError, ValueError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    try:
        path = write_records(rows, args.out)
    except OSError as exc:  # e.g. the disk filled up: the write is atomic, nothing is left
        print(
            f"{prog}: error: cannot write --out {args.out!r}: {exc.strerror or exc}; "
            "nothing was written (the file, if any, is unchanged)",
            file=sys.stderr,
        )
        return 1
    samples = sum(len(row["responses"]) for row in rows)
    print(
        f"wrote {len(rows)} prompts x {cfg.actor_rollout_ref.rollout.n} = {samples} responses "
        f"to {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m verl.cli.generate"))
