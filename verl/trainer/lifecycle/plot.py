"""Plot runs: the metrics a run wrote to ``metrics.jsonl`` against the step, as one PNG.

``plot_runs([run_dir, ...], out)`` draws one panel per metric of :data:`PANELS` (reward,
validation accuracy, KL, entropy, response length, grad norm, step time), each run a line
of its own colour in every panel. A metric no run logged is left out with a note; a run
directory without ``metrics.jsonl`` is an error naming it. Uses matplotlib's Agg canvas
directly (no pyplot, no display, no global state); matplotlib is the optional extra
``verl[plot]``. ``verl plot`` is the command-line face of this module.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

# (panel title, metric keys in order of preference: a panel draws the first one a run has)
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("critic/score/mean",)),
    ("validation accuracy", ("val/acc",)),
    ("KL", ("actor/kl_loss", "actor/reward_kl_penalty", "actor/approx_kl")),
    ("entropy", ("actor/entropy",)),
    ("response length", ("response_length/mean",)),
    ("grad norm", ("actor/grad_norm",)),
    ("step time (s)", ("timing_s/step",)),
)
COLUMNS = 4
PANEL_IN = (4.0, 4.0)  # inches per panel: a full figure is 16 x 8 in
DPI = 100  # so the PNG is 400 px per panel: 1600 x 800 with every panel


@dataclass
class Run:
    """One run's metrics: ``series[key]`` is ``{step: value}`` (the last row of a step wins)."""

    label: str
    path: Path
    series: dict[str, dict[int, float]] = field(default_factory=dict)
    skipped_lines: int = 0

    def points(self, key: str) -> tuple[list[int], list[float]]:
        values = self.series.get(key, {})
        steps = sorted(values)
        return steps, [values[s] for s in steps]


def metrics_file(run: str | os.PathLike[str]) -> Path:
    """The ``metrics.jsonl`` of ``run`` (a run directory, i.e. ``trainer.log_dir``, or the
    file itself); raises ``FileNotFoundError`` naming ``run`` when there is none."""
    path = Path(run)
    if path.is_file():
        return path
    if not path.exists():
        raise FileNotFoundError(f"run directory {str(run)!r} does not exist")
    candidate = path / "metrics.jsonl"
    if not candidate.is_file():
        raise FileNotFoundError(
            f"{str(run)!r} has no metrics.jsonl: give the run's trainer.log_dir, and train "
            "with 'trainer.logger=[console,jsonl]' so that the metrics are written"
        )
    return candidate


def read_run(run: str | os.PathLike[str], label: str | None = None) -> Run:
    """Read a run's ``metrics.jsonl``: numeric values per key and step. Lines that are not
    JSON objects with an integer ``step`` (a row cut short by a kill) are counted and skipped."""
    path = metrics_file(run)
    out = Run(label=label or _default_label(path), path=path)
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            step = int(row["step"])
        except (ValueError, KeyError, TypeError):
            out.skipped_lines += 1
            continue
        for key, value in row.items():
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if key != "step" and number and math.isfinite(value):
                out.series.setdefault(key, {})[step] = float(value)
    if out.skipped_lines:
        logger.warning("%s: skipped %d unreadable line(s)", path, out.skipped_lines)
    return out


def _default_label(path: Path) -> str:
    return path.parent.name if path.name == "metrics.jsonl" else path.stem


def _labels(paths: Sequence[Path]) -> list[str]:
    """Short distinct names: the run directory's name, with its parent's when two clash."""
    names = [_default_label(p) for p in paths]
    if len(set(names)) == len(names):
        return names
    return [
        f"{p.parent.parent.name}/{n}" if names.count(n) > 1 else n for p, n in zip(paths, names)
    ]


def plot_runs(
    runs: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    title: str | None = None,
) -> tuple[Path, list[str]]:
    """Draw ``runs`` (run directories or ``metrics.jsonl`` files) overlaid into the PNG
    ``out`` (1600 x 800 px with all seven panels; 400 px high per row of four panels,
    the last slot holding the legend and notes). Returns the path written and the notes on what was left out.

    Raises ``ValueError`` when no run has any metric of :data:`PANELS`, ``ImportError``
    naming ``verl[plot]`` when matplotlib is missing.
    """
    if not runs:
        raise ValueError("no run to plot: give at least one run directory")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "plotting needs matplotlib: pip install 'verl[plot]' or pip install matplotlib"
        ) from exc
    paths = [metrics_file(r) for r in runs]
    loaded = [read_run(p, label) for p, label in zip(paths, _labels(paths))]

    notes: list[str] = []
    panels: list[tuple[str, list[tuple[Run, str]]]] = []
    for panel_title, keys in PANELS:
        lines = []
        for run in loaded:
            key = next((k for k in keys if run.series.get(k)), None)
            if key is not None:
                lines.append((run, key))
        if not lines:
            notes.append(f"{panel_title} ({' / '.join(keys)})")
        else:
            panels.append((panel_title, lines))
    if not panels:
        raise ValueError(
            f"nothing to plot: none of {[k for _, keys in PANELS for k in keys]} is in "
            + ", ".join(str(p) for p in paths)
        )

    from matplotlib.ticker import MaxNLocator

    rows = math.ceil((len(panels) + 1) / COLUMNS)  # one slot more: the legend and notes
    fig = Figure(figsize=(PANEL_IN[0] * COLUMNS, PANEL_IN[1] * rows), dpi=DPI)
    FigureCanvasAgg(fig)
    colours = {id(run): f"C{i % 10}" for i, run in enumerate(loaded)}
    for i, (panel_title, lines) in enumerate(panels):
        ax = fig.add_subplot(rows, COLUMNS, i + 1)
        used = list(dict.fromkeys(key for _, key in lines))
        # pad: room for a scale factor (1e-7) above the axis; no offset (+6.57) notation
        ax.set_title(f"{panel_title} ({', '.join(used)})", fontsize=10, pad=14)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.set_xlabel("step", fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=8)
        ax.grid(True, alpha=0.3)
        for run, key in lines:
            steps, values = run.points(key)
            few = len(steps) <= 20  # validation points and short runs: show each point
            ax.plot(steps, values, color=colours[id(run)], marker="o" if few else None, ms=3)
    _legend(fig.add_subplot(rows, COLUMNS, len(panels) + 1), loaded, colours, notes)
    fig.suptitle(title or "  vs  ".join(r.label for r in loaded), fontsize=12)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    for note in notes:
        logger.info("plot: %s", note)
    return out, notes


def _legend(ax, runs: Sequence[Run], colours: dict[int, str], notes: Sequence[str]) -> None:
    """The free panel: one coloured line per run, then the notes."""
    ax.axis("off")
    for run in runs:
        label = run.label if len(run.label) <= 40 else run.label[:19] + "..." + run.label[-18:]
        ax.plot([], [], color=colours[id(run)], label=label)
    ax.legend(loc="upper left", fontsize=8, frameon=False)
    if notes:
        text = "not in the log:\n" + "\n".join(notes)
        ax.text(0.0, 0.55, text, fontsize=8, va="top", transform=ax.transAxes)


def plot_after_run(jsonl_path: Path | None) -> Path | None:
    """The end-of-run plot: ``metrics.png`` beside the run's ``metrics.jsonl``. Returns its
    path, or None (with an info line) when the run wrote no jsonl or matplotlib is missing."""
    if jsonl_path is None or not Path(jsonl_path).is_file():
        return None
    try:
        path, _ = plot_runs([jsonl_path], Path(jsonl_path).with_name("metrics.png"))
    except ImportError:
        logger.info("no metrics.png: pip install 'verl[plot]' to plot the run")
        return None
    except ValueError as exc:
        logger.info("no metrics.png: %s", exc)
        return None
    return path
