"""Benchmark: where verl's peak memory goes, phase by phase, on a ``bench_vs_trl`` workload.

Runs ``python -m verl.trainer.main_ppo`` with a workload's ``defaults`` keys (the ones
``bench_vs_trl.py --settings defaults`` uses, plus any ``--override``) in a fresh child
process that samples its own memory every 3 ms from a thread: the process's RSS plus the
private memory (USS, ``/proc/PID/smaps_rollup``) of its child processes (the forked reward
workers), as ``bench_vs_trl.py`` counts a tree. The child marks

- the RSS after ``import torch``, ``transformers`` and verl's trainer (the import baseline),
- the end of building the actor worker (weights, optimizer, tokenizer),
- each timed stage of each step (``gen``, ``reward``, ``old_log_prob``, ``update_actor``,
  ... from the trainer's ``timing_s`` timers): its peak, the RSS at its end, its CPU time,

and the parent prints a table and the JSON (``--json-out``). No TRL is needed.

    python bench/bench_memory_phases.py --workload W2
    python bench/bench_memory_phases.py --workload W3 --steps 2 --override trainer.mixed_precision=auto
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import MiB, pid_private_bytes, rss_bytes

BENCH_DIR = Path(__file__).resolve().parent


class PhaseSampler:
    """RSS of this process plus its children's private memory, peak per named phase."""

    def __init__(self, interval_s: float = 0.003, children_interval_s: float = 0.3) -> None:
        self.phase = "start"
        self.peaks: dict[str, int] = {}
        self.marks: list[tuple[str, int]] = []
        self.cpu_s: dict[str, float] = {}
        self._children = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._interval = interval_s
        self._children_interval = children_interval_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _children_private(self) -> int:
        me, total = os.getpid(), 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if ppid == me:
                total += pid_private_bytes(int(entry))
        return total

    def _run(self) -> None:
        next_children = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_children:
                self._children = self._children_private()
                next_children = now + self._children_interval
            tree = rss_bytes() + self._children
            with self._lock:
                self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), tree)
            time.sleep(self._interval)

    def enter(self, phase: str) -> None:
        children = self._children_private()  # fresh: a child may have ended with the phase
        with self._lock:
            self.phase, self._children = phase, children

    def mark(self, name: str) -> None:
        with self._lock:
            self.marks.append((name, rss_bytes()))

    def close(self) -> dict:
        self.mark("end")
        self._stop.set()
        self._thread.join()
        return {
            "marks_mib": [(name, round(b / MiB)) for name, b in self.marks],
            "peak_mib": {name: round(b / MiB) for name, b in self.peaks.items()},
            "cpu_s": self.cpu_s,
        }


def child(out: Path, overrides: list[str]) -> None:
    """Run main_ppo in this process under a :class:`PhaseSampler`; write its record."""
    sampler = PhaseSampler()
    sampler.mark("python")
    import torch  # noqa: F401

    sampler.mark("import torch")
    import transformers  # noqa: F401

    sampler.mark("import transformers")
    import verl.cli.ppo as main_ppo
    import verl.trainer.lifecycle.metrics as metrics
    import verl.trainer.rl.trainer as ppo_trainer
    from verl.workers import actor_rollout_ref

    sampler.mark("import verl's trainer")
    original_timer, step = metrics.timer, [0]

    @contextlib.contextmanager
    def timer(name, sink):
        step[0] += name == "gen"
        phase = f"step {step[0]} {name}"
        sampler.enter(phase)
        cpu = time.process_time()
        with original_timer(name, sink):
            yield
        sampler.cpu_s[phase] = round(time.process_time() - cpu, 3)
        sampler.mark(phase)
        sampler.enter(f"step {step[0]} after {name}")

    ppo_trainer.timer = timer
    worker = actor_rollout_ref.ActorRolloutRefWorker
    original_init = worker.init_model

    @functools.wraps(original_init)  # keeps the dispatch registration
    def init_model(self, *args, **kwargs):
        sampler.enter("build worker")
        result = original_init(self, *args, **kwargs)
        sampler.mark("build worker")
        sampler.enter("after build")
        return result

    worker.init_model = init_model
    cfg, _ = main_ppo.config_from_argv(overrides)
    sampler.enter("config and data")
    try:
        main_ppo.run_ppo(cfg)
    finally:
        worker.init_model, ppo_trainer.timer = original_init, original_timer
        out.write_text(json.dumps(sampler.close()))


def format_phases(record: dict) -> str:
    """Marks (RSS at a point) and per-phase peaks (tree) as a table."""
    lines = [f"{'point':34} {'RSS MiB':>8}"]
    lines += [f"{name:34} {mib:8d}" for name, mib in record["marks_mib"]]
    lines += ["", f"{'phase':34} {'peak MiB':>8} {'CPU s':>7}"]
    for phase, mib in record["peak_mib"].items():
        cpu = record["cpu_s"].get(phase)
        lines.append(f"{phase:34} {mib:8d} {'' if cpu is None else f'{cpu:7.2f}'}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workload", choices=("W1", "W2", "W3"), default="W2")
    parser.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.child is None and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rest = rest
    if args.steps < 1:
        parser.error(f"--steps={args.steps}: need at least one step")
    for override in args.override:
        if "=" not in override:
            parser.error(f"--override {override!r}: expected KEY=VALUE")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child is not None:
        child(args.child, args.rest)
        return
    from bench_vs_trl import WORKLOADS, addition_rows, model_dir, verl_overrides, write_jsonl

    workload = WORKLOADS[args.workload]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench_memory_phases_"))
    workdir.mkdir(parents=True, exist_ok=True)
    data = write_jsonl(
        addition_rows(workload.prompts * (args.steps + 1)), workdir / f"{workload.name}.jsonl"
    )
    model = model_dir(workload.model, workdir)
    out = workdir / "run"
    overrides = verl_overrides(workload, "defaults", data, model, out, args.steps)
    overrides += args.override
    record_path = workdir / "phases.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    if args.threads is not None:
        env["OMP_NUM_THREADS"] = str(args.threads)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(record_path)]
    with open(workdir / "run.log", "w") as log:
        code = subprocess.run([*cmd, *overrides], env=env, stdout=log, stderr=subprocess.STDOUT)
    if code.returncode != 0:
        raise SystemExit(f"the run failed ({code.returncode}); log: {workdir / 'run.log'}")
    record = json.loads(record_path.read_text())
    record.update(workload=workload.name, overrides=args.override, steps=args.steps)
    text = json.dumps(record)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print()
    print(format_phases(record))


if __name__ == "__main__":
    main()
