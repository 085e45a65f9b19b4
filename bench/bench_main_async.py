"""Benchmark: the main job's validation accuracy against training wall time, synchronous vs
one-step-off vs streaming, side by side in one run.

The workload is the main job's (``bash scripts/run.sh``: the preset
``examples/grpo_smollm2_arithmetic.yaml``, SmolLM2-135M-Instruct, one- and two-digit
``+ - *`` problems, 8 prompts x 8 samples, 16 new tokens, DAPO dynamic sampling), trained
for ``--steps`` steps (default 24) by the trainer ``python -m verl.trainer.main_ppo`` builds
(``RLTrainer`` and its driver, unchanged), with greedy validation on the preset's held-out
problems (192, the same in every configuration) before training and every ``--val-every``
steps (default 6). Configurations, each in a fresh process, their order rotating from one
repeat to the next (``--repeats``):

- ``sync``           the preset as it is; ``trainer.num_threads=--sync-threads`` (2: both
  cores for the one thread that generates, then trains);
- ``one_step_off``   ``trainer.async_rollout=true``: batch k+1 generates on the rollout copy,
  on a thread of the driver, while batch k trains. One-step-off refuses dynamic sampling
  (a varying number of generation batches per step), so this configuration runs with
  ``algorithm.filter_groups.enable=false``: a different algorithm from the preset's (see
  ``sync_nofilter``);
- ``streaming``      ``trainer.async_rollout=true trainer.rollout_mode=streaming``: the copy
  fills a buffer of groups; a step takes the oldest informative ones (dynamic sampling kept);
- ``sync_nofilter``  (only with ``--configs``) sync without dynamic sampling: one-step-off's
  algorithm, synchronously.

The asynchronous configurations split the cores: ``trainer.num_threads=--trainer-threads``
(1) for the training thread (and its validation) and ``trainer.rollout_num_threads=
--rollout-threads`` (1) for the rollout thread; the rollout correction is the product's
default for stale samples (``rollout_is_threshold=2.0``, set by the trainer). Everything
else is the preset's.

The clock: training time starts when the first step starts (process start, imports, model
load and the validation before training are ``setup s``, outside it) and excludes the time
spent validating: a validation is recorded at the training time at which it started, and
while it runs the rollout thread of the asynchronous configurations is held between two
forward passes (``NativeRollout._forward`` waits), so generating ahead during a validation
gains no excluded time. The final model export is skipped (after the clock).

Reported per configuration (medians over repeats): the accuracy at each validated step and
at common marks of training time (``--marks`` evenly spaced up to the shortest run's end),
minutes to +10 and +20 points over the start (linear between validations, "-" when not
reached), training seconds per step, trained samples per second (``data.train_batch_size x
rollout.n`` rows per step, what ``update_policy`` receives) and generated samples per second,
the rollout's idle fraction (the share of training time when no ``generate`` call of the
training rollout runs: sync's one engine, or the rollout copy's thread), and the ratios to
sync. At every mark the table says whether a configuration's accuracy is at least sync's
minus one validation's standard error (``sqrt(p (1 - p) / N)`` of sync's accuracy ``p`` on
``N`` problems). The output starts with the command, the machine and the load average
before and after, and ends with one JSON line; ``--plot PATH`` draws accuracy against
training minutes for every configuration and repeat (error bars: one standard error).

What to expect: overlap needs a free core. On 2 cores the two sides of an asynchronous
configuration get one core each where sync's one thread of work gets both, so they gain
only the part of the cores sync leaves idle (single-threaded Python between kernels,
matmuls too small to use two threads), less what the stale samples cost in accuracy per
step. The table says how large that part is on a given machine.

The full measurement, on idle cores (about 50 minutes on 2 cores: 3 configurations x 2
repeats, each run ~8 minutes: ~30 s of setup, 24 steps of ~14 s, five validations of 192
problems of ~15-25 s). On cores other jobs share, a process with 2 OpenMP threads stalls
whenever one of them is descheduled (the tiny W2 model's sync step took 24 s against
streaming's 0.7 s at a load average of 8 on 2 cores): measure on a quiet machine::

    python bench/bench_main_async.py --repeats 2 --plot main_async.png --json-out main_async.json

Smaller runs::

    python bench/bench_main_async.py --steps 4 --val-every 2 --val-size 32 --repeats 1
    python bench/bench_main_async.py --model w2 --steps 2 --val-every 1 --val-size 8 \
        --response-length 8 --repeats 1                      # seconds: the tiny W2 model
    python bench/bench_main_async.py --configs sync,sync_nofilter,one_step_off
    python bench/bench_main_async.py --from-json main_async.json --plot again.png
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _budget_clock import BudgetClock
from _common import cpu_model, w2_model_dir
from bench_convergence_vs_trl import _matplotlib, time_to_threshold, value_at

START = time.perf_counter()
logger = logging.getLogger("bench.main_async")

BENCH_DIR = Path(__file__).resolve().parent
PRESET = BENCH_DIR.parent / "examples" / "grpo_smollm2_arithmetic.yaml"
ASYNC = ["trainer.async_rollout=true"]
NO_FILTER = ["algorithm.filter_groups.enable=false"]
CONFIGS = {
    "sync": [],
    "one_step_off": [*ASYNC, "trainer.rollout_mode=one_step_off", *NO_FILTER],
    "streaming": [*ASYNC, "trainer.rollout_mode=streaming"],
    "sync_nofilter": NO_FILTER,
}
DEFAULT_CONFIGS = ("sync", "one_step_off", "streaming")
GAINS = (10.0, 20.0)  # points over the start


# --------------------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--val-every", type=int, default=6, help="validate every N steps")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--configs",
        default=",".join(DEFAULT_CONFIGS),
        help=f"comma-separated, sync first or not, from {list(CONFIGS)}",
    )
    parser.add_argument("--preset", type=Path, default=PRESET)
    parser.add_argument(
        "--model",
        choices=("preset", "w2"),
        default="preset",
        help="w2: the tiny random-init W2 model (a smoke run: scores ~0, so dynamic sampling "
        "is switched off everywhere, it would never fill a step)",
    )
    parser.add_argument("--val-size", type=int, default=None, help="held-out problems")
    parser.add_argument("--response-length", type=int, default=None)
    parser.add_argument("--sync-threads", type=int, default=2)
    parser.add_argument("--trainer-threads", type=int, default=1)
    parser.add_argument("--rollout-threads", type=int, default=1)
    parser.add_argument("--marks", type=int, default=4, help="common training-time marks")
    parser.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="every config"
    )
    parser.add_argument("--plot", type=Path, default=None, help="PNG of accuracy vs time")
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--from-json", type=Path, default=None, help="report a saved run")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.config_list = [c for c in args.configs.split(",") if c]
    unknown = sorted(set(args.config_list) - set(CONFIGS))
    if unknown or "sync" not in args.config_list:
        parser.error(
            f"--configs {args.configs}: unknown {unknown} or no sync; from {list(CONFIGS)}"
        )
    if args.steps < 1 or args.val_every < 1 or args.repeats < 1 or args.marks < 1:
        parser.error("--steps, --val-every, --repeats and --marks must be at least 1")
    return args


def config_overrides(args: argparse.Namespace, name: str, run_dir: str) -> list[str]:
    """The overrides of the preset one configuration trains with (module docstring)."""
    threads = (
        [
            f"trainer.num_threads={args.trainer_threads}",
            f"trainer.rollout_num_threads={args.rollout_threads}",
        ]
        if "trainer.async_rollout=true" in CONFIGS[name]
        else [f"trainer.num_threads={args.sync_threads}"]
    )
    out = [
        f"trainer.total_training_steps={args.steps}",
        f"trainer.test_freq={args.val_every}",
        "trainer.val_before_train=true",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.logger=[]",
        f"trainer.default_local_dir={run_dir}",
        f"trainer.log_dir={run_dir}",
        "trainer.device=cpu",
        *threads,
        *CONFIGS[name],
    ]
    if args.model_dir:
        out.append(f"actor_rollout_ref.model.path={args.model_dir}")
    if args.model == "w2":
        out += NO_FILTER
    if args.val_size is not None:
        out.append(f"data.arithmetic.val_size={args.val_size}")
    if args.response_length is not None:
        out.append(f"data.max_response_length={args.response_length}")
    return [*out, *args.override]


# --------------------------------------------------------------------------- one run


@contextlib.contextmanager
def _instrumented(gate: threading.Event, calls: list[dict], blocked: list[float]):
    """Every native engine of this process, while inside: its ``generate`` calls recorded in
    ``calls`` (start, end, rows, whether on the main thread during a validation) and, off
    the main thread, each forward pass waiting while ``gate`` is clear (the seconds waited
    added to ``blocked``). The engine's methods are restored on exit."""
    from verl.rollout.native import NativeRollout

    generate, forward = NativeRollout.generate, NativeRollout._forward

    def timed_generate(self, prompts, params):
        main = threading.current_thread() is threading.main_thread()
        validating = main and not gate.is_set()
        start = time.perf_counter()
        out = generate(self, prompts, params)
        calls.append(
            {"start": start, "end": time.perf_counter(), "rows": len(out), "val": validating}
        )
        return out

    def gated_forward(self, *a, **kw):
        if not gate.is_set() and threading.current_thread() is not threading.main_thread():
            t0 = time.perf_counter()
            gate.wait()
            blocked.append(time.perf_counter() - t0)
        return forward(self, *a, **kw)

    NativeRollout.generate, NativeRollout._forward = timed_generate, gated_forward
    try:
        yield
    finally:
        NativeRollout.generate, NativeRollout._forward = generate, forward


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))


def measure(args: argparse.Namespace, name: str, run_dir: str) -> dict:
    """Train configuration ``name`` in this process; its record (module docstring)."""
    import torch
    import transformers

    from verl.config import load_config
    from verl.trainer.lifecycle.tracking import Tracker
    from verl.trainer.rl.trainer import RLTrainer

    transformers.utils.logging.disable_progress_bar()
    cfg = load_config(str(args.preset), config_overrides(args, name, run_dir))
    gate = threading.Event()
    gate.set()
    calls: list[dict] = []
    blocked: list[float] = []
    clock = BudgetClock(math.inf, [])
    loop: dict[str, float] = {}
    steps: list[dict] = []
    validations: list[dict] = []
    trained_rows: list[int] = []
    val_windows: list[tuple[float, float]] = []
    threads_before = torch.get_num_threads()
    with _instrumented(gate, calls, blocked):
        trainer = RLTrainer(cfg, tracker=Tracker([]))
        real_step, real_validate = trainer.run_step, trainer.validate
        real_update = trainer.update_policy

        def run_step():
            if "start" not in loop:
                loop["setup_s"] = time.perf_counter() - START  # since this module loaded
                clock.start()
                loop["start"] = time.perf_counter()
            metrics = real_step()
            loop["end"] = time.perf_counter()
            steps.append({"step": trainer.global_step, "end_s": clock.elapsed()})
            return metrics

        def validate():
            train_s = clock.elapsed()
            t0 = time.perf_counter()
            with clock.paused():
                gate.clear()
                try:
                    val = real_validate()
                finally:
                    gate.set()
            t1 = time.perf_counter()
            if "start" in loop:
                val_windows.append((t0, t1))
            validations.append(
                {"step": trainer.global_step, "train_s": train_s, "val_s": t1 - t0}
                | {"acc": float(val["val/acc"])}
            )
            return val

        def update_policy(gen):
            trained_rows.append(len(gen))
            return real_update(gen)

        trainer.run_step, trainer.validate = run_step, validate
        trainer.update_policy = update_policy
        trainer.export = dict  # the final HF export: after the clock, not measured
        try:
            val_size = len(trainer.val_dataset)
            trainer.fit()
        finally:
            trainer.close()
            torch.set_num_threads(threads_before)
    window = (loop["start"], loop["end"])
    train_s = steps[-1]["end_s"]
    busy = 0.0
    generated = 0
    for call in calls:
        span = (call["start"], call["end"])
        busy += _overlap(span, window) - sum(_overlap(span, w) for w in val_windows)
        if not call["val"] and _overlap(span, window) > 0:
            generated += call["rows"]
    history = trainer.history
    return {
        "config": name,
        "overrides": config_overrides(args, name, run_dir),
        "val_size": val_size,
        "setup_s": loop["setup_s"],
        "train_s": train_s,
        "steps": steps,
        "validations": validations,
        "wall_per_step_s": train_s / len(steps),
        "trained_samples": sum(trained_rows),
        "samples_per_s": sum(trained_rows) / train_s,
        "generated_samples": generated,
        "gen_samples_per_s": generated / train_s,
        "rollout_busy_s": busy,
        "rollout_idle_fraction": max(0.0, 1.0 - busy / train_s),
        "rollout_held_s": sum(blocked),
        "staleness_mean": statistics.mean(r.get("async/staleness_mean", 0.0) for r in history),
        "dropped_groups": float(history[-1].get("stream/dropped_groups_total", 0.0)),
    }


# --------------------------------------------------------------------------- results


def curve(run: dict) -> list[tuple[float, float]]:
    """(training minutes, accuracy %) at each validation of a run."""
    return [(v["train_s"] / 60.0, 100.0 * v["acc"]) for v in run["validations"]]


def standard_error_pct(acc_pct: float, n: int) -> float:
    """One validation's standard error (percentage points) at accuracy ``acc_pct`` on ``n``
    problems."""
    p = acc_pct / 100.0
    return 100.0 * math.sqrt(p * (1.0 - p) / n)


def _median(values: list[float | None]) -> float | None:
    """The median of the values present; None when fewer than half are."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present and 2 * len(present) >= len(values) else None


def summarize(runs: list[dict], marks: int) -> dict:
    """Per configuration, medians over its runs: accuracy at each validated step and at the
    common marks, minutes to each gain, speeds; with ratios to sync and, per mark, the
    difference to sync in sync's standard errors."""
    by_config: dict[str, list[dict]] = {}
    for run in runs:
        by_config.setdefault(run["config"], []).append(run)
    shortest = min(run["train_s"] for run in runs) / 60.0
    # rounded down: the last mark stays inside the shortest run
    mark_min = [math.floor(1e4 * shortest * (i + 1) / marks) / 1e4 for i in range(marks)]
    out: dict[str, dict] = {}
    for name, group in by_config.items():
        steps = sorted({v["step"] for r in group for v in r["validations"]})
        s: dict = {"runs": len(group), "val_size": group[0]["val_size"]}
        s["acc_at_step"] = {
            str(step): _median(
                [100.0 * v["acc"] for r in group for v in r["validations"] if v["step"] == step]
            )
            for step in steps
        }
        s["min_at_step"] = {
            str(step): _median(
                [v["train_s"] / 60.0 for r in group for v in r["validations"] if v["step"] == step]
            )
            for step in steps
        }
        s["acc_at_mark"] = {
            str(m): _median([value_at(curve(r), m) for r in group]) for m in mark_min
        }
        for gain in GAINS:
            times = [time_to_threshold(curve(r), curve(r)[0][1] + gain) for r in group]
            s[f"min_to_plus{gain:g}"] = _median(times)
        for key in (
            "wall_per_step_s",
            "samples_per_s",
            "gen_samples_per_s",
            "rollout_idle_fraction",
            "setup_s",
            "train_s",
        ):
            s[key] = statistics.median(r[key] for r in group)
        s["val_s"] = statistics.median(v["val_s"] for r in group for v in r["validations"])
        out[name] = s
    sync = out["sync"]
    for s in out.values():
        s["vs_sync"] = {
            key: s[key] / sync[key] if sync[key] else None
            for key in ("wall_per_step_s", "samples_per_s")
        }
        s["vs_sync_at_mark"] = {}
        for m, acc in s["acc_at_mark"].items():
            ref = sync["acc_at_mark"][m]
            if acc is None or ref is None:
                s["vs_sync_at_mark"][m] = None
                continue
            se = standard_error_pct(ref, sync["val_size"])
            s["vs_sync_at_mark"][m] = {
                "diff_pct": acc - ref,
                "se_pct": se,
                "not_lower": acc >= ref - se,
            }
    return {"marks_min": mark_min, "configs": out}


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_report(record: dict) -> str:
    """The tables of a run's record (``main``'s JSON)."""
    summary = record["summary"]
    configs = summary["configs"]
    lines = [
        f"command: {record['command']}",
        f"machine: nproc {record['nproc']}, {record['cpu']}",
        "load average (1/5/15 min): "
        + " -> ".join("/".join(f"{x:.1f}" for x in load) for load in record["load"]),
        f"threads: sync {record['threads']['sync']}, asynchronous trainer "
        f"{record['threads']['trainer']} + rollout {record['threads']['rollout']}; "
        "training time excludes setup and validation (the rollout thread held meanwhile)",
        "",
    ]
    head = (
        f"{'config':14}{'runs':>5}{'s/step':>8}{'vs sync':>8}{'samples/s':>10}{'vs sync':>8}"
        f"{'gen/s':>7}{'idle %':>7}{'min+10':>7}{'min+20':>7}{'val s':>7}{'setup s':>8}"
    )
    lines += [head, "-" * len(head)]
    for name, s in configs.items():
        lines.append(
            f"{name:14}{s['runs']:>5}{s['wall_per_step_s']:8.2f}"
            f"{_cell(s['vs_sync']['wall_per_step_s'], '.2f'):>8}{s['samples_per_s']:10.2f}"
            f"{_cell(s['vs_sync']['samples_per_s'], '.2f'):>8}{s['gen_samples_per_s']:7.1f}"
            f"{100 * s['rollout_idle_fraction']:7.0f}{_cell(s['min_to_plus10'], '.2f'):>7}"
            f"{_cell(s['min_to_plus20'], '.2f'):>7}{s['val_s']:7.1f}{s['setup_s']:8.1f}"
        )
    steps = sorted({int(k) for s in configs.values() for k in s["acc_at_step"]})
    lines += ["", "accuracy % at each validated step (training minutes):"]
    lines.append(f"{'config':14}" + "".join(f"{'step ' + str(k):>15}" for k in steps))
    for name, s in configs.items():
        cells = []
        for k in steps:
            acc, t = s["acc_at_step"].get(str(k)), s["min_at_step"].get(str(k))
            cells.append("-" if acc is None else f"{acc:.1f} ({t:.2f})")
        lines.append(f"{name:14}" + "".join(f"{c:>15}" for c in cells))
    marks = summary["marks_min"]
    lines += ["", "accuracy % at common training minutes (difference to sync; ok: not lower than "
              "sync's minus one standard error):"]  # fmt: skip
    lines.append(f"{'config':14}" + "".join(f"{f'{m:.3g} min':>22}" for m in marks))
    for name, s in configs.items():
        cells = []
        for m in marks:
            acc, cmp = s["acc_at_mark"][str(m)], s["vs_sync_at_mark"][str(m)]
            if acc is None:
                cells.append("-")
            elif name == "sync" or cmp is None:
                cells.append(f"{acc:.1f}")
            else:
                verdict = "ok" if cmp["not_lower"] else "LOWER"
                cells.append(f"{acc:.1f} ({cmp['diff_pct']:+.1f} {verdict})")
        lines.append(f"{name:14}" + "".join(f"{c:>22}" for c in cells))
    ratios = ", ".join(
        f"{name} {_cell(s['vs_sync']['samples_per_s'], '.2f')}x"
        for name, s in configs.items()
        if name != "sync"
    )
    lines += ["", f"samples/s vs sync: {ratios}"]
    return "\n".join(lines)


def plot(record: dict, path: Path) -> Path:
    """Accuracy against training minutes, every configuration and repeat in one PNG."""
    canvas_cls, figure_cls = _matplotlib()
    fig = figure_cls(figsize=(7.5, 4.5))
    canvas_cls(fig)
    ax = fig.add_subplot()
    colors = dict(zip(CONFIGS, ("tab:blue", "tab:orange", "tab:green", "tab:grey"), strict=True))
    styles = ("-", "--", ":", "-.")
    for run in record["runs"]:
        xs, ys = zip(*curve(run), strict=True)
        errs = [standard_error_pct(y, run["val_size"]) for y in ys]
        label = run["config"] + (
            f" (run {run['repeat'] + 1})" if record["args"]["repeats"] > 1 else ""
        )
        ax.errorbar(
            xs,
            ys,
            yerr=errs,
            fmt=styles[run["repeat"] % len(styles)],
            marker="o",
            capsize=3,
            color=colors[run["config"]],
            label=label,
        )
    ax.set_xlabel("training time (min; setup and validation excluded)")
    ax.set_ylabel(f"greedy accuracy on {record['runs'][0]['val_size']} held-out problems (%)")
    ax.set_title("main job: sync vs asynchronous GRPO (error bars: one standard error)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


# --------------------------------------------------------------------------- the driver


def run_plan(configs: list[str], repeats: int) -> list[tuple[int, str]]:
    """``(repeat, config)`` in run order: each repeat rotates the order by one."""
    plan = []
    for r in range(repeats):
        k = r % len(configs)
        plan += [(r, name) for name in configs[k:] + configs[:k]]
    return plan


def child_argv(args: argparse.Namespace) -> list[str]:
    """The arguments a configuration's process needs (those ``config_overrides`` reads)."""
    out = ["--steps", str(args.steps), "--val-every", str(args.val_every)]
    out += ["--preset", str(args.preset), "--model", args.model]
    out += [
        "--sync-threads",
        str(args.sync_threads),
        "--trainer-threads",
        str(args.trainer_threads),
    ]
    out += ["--rollout-threads", str(args.rollout_threads), "--configs", args.configs]
    if args.val_size is not None:
        out += ["--val-size", str(args.val_size)]
    if args.response_length is not None:
        out += ["--response-length", str(args.response_length)]
    return out + [f"--override={item}" for item in args.override]


def _run_child(args: argparse.Namespace, name: str, model_dir: str | None, out: Path) -> dict:
    cmd = [sys.executable, __file__, *child_argv(args), "--child", name, "--out", str(out)]
    if model_dir:
        cmd += ["--model-dir", model_dir]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise RuntimeError(f"configuration {name} failed with exit code {proc.returncode}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> dict | None:
    logging.basicConfig(level=logging.INFO, format="[bench] %(message)s", stream=sys.stderr)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.child:
        with tempfile.TemporaryDirectory(prefix="bench_main_async_") as tmp:
            record = measure(args, args.child, tmp)
        args.out.write_text(json.dumps(record))
        return None
    if args.from_json:
        record = json.loads(args.from_json.read_text())
        print(format_report(record))
        if args.plot:
            print(f"plot: {plot(record, args.plot)}")
        return record
    if args.plot:
        _matplotlib()  # missing: fail now, not after the runs
    load_before = os.getloadavg()
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_main_async_") as tmp:
        model_dir = w2_model_dir(Path(tmp)) if args.model == "w2" else None
        for i, (repeat, name) in enumerate(run_plan(args.config_list, args.repeats)):
            run = _run_child(args, name, model_dir, Path(tmp) / f"run{i}.json")
            run["repeat"] = repeat
            runs.append(run)
            logger.info(
                "%s (repeat %d): %.2f s/step, %.2f samples/s, accuracy %s",
                name,
                repeat + 1,
                run["wall_per_step_s"],
                run["samples_per_s"],
                " ".join(f"{t:.2f}min:{a:.1f}%" for t, a in curve(run)),
            )
    record = {
        "bench": "main_async",
        "command": " ".join([sys.executable, __file__, *argv]),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "load": [load_before, os.getloadavg()],
        "threads": {
            "sync": args.sync_threads,
            "trainer": args.trainer_threads,
            "rollout": args.rollout_threads,
        },
        "runs": runs,
        "summary": summarize(runs, args.marks),
    }
    print(format_report(record))
    if args.plot:
        print(f"plot: {plot(record, args.plot)}")
    if args.json_out:
        args.json_out.write_text(json.dumps(record) + "\n")
    print(json.dumps(record))
    return record


if __name__ == "__main__":
    main()
