"""``verl plot RUN_DIR [RUN_DIR ...] [-o out.png]``: runs' metrics as one PNG.

Reads each run's ``metrics.jsonl`` (the ``trainer.log_dir`` of a run with the ``jsonl``
logger) and draws reward, validation accuracy, KL, entropy, response length, grad norm
and step time against the step, several runs overlaid (:mod:`verl.trainer.lifecycle.plot`).
"""

from __future__ import annotations

import argparse
import logging
import sys


def build_parser(prog: str = "verl plot") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Plot reward, validation accuracy, KL, entropy, response length, grad norm "
        "and step time against the step from runs' metrics.jsonl (runs trained with "
        "'trainer.logger=[console,jsonl]'); several runs are overlaid, one colour each. "
        "Metrics no run logged are left out with a note. Needs matplotlib: "
        "pip install 'verl[plot]'.",
    )
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="a run's trainer.log_dir (holding metrics.jsonl), or a metrics.jsonl file",
    )
    parser.add_argument(
        "-o",
        "--out",
        metavar="PNG",
        help="output file (default: RUN_DIR/metrics.png for one run, runs.png for several)",
    )
    parser.add_argument("--title", help="figure title (default: the runs' names)")
    return parser


def main(argv: list[str] | None = None, prog: str = "verl plot") -> int:
    """Write the PNG and print its path; 2 for a bad run directory or missing matplotlib."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser(prog).parse_args(sys.argv[1:] if argv is None else argv)
    from pathlib import Path

    from verl.trainer.lifecycle.plot import metrics_file, plot_runs

    try:
        out = args.out
        if out is None:
            out = metrics_file(args.runs[0]).with_name("metrics.png")
            out = out if len(args.runs) == 1 else Path("runs.png")
        path, notes = plot_runs(args.runs, out, title=args.title)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"not in the log: {note}", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m verl.cli.plot"))
