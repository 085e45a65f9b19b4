"""Benchmark: time to accuracy, verl against TRL's ``GRPOTrainer``, on the main job's task.

Both sides train the task ``bash scripts/run.sh`` trains (the preset
``examples/grpo_smollm2_arithmetic.yaml``: SmolLM2-135M-Instruct, verl's built-in one- and
two-digit ``+ - *`` problems) for the same wall-clock budget on the same machine, one after
the other (never at the same time), and the greedy accuracy of each side's policy on the same
held-out problems is read at fixed marks of training time. The table says how many minutes
each side needs to gain +10 and +20 points over the start, and its accuracy at the budget;
one PNG draws accuracy against training time for both.

What is shared, read from the preset (with ``--verl-override`` applied): the model (the
embedded SmolLM2, ``verl.models.embedded``), the prompts (the preset's built-in data,
generated once by ``verl.data.write_arithmetic_dataset`` into ``train.jsonl`` and
``test.jsonl``; both sides read the training prompts in the file's order, which is random),
the reward (verl's arithmetic scorer: verl's side by data source, TRL's side the same file
executed by path, ``_arithmetic_scorer.py``), prompts per step, group size
(``rollout.n``), learning rate (constant on both sides), temperature, response length, and
no KL term. Everything else is each side's recommended fast setting: verl the preset's (DAPO
dynamic sampling, precision ``auto``, its micro-batches); TRL 1.16 its defaults
on CPU, as ``bench_vs_trl.py --settings defaults`` (``bf16=True``, gradient checkpointing,
micro-batch 8 with accumulation to one optimizer step per generated batch, ``loss_type
="dapo"``, clip 0.2, no weight decay). ``--trl-arg KEY=VALUE`` sets other ``GRPOConfig`` keys.

The clock (``_budget_clock.py``): each side counts training time from its first step (the
process start, imports, model load and trainer construction are reported as ``setup s``,
outside the budget) and stops at the first step end at or past ``--budget-min``. At the first
step end past each mark (``--marks``, minutes of training time) it saves its policy as a
HuggingFace directory with the clock paused, so a snapshot costs no training time; the
time recorded for a snapshot is its training time, not the mark.

The accuracy: every snapshot, and the initial model once (it is both sides' start), is
evaluated after the side's run, in a process of its own, by one evaluator: verl's own
validation (``trainer.val_only=true`` under the preset: greedy decoding, the preset's
response length, the arithmetic scorer) of the snapshot's weights with the initial model's
config and tokenizer files. One evaluator for both sides means a difference in accuracy
comes from the weights alone, not from two generation codes (HF ``generate`` and verl's
rollout run different kernels, and a greedy answer can turn on a rounding difference), and
the evaluation's time counts against neither budget.

The minutes to +10 / +20 points are read on the curve through (0, start) and the
snapshots, linearly between the last point below the threshold and the first at or above
it; "-" when the budget ends first. The accuracy at the budget is read on the same curve at
the budget; the last snapshot (taken at the first step end past the budget, so a side with
longer steps trains a little longer) is shown beside it with its time. ``--repeats R`` runs
R pairs, the side that goes first alternating.

    python bench/bench_convergence_vs_trl.py                          # 10 min per side
    python bench/bench_convergence_vs_trl.py --threads 1              # on a shared machine
    python bench/bench_convergence_vs_trl.py --budget-min 20 --marks 2 4 6 8 10 15 20
    python bench/bench_convergence_vs_trl.py --quick --threads 1      # 1 min per side
    python bench/bench_convergence_vs_trl.py --from-json run.json     # table and plot again

``--quick`` proves the path end to end in a few minutes: the quick preset
(``examples/grpo_smollm2_arithmetic_quick.yaml``: one-digit ``+ *``, 8 prompts x 4, 8
tokens, 64 held-out problems), 1 minute per side, marks at 0.5 and 1 minute.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from _common import MiB, run_tree_measured
from bench_vs_trl import (
    DEFAULT_TRL_VENV,
    _side_env,
    ensure_trl_venv,
    machine_record,
    model_dir,
)

logger = logging.getLogger("bench.convergence_vs_trl")

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
DEFAULT_CONFIG = REPO / "examples" / "grpo_smollm2_arithmetic.yaml"
QUICK_CONFIG = REPO / "examples" / "grpo_smollm2_arithmetic_quick.yaml"
VERL_SIDE = BENCH_DIR / "_verl_convergence_side.py"
TRL_SIDE = BENCH_DIR / "_trl_convergence_side.py"
SIDES = ("verl", "trl")
GAINS = (10.0, 20.0)  # points over the start
DEFAULT_BUDGET_MIN = 10.0
DEFAULT_MARK_COUNT = 10  # marks evenly spaced over the budget, unless --marks
QUICK_BUDGET_MIN = 1.0
QUICK_MARKS = (0.5, 1.0)
# files of a model directory that are its weights; every other file of the initial model
# (config, generation config, tokenizer, chat template) is copied into each snapshot
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json")
NOT_COPIED = ("verl_embedded.json",)


# --------------------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--budget-min",
        type=float,
        default=None,
        help=f"training minutes per side (default {DEFAULT_BUDGET_MIN:g}; --quick "
        f"{QUICK_BUDGET_MIN:g})",
    )
    parser.add_argument(
        "--marks",
        type=float,
        nargs="+",
        default=None,
        help="training minutes at which the policy is evaluated (default: "
        f"{DEFAULT_MARK_COUNT} evenly spaced up to the budget; the budget is always one)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="pairs of runs (alternating)")
    parser.add_argument("--quick", action="store_true", help="quick preset, 1 min per side")
    parser.add_argument("--config", type=Path, default=None, help="the preset (default: main job)")
    parser.add_argument("--trl-venv", type=Path, default=DEFAULT_TRL_VENV)
    parser.add_argument("--verl-python", default=sys.executable, help="python that runs verl")
    parser.add_argument("--workdir", type=Path, default=None, help="keep data, logs, runs here")
    parser.add_argument(
        "--json-out",
        type=Path,
        default=None,
        help="write the JSON here (default: WORKDIR/convergence.json)",
    )
    parser.add_argument("--plot", type=Path, default=None, help="PNG path (default: in workdir)")
    parser.add_argument(
        "--from-json", type=Path, default=None, help="table and plot of a saved run, then exit"
    )
    parser.add_argument("--keep-snapshots", action="store_true", help="keep the snapshots' weights")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="OMP_NUM_THREADS for both sides (default: unset; use 1 on a shared machine)",
    )
    parser.add_argument(
        "--verl-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra override of the preset (repeatable); shared keys (lr, n, ...) follow it",
    )
    parser.add_argument(
        "--trl-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra GRPOConfig key for TRL's side, value as JSON (repeatable)",
    )
    args = parser.parse_args(argv)
    for flag, items in (("--verl-override", args.verl_override), ("--trl-arg", args.trl_arg)):
        for item in items:
            if "=" not in item or item.startswith("="):
                parser.error(f"{flag} {item!r}: expected KEY=VALUE")
    if args.repeats < 1:
        parser.error(f"--repeats={args.repeats}: need at least one pair of runs")
    if args.config is None:
        args.config = QUICK_CONFIG if args.quick else DEFAULT_CONFIG
    if args.budget_min is None:
        args.budget_min = QUICK_BUDGET_MIN if args.quick else DEFAULT_BUDGET_MIN
    if args.budget_min <= 0:
        parser.error(f"--budget-min={args.budget_min}: the budget must be positive")
    if args.marks is None and args.quick and args.budget_min == QUICK_BUDGET_MIN:
        args.marks = list(QUICK_MARKS)
    try:
        args.marks = mark_minutes(args.budget_min, args.marks)
    except ValueError as err:
        parser.error(str(err))
    return args


def mark_minutes(budget_min: float, marks: list[float] | None) -> list[float]:
    """The evaluation marks (minutes of training time): ``marks`` checked (ascending, each in
    ``(0, budget]``) with the budget added when missing, or by default
    ``DEFAULT_MARK_COUNT`` evenly spaced marks ending at the budget."""
    if marks is None:
        step = budget_min / DEFAULT_MARK_COUNT
        return [round(step * (i + 1), 6) for i in range(DEFAULT_MARK_COUNT)]
    marks = [float(m) for m in marks]
    if any(b <= a for a, b in itertools.pairwise(marks)):
        raise ValueError(f"--marks {marks}: marks must be strictly ascending")
    if marks and (marks[0] <= 0 or marks[-1] > budget_min):
        raise ValueError(f"--marks {marks}: each mark must lie in (0, --budget-min {budget_min:g}]")
    if not marks or marks[-1] < budget_min:
        marks.append(float(budget_min))
    return marks


def run_plan(repeats: int) -> list[tuple[int, str]]:
    """``(repeat, side)`` in run order: one run per side and repeat, never two at once; the
    side that goes first alternates from one pair to the next, so neither side always runs
    first on a cold (or last on a warm) machine."""
    plan = []
    for r in range(repeats):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            plan.append((r, side))
    return plan


# --------------------------------------------------------------------------- the task


def task_spec(cfg) -> dict:
    """The keys both sides share, from the preset's validated config. Raises ``ValueError``
    when the preset is not a task this benchmark can run on TRL's side the same way."""
    arc, d = cfg.actor_rollout_ref, cfg.data
    problems = []
    if d.builtin != "arithmetic" or list(d.train_files):
        problems.append("its data is not the built-in arithmetic task (data.builtin=arithmetic)")
    if arc.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:
        problems.append("it has a KL term (set use_kl_loss / use_kl_in_reward false)")
    optim = arc.actor.optim
    if optim.warmup_style != "constant" or optim.lr_warmup_steps > 0 or optim.lr_warmup_steps_ratio:
        problems.append(
            "its learning rate is not constant (a wall-clock budget has no step count for a "
            "warmup or decay: set warmup_style=constant, no warmup)"
        )
    if problems:
        raise ValueError(f"preset cannot be compared with TRL: {'; '.join(problems)}")
    return {
        "prompts": d.train_batch_size,
        "n": arc.rollout.n,
        "max_new_tokens": d.max_response_length,
        "temperature": arc.rollout.temperature,
        "lr": optim.lr,
        "seed": cfg.trainer.seed,
        "train_size": d.arithmetic.train_size,
        "val_size": d.arithmetic.val_size,
    }


def write_task_data(cfg, out_dir: Path) -> tuple[Path, Path]:
    """The preset's built-in train and validation rows as jsonl (the very rows the preset's
    run generates for itself: the same generator, arguments and seed)."""
    from verl.data import write_arithmetic_dataset

    d, a = cfg.data, cfg.data.arithmetic
    if not a.val_size:
        raise ValueError("the preset has no held-out problems (data.arithmetic.val_size=0)")
    train, val = write_arithmetic_dataset(
        out_dir,
        train_size=a.train_size,
        val_size=a.val_size,
        digits=a.digit_range,
        ops=list(a.ops),
        seed=d.seed,
        fmt="jsonl",
        balance_digits=a.balance_digits,
        negative=a.negative,
        phrasings=list(a.phrasings),
    )
    return Path(train), Path(val)


def verl_data_overrides(train: Path, val: Path, model: str) -> list[str]:
    """The overrides both verl processes (training and evaluation) add to the preset."""
    return [
        f"data.train_files=[{train}]",
        f"data.val_files=[{val}]",
        "data.shuffle=false",  # the file's order, as TRL's side
        f"actor_rollout_ref.model.path={model}",
        "trainer.device=cpu",
    ]


def verl_train_overrides(out: Path) -> list[str]:
    """The bookkeeping of verl's training run: no validation, checkpoint or export inside
    the budget (snapshots replace them), and a step count the budget ends first."""
    return [
        "trainer.total_training_steps=1000000",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.logger=[jsonl]",
        f"trainer.log_dir={out}",
        f"trainer.default_local_dir={out}",
    ]


def graft_model_files(snapshot: Path, base: Path) -> None:
    """Copy the initial model's non-weight files (config, generation config, tokenizer,
    chat template) over ``snapshot``'s, so that two snapshots differ in their weights only."""
    for path in sorted(base.iterdir()):
        if not path.is_file() or path.name in NOT_COPIED or path.name.endswith(WEIGHT_SUFFIXES):
            continue
        shutil.copy2(path, snapshot / path.name)


# --------------------------------------------------------------------------- results


def time_to_threshold(points: list[tuple[float, float]], threshold: float) -> float | None:
    """The first time the curve through ``points`` ((time, accuracy), time ascending)
    reaches ``threshold``: linear between the last point below it and the first at or
    above it; the first point's time when that one reaches it already; None when none does."""
    previous = None
    for t, acc in points:
        if acc >= threshold:
            if previous is None:
                return t
            t0, a0 = previous
            return t0 + (t - t0) * (threshold - a0) / (acc - a0)
        previous = (t, acc)
    return None


def value_at(points: list[tuple[float, float]], t: float) -> float | None:
    """The curve through ``points`` ((time, value), time ascending) at time ``t``: linear
    between the points around it; None outside them."""
    for (t0, v0), (t1, v1) in itertools.pairwise(points):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return points[0][1] if len(points) == 1 and points[0][0] == t else None


def run_curve(run: dict, start_pct: float) -> list[tuple[float, float]]:
    """(training minutes, greedy accuracy %) of a run: the start, then its snapshots."""
    points = [(0.0, start_pct)]
    for snap in run["snapshots"]:
        points.append((snap["train_s"] / 60.0, snap["acc_pct"]))
    return points


def run_summary(run: dict, start_pct: float, budget_min: float) -> dict:
    """The table's numbers for one run (``acc_pct`` set on its snapshots): minutes to each
    gain, the accuracy at the budget (on the curve, between the snapshots around it: the
    last one is taken at the first step end past the budget, and a longer step overshoots
    more) and the last snapshot's accuracy and time."""
    points = run_curve(run, start_pct)
    at_budget = value_at(points, budget_min)
    out = {
        "side": run["side"],
        "repeat": run["repeat"],
        "start_pct": round(start_pct, 2),
        "budget_pct": None if at_budget is None else round(at_budget, 2),
        "end_pct": round(points[-1][1], 2),
        "end_min": round(points[-1][0], 3),
        "steps": len(run["steps"]),
        "setup_s": run["setup_s"],
    }
    for gain in GAINS:
        t = time_to_threshold(points, start_pct + gain)
        out[f"min_to_plus{gain:g}"] = None if t is None else round(t, 3)
    return out


def _minutes(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_table(summaries: list[dict], budget_min: float) -> str:
    """One row per run: minutes to +10 / +20 points over the start, accuracy at the budget
    (on the curve) and at the last snapshot (with its training time), steps trained, setup
    seconds."""
    at = f"acc at {budget_min:g} min %"
    head = (
        f"{'side':5} {'run':>3} | {'start %':>7} | {'min to +10':>10} | {'min to +20':>10} | "
        f"{at:>{len(at)}} | {'last snapshot %':>18} | {'steps':>5} | {'setup s':>7}"
    )
    lines = [head, "-" * len(head)]
    for s in summaries:
        budget = "-" if s["budget_pct"] is None else f"{s['budget_pct']:.1f}"
        end = f"{s['end_pct']:.1f} ({s['end_min']:.2f} min)"
        lines.append(
            f"{s['side']:5} {s['repeat'] + 1:>3} | {s['start_pct']:7.1f} | "
            f"{_minutes(s['min_to_plus10']):>10} | {_minutes(s['min_to_plus20']):>10} | "
            f"{budget:>{len(at)}} | {end:>18} | {s['steps']:>5} | {s['setup_s']:7.1f}"
        )
    return "\n".join(lines)


def _matplotlib():
    """matplotlib's Agg canvas and Figure (no pyplot, no global state); ``ImportError``
    naming the fix when it is missing (it is verl's ``plot`` extra)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(
            "the plot needs matplotlib in the python that runs this benchmark: pip install "
            "'verl[plot]' or pip install matplotlib"
        ) from exc
    return FigureCanvasAgg, Figure


def plot_curves(runs: list[dict], start_pct: float, budget_min: float, path: Path) -> Path:
    """Accuracy against training minutes, both sides in one PNG (matplotlib, Agg)."""
    canvas_cls, figure_cls = _matplotlib()
    colors = {"verl": "tab:blue", "trl": "tab:orange"}
    styles = ("-", "--", ":", "-.")
    fig = figure_cls(figsize=(7, 4.5))
    canvas_cls(fig)
    ax = fig.add_subplot()
    for run in runs:
        xs, ys = zip(*run_curve(run, start_pct), strict=True)
        label = "verl" if run["side"] == "verl" else "TRL"
        if any(r["repeat"] for r in runs):
            label += f" (run {run['repeat'] + 1})"
        ax.plot(
            xs,
            ys,
            styles[run["repeat"] % len(styles)],
            marker="o",
            color=colors[run["side"]],
            label=label,
        )
    for gain in GAINS:
        ax.axhline(start_pct + gain, color="grey", linewidth=0.8, linestyle=":")
        ax.annotate(f"+{gain:g}", (0, start_pct + gain), fontsize=8, color="grey")
    ax.axvline(budget_min, color="grey", linewidth=0.8)
    ax.set_xlabel("training time (min; setup and evaluation excluded)")
    ax.set_ylabel("greedy accuracy on held-out problems (%)")
    ax.set_title("time to accuracy: verl vs TRL GRPOTrainer")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def report(summary: dict, plot_path: Path) -> str:
    """The table, the accuracy at every snapshot, and the plot (written to ``plot_path``)."""
    start = summary["start_pct"]
    runs = [run for run in summary["runs"] if "error" not in run]
    rows = [run_summary(run, start, summary["budget_min"]) for run in runs]
    lines = [format_table(rows, summary["budget_min"]), ""]
    for run in summary["runs"]:
        head = f"{run['side']:5} {run['repeat'] + 1:>3} |"
        if "error" in run:
            lines.append(f"{head} failed: {run['error']}")
            continue
        pts = " ".join(f"{t:.2f}:{a:.1f}" for t, a in run_curve(run, start))
        lines.append(f"{head} min:acc% {pts}")
    plot = plot_curves(runs, start, summary["budget_min"], plot_path)
    lines += ["", f"plot: {plot}"]
    return "\n".join(lines)


# --------------------------------------------------------------------------- running


class SideFailed(RuntimeError):
    """One side's process exited non-zero (its log says why)."""


def _run(cmd: list[str], side: str, threads: int | None, log: Path) -> tuple[float, float]:
    """Run one side's process; returns (peak MiB of its process tree, wall seconds)."""
    code, peaks, wall = run_tree_measured(cmd, _side_env(side, threads), log)
    if code != 0:
        raise SideFailed(f"{side} failed ({code}); log: {log}")
    return peaks.tree / MiB, wall


def evaluate(args, models: list[Path], overrides: list[str], out_dir: Path) -> dict[str, dict]:
    """verl's validation of each model directory, one process (``_verl_convergence_side
    eval``); ``{dir: metrics}``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "eval.json"
    cmd = [args.verl_python, str(VERL_SIDE), "eval", "--config", str(args.config)]
    cmd += ["--out", str(out), "--workdir", str(out_dir), "--models", *map(str, models)]
    _run([*cmd, "--", *overrides], "verl", args.threads, out_dir / "eval.log")
    return json.loads(out.read_text())


def evaluate_snapshots(args, record: dict, base: Path, overrides: list[str], out: Path) -> None:
    """Evaluate a run's snapshots (each with the initial model's non-weight files), set
    their ``eval`` metrics and ``acc_pct``; their weights are removed afterwards unless
    ``--keep-snapshots``."""
    snaps = [Path(s["dir"]) for s in record["snapshots"]]
    for snap in snaps:
        graft_model_files(snap, base)
    logger.info("%s: evaluating %d snapshots ...", record["side"], len(snaps))
    evals = evaluate(args, snaps, overrides, out)
    for snap in record["snapshots"]:
        snap["eval"] = evals[snap["dir"]]
        snap["acc_pct"] = round(100.0 * snap["eval"]["val/acc"], 2)
    if not args.keep_snapshots:
        for snap in snaps:
            for weights in snap.iterdir():
                if weights.name.endswith(WEIGHT_SUFFIXES):
                    weights.unlink()


def train_side(
    args, side: str, task: dict, data: tuple[Path, Path], model: str, overrides, out: Path
) -> dict:
    """One side's budgeted run; its record (``_*_convergence_side.py``'s JSON) with the
    process tree's peak memory and wall time."""
    out.mkdir(parents=True, exist_ok=True)
    result = out / "result.json"
    marks = [str(m * 60.0) for m in args.marks]
    common = ["--budget-s", str(args.budget_min * 60.0), "--marks-s", *marks]
    common += ["--snapshots", str(out / "snapshots"), "--out", str(result)]
    if side == "verl":
        cmd = [args.verl_python, str(VERL_SIDE), "train", "--config", str(args.config), *common]
        cmd += ["--", *overrides, *verl_train_overrides(out / "run")]
    else:
        cmd = [str(args.trl_python), str(TRL_SIDE), "--model-dir", model, "--data", str(data[0])]
        cmd += ["--prompts", str(task["prompts"]), "--n", str(task["n"])]
        cmd += ["--max-new-tokens", str(task["max_new_tokens"])]
        cmd += ["--temperature", str(task["temperature"]), "--lr", str(task["lr"])]
        cmd += ["--seed", str(task["seed"]), *common]
        cmd += [f"--trl-arg={item}" for item in args.trl_arg]
    peak_mib, wall = _run(cmd, side, args.threads, out / "run.log")
    record = json.loads(result.read_text())
    return record | {"peak_mib": round(peak_mib), "wall_s": round(wall, 1)}


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="[bench] %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    if args.from_json:
        summary = json.loads(args.from_json.read_text())
        plot = args.plot or args.from_json.with_suffix(".png")
        print(report(summary, plot))
        return
    _matplotlib()  # missing: fail now, not after the runs
    from verl.config import load_config

    cfg = load_config(str(args.config), args.verl_override)
    task = task_spec(cfg)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench_convergence_vs_trl_"))
    workdir.mkdir(parents=True, exist_ok=True)
    args.trl_python = ensure_trl_venv(args.trl_venv)  # built (once) before any run
    data = write_task_data(cfg, workdir / "data")
    model = model_dir("smollm2", workdir)
    overrides = [*args.verl_override, *verl_data_overrides(*data, model)]
    summary: dict = {
        "bench": "convergence_vs_trl",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "config": str(args.config),
        "task": task,
        "budget_min": args.budget_min,
        "marks_min": args.marks,
        **machine_record(),
        "omp_num_threads": args.threads,
        "verl_extra_overrides": args.verl_override,
        "trl_extra_args": args.trl_arg,
        "workdir": str(workdir),
        "loadavg_1m_start": round(os.getloadavg()[0], 2),
        "runs": [],
    }
    logger.info("evaluating the initial model ...")
    base = evaluate(args, [Path(model)], overrides, workdir / "eval_start")[model]
    summary["start"] = base
    summary["start_pct"] = round(100.0 * base["val/acc"], 2)
    for repeat, side in run_plan(args.repeats):
        out = workdir / f"{side}_{repeat}"
        logger.info("%s run %d: %g min of training ...", side, repeat + 1, args.budget_min)
        try:
            record = train_side(args, side, task, data, model, overrides, out)
            record["repeat"] = repeat
            evaluate_snapshots(args, record, Path(model), overrides, out / "eval")
        except SideFailed as err:  # keep the other runs; the log says why
            logger.error("%s", err)
            summary["runs"].append({"side": side, "repeat": repeat, "error": str(err)})
            continue
        summary["runs"].append(record)
    summary["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    summary["summaries"] = [
        run_summary(r, summary["start_pct"], args.budget_min)
        for r in summary["runs"]
        if "error" not in r
    ]
    text = json.dumps(summary)
    json_out = args.json_out or workdir / "convergence.json"
    json_out.write_text(text + "\n")
    print(text)
    print()
    print(report(summary, args.plot or workdir / "convergence.png"))
    print(f"json: {json_out}")


if __name__ == "__main__":
    main()
