"""Benchmark: how torch's CPU threads wait (``OMP_WAIT_POLICY``) on an idle and on a busy CPU.

torch's CPU wheel runs its intra-op threads on GNU OpenMP. Between parallel regions an idle
thread spins for a while before it sleeps (the default); with ``OMP_WAIT_POLICY=PASSIVE`` it
sleeps at once. When every core runs one of torch's threads and something else also wants a
core (another job, a browser, a test run), a spinning thread holds a core its peer needs, and
each region waits for a thread the scheduler took away. The policy is read once, when the
OpenMP runtime loads with torch, so each measurement is a fresh child process with its own
environment.

Workload, on the main job's model (SmolLM2-135M-Instruct in fp32, the precision ``auto``
picks on a CPU without native bf16) or ``--tiny`` (a small random Llama, ``verl.models.tiny``): an
update-sized forward + backward (``--update-rows`` x ``--update-tokens`` tokens) and a decode
(``--decode-rows`` rows, ``--decode-steps`` tokens with a KV cache), ``--threads`` torch threads
(default: the machine's cores), a warm-up of each first. Conditions: ``idle`` (nothing else
started) and ``busy`` (one other process spinning on a core for the whole measurement, as a
second job would). Per condition the policies alternate, ``--repeats`` children each; a
ratio is the median over rounds of ``default / P`` seconds (> 1: policy P is faster). Policies:
the runtime's default, ``passive`` (``OMP_WAIT_POLICY=PASSIVE``) and ``spin10k``
(``GOMP_SPINCOUNT=10000``: a short spin, then sleep).

    nice -n 0 python bench/bench_omp_wait.py                  # SmolLM2, idle and busy, 2 pairs
    python bench/bench_omp_wait.py --tiny --repeats 1         # a quick look (~1 min)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# policy -> environment: the runtime's default (spin, then sleep), PASSIVE (sleep at once), and
# a short spin before sleeping (GOMP_SPINCOUNT, GNU OpenMP's spin iterations; default 300000)
POLICIES = {
    "default": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin10k": {"GOMP_SPINCOUNT": "10000"},
}
CONDITIONS = ("idle", "busy")
PHASES = ("update", "decode")
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
SPIN = "import time\nwhile True:\n    time.perf_counter()\n"


def child_env(policy: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) without any OpenMP wait setting, then
    with the policy's (:data:`POLICIES`)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {sorted(POLICIES)}, got {policy!r}")
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in WAIT_VARS}
    return {**env, **POLICIES[policy]}


def paired_ratio(default: list[float], other: list[float]) -> float:
    """Median over rounds of ``default / other`` (> 1: the other policy is faster)."""
    return statistics.median(d / o for d, o in zip(default, other, strict=True))


def summarize(runs: list[dict], policies: list[str]) -> list[dict]:
    """One row per (condition, phase): each policy's median seconds (wall and CPU) and, for
    each policy, the paired ratio of the default's seconds over its own."""
    rows = []
    for condition in CONDITIONS:
        sel = {}
        for p in policies:
            sel[p] = [r for r in runs if (r["condition"], r["policy"]) == (condition, p)]
        if not all(sel.values()):
            continue
        for phase in PHASES:
            secs = {p: [r["seconds"][phase] for r in sel[p]] for p in policies}
            cpu = {p: [r["cpu_seconds"][phase] for r in sel[p]] for p in policies}
            rows.append(
                {
                    "condition": condition,
                    "phase": phase,
                    "seconds": {p: statistics.median(v) for p, v in secs.items()},
                    "cpu_seconds": {p: statistics.median(v) for p, v in cpu.items()},
                    "default_over": {p: paired_ratio(secs["default"], v) for p, v in secs.items()},
                }
            )
    return rows


def table(rows: list[dict], policies: list[str]) -> str:
    """Seconds as ``wall (cpu)``; ``default / P``: > 1 where policy P is faster."""
    others = [p for p in policies if p != "default"]
    head = ["condition", "phase", *(f"{p} s (cpu s)" for p in policies)]
    head += [f"default / {p}" for p in others]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        s, c = r["seconds"], r["cpu_seconds"]
        cells = [r["condition"], r["phase"], *(f"{s[p]:.3f} ({c[p]:.3f})" for p in policies)]
        cells += [f"{r['default_over'][p]:.2f}" for p in others]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _build_model(tiny: bool):
    import torch

    if tiny:
        from verl.models.tiny import build_tiny_model

        return build_tiny_model(
            arch="llama", hidden_size=256, num_layers=4, num_heads=4, intermediate_size=768
        )
    from transformers import AutoModelForCausalLM

    from verl.models.embedded import embedded_model_dir

    return AutoModelForCausalLM.from_pretrained(str(embedded_model_dir()), dtype=torch.float32)


def measure(args: argparse.Namespace) -> dict:
    """In the child: median seconds (wall and CPU) of each phase over ``args.reps``."""
    import torch

    torch.set_num_threads(args.threads)
    model = _build_model(args.tiny)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (args.update_rows, args.update_tokens), generator=gen)
    prompt = torch.randint(0, vocab, (args.decode_rows, 8), generator=gen)

    def update():
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=tokens).logits
        torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, vocab), tokens[:, 1:].reshape(-1)
        ).backward()

    @torch.no_grad()
    def decode():
        out = model(input_ids=prompt, use_cache=True)
        cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(args.decode_steps):
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)

    phases = {"update": update, "decode": decode}
    for fn in phases.values():
        fn()
    wall: dict[str, list[float]] = {p: [] for p in PHASES}
    cpu: dict[str, list[float]] = {p: [] for p in PHASES}
    for _ in range(args.reps):
        for name, fn in phases.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            cpu[name].append(time.process_time() - start_cpu)
            wall[name].append(time.perf_counter() - start)
    return {
        "seconds": {p: statistics.median(v) for p, v in wall.items()},
        "cpu_seconds": {p: statistics.median(v) for p, v in cpu.items()},
        "wait_env": {k: os.environ[k] for k in WAIT_VARS if k in os.environ},
        "threads": torch.get_num_threads(),
    }


def _child_args(args: argparse.Namespace) -> list[str]:
    out = [
        "--threads", str(args.threads),
        "--reps", str(args.reps),
        "--update-rows", str(args.update_rows),
        "--update-tokens", str(args.update_tokens),
        "--decode-rows", str(args.decode_rows),
        "--decode-steps", str(args.decode_steps),
    ]  # fmt: skip
    return out + (["--tiny"] if args.tiny else [])


def run_child(args: argparse.Namespace, policy: str) -> dict:
    cmd = [sys.executable, __file__, "--child", *_child_args(args)]
    proc = subprocess.run(cmd, env=child_env(policy), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise RuntimeError(f"the {policy} child failed with exit code {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> list[dict]:
    runs = []
    for condition in args.conditions:
        spinner = None
        if condition == "busy":
            spinner = subprocess.Popen([sys.executable, "-c", SPIN])
        try:
            for i in range(args.repeats):
                shift = i % len(args.policies)  # each policy goes first in turn
                for policy in args.policies[shift:] + args.policies[:shift]:
                    result = run_child(args, policy)
                    result.update(condition=condition, policy=policy, repeat=i)
                    print(json.dumps(result), file=sys.stderr, flush=True)
                    runs.append(result)
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--tiny", action="store_true", help="a small random Llama, not SmolLM2")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeats", type=int, default=2, help="children per policy and condition")
    p.add_argument("--reps", type=int, default=3, help="timed runs of each phase in a child")
    p.add_argument("--conditions", nargs="+", choices=CONDITIONS, default=list(CONDITIONS))
    p.add_argument(
        "--policies",
        nargs="+",
        choices=list(POLICIES),
        default=list(POLICIES),
        help="wait settings to compare (default is always measured)",
    )
    p.add_argument("--update-rows", type=int, default=8)
    p.add_argument("--update-tokens", type=int, default=64)
    p.add_argument("--decode-rows", type=int, default=32)
    p.add_argument("--decode-steps", type=int, default=16)
    p.add_argument("--json", help="also write the runs and the summary to this file")
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args)))
        return 0
    if args.repeats < 1 or args.reps < 1:
        p.error("--repeats and --reps must be at least 1")
    args.policies = ["default", *(p for p in dict.fromkeys(args.policies) if p != "default")]
    runs = run(args)
    rows = summarize(runs, args.policies)
    out = {"threads": args.threads, "tiny": args.tiny, "runs": runs, "summary": rows}
    print(json.dumps(out))
    print(table(rows, args.policies))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
