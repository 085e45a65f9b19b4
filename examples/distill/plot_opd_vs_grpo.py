"""Validation accuracy against steps and training time of runs (metrics.jsonl), with the
teacher's accuracy and the teacher-minus-5-points line; prints, per run, the first
validated step (and training minutes) at or above that line.

    python examples/distill/plot_opd_vs_grpo.py --teacher-acc 0.45 -o opd_vs_grpo.png \
        OPD=runs/opd/metrics.jsonl GRPO=runs/grpo/metrics.jsonl

Training time is the sum of ``timing_s/step`` up to the step (validation passes left out).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def curve(path: Path, metric: str) -> list[tuple[int, float, float]]:
    """``(step, training minutes, accuracy)`` of every validation row of ``path``."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    seconds: dict[int, float] = {}
    for row in rows:
        if "timing_s/step" in row:
            seconds[row["step"]] = row["timing_s/step"]
    points = []
    for row in rows:
        if metric in row:
            step = int(row["step"])
            elapsed = sum(s for k, s in seconds.items() if k <= step)
            points.append((step, elapsed / 60.0, float(row[metric])))
    return sorted(points)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs", nargs="+", help="LABEL=path/to/metrics.jsonl")
    parser.add_argument("--teacher-acc", type=float, required=True)
    parser.add_argument("--metric", default="val/acc")
    parser.add_argument("-o", "--out", default="opd_vs_grpo.png")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target = args.teacher_acc - 0.05
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    for spec in args.runs:
        label, path = spec.split("=", 1)
        points = curve(Path(path), args.metric)
        steps, minutes, acc = zip(*points, strict=True)
        by_step.plot(steps, acc, marker="o", label=label)
        by_time.plot(minutes, acc, marker="o", label=label)
        reached = next(((s, m) for s, m, a in points if a >= target), None)
        where = f"step {reached[0]} ({reached[1]:.1f} min)" if reached else "not reached"
        print(
            f"{label}: {args.metric} {[round(a, 3) for a in acc]} at steps {list(steps)}; "
            f"teacher - 5 points ({target:.3f}): {where}"
        )
    for ax, xlabel in ((by_step, "step"), (by_time, "training minutes (validation excluded)")):
        ax.axhline(args.teacher_acc, color="k", linestyle="--", label="teacher")
        ax.axhline(target, color="grey", linestyle=":", label="teacher - 5 points")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(args.metric)
        ax.grid(alpha=0.3)
    by_step.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
