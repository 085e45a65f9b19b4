"""``verl eval``: accuracy per data source, mean@n and pass@k.

    verl eval --model runs/.../huggingface --data data/arith/test.parquet   # greedy accuracy
    verl eval --model DIR --data FILE --n 8 --k 1 4 8                        # sampled pass@k
    verl eval --generations gens.parquet                                     # a generations file

With ``--model`` / ``--data`` the responses are generated as ``verl generate`` does; with
``--generations`` they are read from a file (``verl generate``'s, or any file with one row
per prompt holding ``data_source`` and a ``responses`` list; rows without ``scores`` /
``accs`` are scored by their data source's scorer against ``ground_truth``). The metrics:
:mod:`verl.trainer.rl.evaluation`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from verl.cli._rollout_args import add_rollout_args, load_rollout_config


def build_parser(prog: str = "verl eval") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Evaluate a model on a prompt dataset (--model/--data: generate, then "
        "score) or a generations file (--generations): per data source and overall, the "
        "number of prompts, acc/mean@n (mean accuracy of the n responses), score/mean@n and "
        "pass@k (unbiased, from the n responses, k <= n). Greedy when --n 1 (unless --sample), "
        "sampled otherwise. See docs/cli.md.",
    )
    parser.add_argument(
        "--generations",
        metavar="FILE",
        help="evaluate this generations file (.parquet or .jsonl) instead of generating",
    )
    parser.add_argument(
        "--k",
        type=int,
        nargs="+",
        help="the k of pass@k (each <= n; default 1, 2, 4, ... up to n, and n)",
    )
    parser.add_argument("--json", metavar="FILE", help="also write the metrics as JSON here")
    add_rollout_args(parser, data_required=False)
    return parser


def main(argv: list[str] | None = None, prog: str = "verl eval") -> int:
    """Print the metrics table; exit code 0, 2 for bad arguments, config or data (an
    unwritable ``--json`` included, found before any generation), 1 when writing it fails."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser(prog)
    args = parser.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    if (args.generations is None) == (args.data is None):
        parser.error("give either --data (with --model) or --generations, not both or neither")
    if args.json:
        from verl.utils.writable import OutputPathError, check_output_file

        try:  # before any generation: a bad path found afterwards loses the work
            check_output_file(args.json, "--json")
        except OutputPathError as exc:
            parser.error(str(exc))
    from verl.config import ConfigError
    from verl.data import DatasetValidationError
    from verl.trainer.rl.evaluation import evaluate_rows, format_report

    try:
        cfg = load_rollout_config(args, parser)
        if args.generations is not None:
            from verl.trainer.rl.build import load_compute_score
            from verl.trainer.rl.evaluation import read_generations, score_rows

            rows = score_rows(read_generations(args.generations), load_compute_score(cfg))
        else:
            missing = [f for f in args.data if not Path(f).is_file()]
            if missing:
                parser.error(f"--data {missing[0]!r}: no such file")
            from verl.trainer.rl.generation import generate_rows

            rows = generate_rows(cfg, args.data, batch_size=args.batch_size, limit=args.limit)
        report = evaluate_rows(rows, args.k)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    except (DatasetValidationError, ValueError, FileNotFoundError, KeyError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    print(format_report(report))
    if args.json:
        from verl.utils.atomic_io import write_text_atomic

        try:  # temporary file renamed into place: a full disk leaves no half-written file
            write_text_atomic(args.json, json.dumps(report, indent=2) + "\n")
        except OSError as exc:
            print(
                f"{prog}: error: cannot write --json {args.json!r}: {exc.strerror or exc}; "
                "the metrics above were not saved (the file, if any, is unchanged)",
                file=sys.stderr,
            )
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m verl.cli.evaluate"))
