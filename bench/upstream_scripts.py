"""Upstream verl's real run scripts, run as pasted: how many of them run here.

For each (release tag, script path) of :data:`SCRIPTS` the script is read from a git
directory of upstream verl (``--upstream``; its ``examples/``, ``recipe/`` and ``tests/``
trees are extracted into a temporary directory at run time, nothing of them is kept) and:

1. **recorded**: ``bash <script> <args>`` runs in the extracted tree with a PATH whose
   ``python``, ``python3`` and ``torchrun`` only record their argv, so the shell expands
   the script's own variables, loops, ``$(pwd)`` and ``$@`` as written;
2. **substituted**: each recorded ``-m verl.*`` command gets only the permitted changes,
   by key: model paths -> a tiny local model (a sequence classifier for
   ``reward_model.model.path``), data files -> tiny parquet files in the script's format,
   device counts -> 1 (2 where the script's point is parallelism), batch and micro-batch
   sizes, lengths and token budgets -> small, steps -> at most 2 (``total_training_steps``
   added where the script has none), the logger -> console, output directories -> the
   script's temporary directory. Every other key and value is kept as written;
3. **run**: the substituted commands, in order, with this interpreter (``torchrun`` as
   ``python -m torch.distributed.run``), each with ``--timeout`` seconds.

The table gives per script its family, the result (``ran``; ``refused`` and the message's
first line; ``crashed`` and the exception; ``no-op``: exit 0 without a trained step or an
output file) and the seconds. For every result but ``ran`` the exact substituted command
is printed.

    python bench/upstream_scripts.py                       # all 23, ~15 min on 2 cores
    python bench/upstream_scripts.py --only grpo dapo      # names containing a word
    python bench/upstream_scripts.py --record-only         # the commands, nothing run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIRROR = "/work/.mirror/volcengine+verl/repo"


@dataclass(frozen=True)
class Script:
    """One upstream script: ``tag:path``, the family it stands for, the kind of its data
    files (``gsm8k``, ``math``, ``dapo``, ``tools``, ``sft``, ``sft_messages``, ``gens``),
    the device count it runs on here, and the positional arguments its README passes
    (``{out}`` is the script's temporary directory)."""

    tag: str
    path: str
    family: str
    data: str = "gsm8k"
    devices: int = 1
    args: tuple[str, ...] = ()
    name: str = field(default="")

    @property
    def label(self) -> str:
        return self.name or f"{self.tag}:{self.path.rsplit('/', 1)[-1]}"


# fmt: off
SCRIPTS: list[Script] = [
    Script("v0.5.0", "examples/grpo_trainer/run_qwen3-8b.sh", "GRPO"),
    Script("HEAD", "examples/grpo_trainer/run_deepseek7b_llm_seq_balance.sh", "GRPO, dynamic batch size (head)"),
    Script("v0.5.0", "examples/ppo_trainer/run_deepseek7b_llm.sh", "PPO with a critic (GAE)"),
    Script("v0.7.0", "examples/ppo_trainer/run_qwen2-7b_seq_balance.sh", "PPO with a critic, gsm8k+math lists", data="math"),
    Script("v0.6.1", "examples/ppo_trainer/run_qwen2-7b_rm.sh", "PPO with a reward model", data="math"),
    Script("HEAD", "examples/ppo_trainer/run_qwen2-7b_rm_seq_balance.sh", "PPO with a reward model (head)", data="math"),
    Script("v0.7.0", "examples/rloo_trainer/run_qwen2-7b.sh", "RLOO"),
    Script("v0.6.1", "examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh", "REINFORCE++", data="math"),
    Script("HEAD", "examples/remax_trainer/run_qwen2.5-3b_seq_balance.sh", "ReMax"),
    Script("v0.5.0", "recipe/dapo/test_dapo_7b_math.sh", "DAPO (main_ppo, DAPO reward manager)", data="dapo"),
    Script("v0.7.0", "recipe/dapo/test_dapo_7b_math.sh", "DAPO (v0.7)", data="dapo"),
    Script("v0.7.0", "examples/gspo_trainer/test_gspo_3b_math.sh", "GSPO, rollout.mode=async", data="dapo"),
    Script("v0.5.0", "examples/sft/gsm8k/run_qwen_05_peft.sh", "SFT (fsdp_sft_trainer) with LoRA", data="sft", args=("1", "{out}/sft")),
    Script("v0.6.1", "examples/sft/gsm8k/run_gemma_2b.sh", "SFT (fsdp_sft_trainer)", data="sft", args=("1", "{out}/sft")),
    Script("v0.6.1", "recipe/open_math_reasoning/run_sft_qwen3_8b.sh", "SFT (sft_trainer, messages)", data="sft_messages"),
    Script("v0.7.0", "examples/sft/multiturn/run_qwen_05_sp2.sh", "SFT multi-turn, Ulysses SP=2", data="sft_messages", devices=2, args=("2", "{out}/sft")),
    Script("v0.6.1", "examples/generation/run_deepseek_v2_lite_math.sh", "generation (main_generation)"),
    Script("v0.6.1", "recipe/open_math_reasoning/run_eval.sh", "eval with a custom reward (main_eval)", data="gens"),
    Script("v0.7.0", "tests/special_e2e/run_grpo_lora_with_merge.sh", "LoRA GRPO + model_merger merge"),
    Script("v0.7.0", "examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_vllm_fsdp.sh", "multi-turn with tools, rollout.mode=async", data="tools"),
    Script("v0.6.1", "examples/ppo_trainer/run_deepseek7b_llm_sp2.sh", "PPO, Ulysses SP=2", devices=2),
    Script("v0.7.0", "examples/grpo_trainer/run_qwen2-7b_math.sh", "GRPO, tensor-parallel rollout (tp=2)", data="math", devices=2),
    Script("v0.7.0", "examples/ppo_trainer/run_deepseek_math_gsm8k_megatron.sh", "PPO on Megatron"),
]
# fmt: on

# ------------------------------------------------------------------ the substitutions

# the small sizes the permitted substitutions put in (a written value under them is kept)
TRAIN_BATCH = 4
MINI_BATCH = 2
MICRO_BATCH = 2
RESPONSES = 2
PROMPT_LEN = 256
TOOL_PROMPT_LEN = 1024
RESPONSE_LEN = 16
SFT_LEN = 256
TOKEN_BUDGET = 1024
OVERLONG = 4
STEPS = 2

_BATCH_KEYS = {  # key suffix -> the small value (min with the written one)
    "data.train_batch_size": TRAIN_BATCH,
    "data.val_batch_size": TRAIN_BATCH,
    "data.gen_batch_size": TRAIN_BATCH,
    "data.batch_size": TRAIN_BATCH,
    "ppo_mini_batch_size": MINI_BATCH,
    "rollout.n": RESPONSES,
    "val_kwargs.n": RESPONSES,
    "data.n_samples": RESPONSES,
    "data.max_prompt_length": PROMPT_LEN,
    "data.max_response_length": RESPONSE_LEN,
    "rollout.prompt_length": PROMPT_LEN,
    "rollout.response_length": RESPONSE_LEN,
    "rollout.max_model_len": PROMPT_LEN + RESPONSE_LEN,
    "rollout.max_num_batched_tokens": TOKEN_BUDGET,
    "data.max_length": SFT_LEN,
    "overlong_buffer.len": OVERLONG,
    "overlong_buffer_cfg.len": OVERLONG,
    "max_resp_len": RESPONSE_LEN,
    "total_training_steps": STEPS,
    "trainer.total_epochs": 1,
}
_MICRO = re.compile(r"micro_batch_size(_per_gpu)?$")
_BUDGET = re.compile(r"max_token_len(_per_gpu)?$")
_DEVICE_KEYS = ("trainer.n_gpus_per_node", "trainer.nnodes")
_PARALLEL_KEYS = ("ulysses_sequence_parallel_size", "fsdp_size")
_OUTPUT_KEYS = (
    "trainer.default_local_dir",
    "trainer.rollout_data_dir",
    "trainer.validation_data_dir",
    "data.output_path",
)
_MODEL_KEYS = ("model.path", "model.partial_pretrain", "model.tokenizer_path", "tokenizer_path")


@dataclass
class Fixtures:
    """The tiny model directories and data files the substitutions point at."""

    lm: str
    rm: str
    data: dict[str, tuple[str, str]]  # kind -> (train file, test file)


def _key_value(arg: str) -> tuple[str, str, str] | None:
    """``(prefix, key, value)`` of a Hydra ``[+|++|~]key=value`` argument, else None."""
    m = re.match(r"^(\+\+|\+|~)?([A-Za-z_][\w.\-]*)=(.*)$", arg, re.S)
    return (m.group(1) or "", m.group(2), m.group(3)) if m else None


def _small(value: str, limit: int) -> str:
    try:
        written = int(float(value))
    except ValueError:
        return str(limit)  # ${...} or a name: the small value
    return str(limit) if written < 0 or written > limit else value


def _data_file(value: str, key: str, script: Script, fx: Fixtures) -> str:
    """A data-file value (one path or a list of paths) with each path replaced by the tiny
    file of the script's kind (a path naming gsm8k gets gsm8k rows)."""
    test = "val" in key or (key in ("data.path",) and script.data != "gens")
    paths = re.findall(r"[^\s'\",\[\]]+", value)
    out = []
    for p in paths or [value]:
        kind = "gsm8k" if "gsm8k" in p and script.data in ("math", "dapo") else script.data
        out.append(fx.data[kind][1 if test else 0])
    if value.strip().startswith("["):
        return "[" + ",".join(f"'{p}'" for p in out) + "]"
    return out[0]


def substitute(argv: list[str], script: Script, fx: Fixtures, out: Path) -> list[str]:
    """The recorded ``argv`` (``python -m MOD ...`` or ``torchrun ... -m MOD ...``) with the
    permitted substitutions applied by key; see the module docstring."""
    cmd: list[str] = []
    devices = str(script.devices)
    is_train = False
    has_steps = False
    module = ""
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "-m" and i < len(argv):
            module = argv[i]
            cmd += [arg, module]
            i += 1
            continue
        # torchrun's own flags
        m = re.match(r"^--(nproc[_-]per[_-]node|nnodes)(=(.*))?$", arg)
        if m and not module.startswith("verl"):
            value = devices if m.group(1).startswith("nproc") else "1"
            if m.group(2) is None and i < len(argv):
                i += 1  # "--nproc_per_node N"
            cmd.append(f"--{m.group(1)}={value}")
            continue
        if module == "verl.model_merger" and arg in ("--local_dir", "--target_dir"):
            cmd.append(arg)
            continue
        kv = _key_value(arg)
        if kv is None:
            cmd.append(arg)
            continue
        prefix, key, value = kv
        new = value
        if key in ("data.train_files", "data.val_files", "data.path"):
            new = _data_file(value, key, script, fx)
        elif key == "reward_model.model.path":
            new = fx.rm
        elif key.endswith(_MODEL_KEYS) or key == "reward_model.model.input_tokenizer":
            new = fx.lm
        elif key in _DEVICE_KEYS:
            new = devices if key.endswith("n_gpus_per_node") else "1"
        elif key.endswith(_PARALLEL_KEYS):
            new = _small(value, script.devices) if key.endswith("sequence_parallel_size") else "-1"
        elif key == "data.output_path":
            new = str(out / "output_path" / os.path.basename(value))
        elif key.endswith(_OUTPUT_KEYS):
            new = str(out / key.rsplit(".", 1)[-1])
        elif key == "trainer.logger":
            new = "console"
        elif _MICRO.search(key):
            new = "null" if value in ("null", "None") else _small(value, MICRO_BATCH)
        elif _BUDGET.search(key):
            new = _small(value, TOKEN_BUDGET)
        else:
            for suffix, limit in _BATCH_KEYS.items():
                if suffix == "data.max_prompt_length" and script.data == "tools":
                    limit = TOOL_PROMPT_LEN  # the tools' schemas are in the prompt
                if key == suffix or key.endswith("." + suffix):
                    new = _small(value, limit)
                    break
        has_steps |= key.endswith("total_training_steps")
        is_train |= key.endswith(("train_files", "train_batch_size"))
        cmd.append(f"{prefix}{key}={new}")
    trainer = module in (
        "verl.trainer.main_ppo",
        "verl.trainer.fsdp_sft_trainer",
        "verl.trainer.sft_trainer",
    )
    if trainer and is_train and not has_steps:
        cmd.append(f"trainer.total_training_steps={STEPS}")
    return cmd


def to_real(argv: list[str]) -> list[str] | None:
    """The command this interpreter runs for a recorded ``argv`` (``python ...``,
    ``torchrun ...``); None for a command that is not one of verl's entry points (a data
    preparation script: its data files are replaced anyway)."""
    prog = os.path.basename(argv[0])
    rest = argv[1:]
    if "-m" not in rest or not rest[rest.index("-m") + 1].startswith("verl"):
        return None
    if prog == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *rest]
    return [sys.executable, *rest]


# ------------------------------------------------------------------ fixtures


def build_fixtures(base: Path) -> Fixtures:
    """Tiny models (saved with ``save_pretrained``) and tiny data files of every kind."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from verl.data.gsm8k import gsm8k_row
    from verl.models.tiny import save_tiny_model_dir

    # head size 32: the smallest vLLM's CPU attention kernels take
    size = {"hidden_size": 128, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 256}
    size["max_position_embeddings"] = 2048  # the tools' prompts run past 512 tokens
    lm = save_tiny_model_dir(base / "tiny_lm", arch="qwen2", **size)
    rm = save_tiny_model_dir(base / "tiny_rm", arch="qwen2", reward_head=True, **size)

    def gsm8k(n: int, split: str) -> list[dict]:
        rows = []
        for i in range(n):
            a, b = i + 2, 3 * i + 1
            question = f"Tom has {a} apples and buys {b} more. How many apples does he have?"
            answer = f"He has {a} + {b} = {a + b} apples.\n#### {a + b}"
            rows.append(gsm8k_row(question, answer, i, split))
        return rows

    def math(n: int, split: str, source: str) -> list[dict]:
        rows = []
        for row in gsm8k(n, split):
            truth = row["reward_model"]["ground_truth"]
            question = row["extra_info"]["question"]
            content = (
                f"Solve the following math problem step by step. The last line of your "
                f"response should be of the form Answer: $Answer\n\n{question}"
                if source == "math_dapo"
                else f"{question} Let's think step by step and output the final answer "
                "within \\boxed{}."
            )
            row.update(
                data_source=source,
                prompt=[{"role": "user", "content": content}],
                ability="MATH" if source == "math_dapo" else "math",
                reward_model={"style": "rule-lighteval/MATH_v2", "ground_truth": truth},
            )
            rows.append(row)
        return rows

    def tools(n: int, split: str) -> list[dict]:
        rows = []
        for row in gsm8k(n, split):
            truth = row["reward_model"]["ground_truth"]
            row["prompt"] = [
                {
                    "role": "system",
                    "content": "You are a math expert. Call calc_gsm8k_reward to check "
                    "your answer before you give it after ####.",
                },
                *row["prompt"],
            ]
            row["extra_info"].update(
                need_tools_kwargs=True,
                tools_kwargs={"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": truth}}},
            )
            rows.append(row)
        return rows

    def messages(n: int, split: str) -> list[dict]:
        return [
            {
                "messages": [
                    {"role": "user", "content": row["extra_info"]["question"]},
                    {"role": "assistant", "content": row["extra_info"]["answer"]},
                ]
            }
            for row in gsm8k(n, split)
        ]

    def gens(n: int, split: str) -> list[dict]:
        rows = []
        for row in math(n, split, "aime24"):
            truth = row["reward_model"]["ground_truth"]
            row["responses"] = [f"The answer is \\boxed{{{truth}}}.", "I do not know."]
            rows.append(row)
        return rows

    makers = {
        "gsm8k": gsm8k,
        "sft": gsm8k,
        "math": lambda n, s: math(n, s, "lighteval/MATH"),
        "dapo": lambda n, s: math(n, s, "math_dapo"),
        "tools": tools,
        "sft_messages": messages,
        "gens": gens,
    }
    data: dict[str, tuple[str, str]] = {}
    for kind, make in makers.items():
        folder = base / "data" / kind
        folder.mkdir(parents=True, exist_ok=True)
        files = []
        for split, n in (("train", 16), ("test", 4)):
            path = folder / f"{split}.parquet"
            pq.write_table(pa.Table.from_pylist(make(n, split)), path)
            files.append(str(path))
        data[kind] = (files[0], files[1])
    return Fixtures(lm=str(lm), rm=str(rm), data=data)


# ------------------------------------------------------------------ recording and running

_SHIM = """#!/bin/bash
n=$(ls "$UPSTREAM_RECORD" | wc -l)
f="$UPSTREAM_RECORD/$(printf %04d "$n")"
printf '%s\\0' "$(basename "$0")" "$@" > "$f"
exit 0
"""


def extract(upstream: str, tag: str, script_path: str, into: Path) -> None:
    """Extract the tag's examples/, recipe/ and the script's top folder into ``into``."""
    roots = {"examples", "recipe", script_path.split("/")[0]}
    listed = subprocess.run(
        ["git", "-C", upstream, "ls-tree", "--name-only", tag],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    archive = subprocess.run(
        ["git", "-C", upstream, "archive", "--format=tar", tag, *sorted(roots & set(listed))],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")


def record(script: Script, tree: Path, out: Path) -> list[list[str]]:
    """Run the script with bash under the recording shim; the argv of each python,
    python3 and torchrun call, in order."""
    shim = out / "shim"
    rec = out / "record"
    shim.mkdir()
    rec.mkdir()
    for name in ("python", "python3", "torchrun"):
        (shim / name).write_text(_SHIM)
        (shim / name).chmod(0o755)
    # a script that activates its conda environment gets this interpreter's as it is
    (shim / "conda").write_text("#!/bin/bash\nexit 0\n")
    (shim / "conda").chmod(0o755)
    home = out / "home"
    home.mkdir()
    env = {
        **os.environ,
        "PATH": f"{shim}:{os.environ['PATH']}",
        "UPSTREAM_RECORD": str(rec),
        "HOME": str(home),
        "SLURM_JOB_NUM_NODES": "1",  # a node count (a SLURM script reads it)
    }
    args = [a.format(out=out) for a in script.args]
    subprocess.run(
        ["bash", str(tree / script.path), *args],
        cwd=tree,
        env=env,
        capture_output=True,
        timeout=60,
    )
    return [[a.decode() for a in f.read_bytes().split(b"\0")[:-1]] for f in sorted(rec.iterdir())]


# exceptions that say a setting is not available here (a refusal, even with a traceback)
_REFUSALS = ("ConfigError", "AliasError", "NotSupportedYet")
_EXCEPTION = re.compile(r"^(?:\[rank\d+\]: )?([\w.]+(?:Error|Exception|NotSupportedYet)): ")


def classify(
    proc: subprocess.CompletedProcess, module: str, out: Path, cwd: Path
) -> tuple[str, str]:
    """``(result, detail)`` of one finished command: ``ran``, ``refused`` (a config error,
    or an exception that says a setting is not available here), ``crashed`` (any other
    exception) or ``no-op`` (exit 0 without the entry point's work)."""
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        for ln in lines:
            if ln.startswith(("invalid config", "error:")):
                return "refused", ln[:240]
        raised = [
            (m.group(1), ln)
            for ln in lines
            if (m := _EXCEPTION.match(ln)) and "ChildFailedError" not in m.group(1)
        ]
        if raised:
            name, ln = raised[0]
            return ("refused" if name.endswith(_REFUSALS) else "crashed"), ln[:240]
        notes = ("WARNING", "INFO", "DEBUG", "+ ", "(", "*")
        message = [ln for ln in lines if not ln.startswith(notes)]
        return "refused", (message[0] if message else f"exit code {proc.returncode}")[:240]
    trainers = (
        "verl.trainer.main_ppo",
        "verl.trainer.fsdp_sft_trainer",
        "verl.trainer.sft_trainer",
    )
    if module in trainers and "wall time" not in text:
        return "no-op", "exit 0 without a finished training run"
    if module == "verl.trainer.main_generation" and not list(out.glob("output_path/*")):
        return "no-op", "exit 0 without the output file"
    if module == "verl.trainer.main_eval" and "test_score" not in text:
        return "no-op", "exit 0 without test_score lines"
    if module == "verl.model_merger" and "merge" in proc.args and not _merged(proc.args, cwd):
        return "no-op", "exit 0 without a merged model"
    return "ran", ""


def _merged(cmd: list[str], cwd: Path) -> bool:
    """The merger's --target_dir (relative to ``cwd``) holds a model or an adapter."""
    if "--target_dir" not in cmd:
        return True
    return any((cwd / cmd[cmd.index("--target_dir") + 1]).rglob("*.safetensors"))


def run_one(
    script: Script, upstream: str, fx: Fixtures, base: Path, timeout: float, record_only: bool
) -> dict:
    """Record, substitute and run one script; its row of the table."""
    out = base / re.sub(r"[^\w.]+", "_", script.label)
    tree = out / "tree"
    tree.mkdir(parents=True)
    start = time.monotonic()
    row = {
        "script": script.label,
        "family": script.family,
        "result": "",
        "detail": "",
        "commands": [],
    }
    try:
        extract(upstream, script.tag, script.path, tree)
        recorded = record(script, tree, out)
    except (subprocess.SubprocessError, OSError, tarfile.TarError) as exc:
        row.update(result="crashed", detail=f"harness: {exc}")
        return row
    commands = []
    for argv in recorded:
        real = to_real(argv)
        if real is not None:
            commands.append(substitute(real, script, fx, out))
    row["commands"] = [shlex.join(c) for c in commands]
    if not commands:
        row.update(result="no-op", detail="the script runs no verl entry point")
    elif record_only:
        row.update(result="recorded")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled"}
    for cmd in [] if record_only else commands:
        module = cmd[cmd.index("-m") + 1] if "-m" in cmd else ""
        if module == "torch.distributed.run":
            module = cmd[cmd.index("-m", cmd.index("-m") + 1) + 1]
        try:
            proc = subprocess.run(
                cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            row.update(
                result="crashed", detail=f"timeout after {timeout:.0f} s", failed=shlex.join(cmd)
            )
            break
        (out / "last_stdout.txt").write_text(proc.stdout)
        (out / "last_stderr.txt").write_text(proc.stderr)
        result, detail = classify(proc, module, out, tree)
        row.update(result=result, detail=detail)
        if result != "ran":
            row["failed"] = shlex.join(cmd)
            break
    row["seconds"] = round(time.monotonic() - start, 1)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", default=MIRROR, help="upstream verl's git directory")
    parser.add_argument(
        "--only",
        nargs="*",
        default=None,
        help="run the scripts whose label or family contains one of these words",
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds per command")
    parser.add_argument(
        "--record-only",
        action="store_true",
        help="print the substituted commands without running them",
    )
    parser.add_argument("--keep", default=None, help="work directory to keep (default: temp)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args()
    if not Path(args.upstream).exists():
        parser.error(f"--upstream {args.upstream}: no such git directory")
    scripts = [
        s
        for s in SCRIPTS
        if not args.only or any(w.lower() in (s.label + " " + s.family).lower() for w in args.only)
    ]
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="upstream_scripts_"))
    base.mkdir(parents=True, exist_ok=True)
    fx = build_fixtures(base / "fixtures")
    rows = []
    for script in scripts:
        row = run_one(script, args.upstream, fx, base, args.timeout, args.record_only)
        rows.append(row)
        print(
            f"{row['result']:8} {row.get('seconds', 0):7.1f}s  {script.label}  {row['detail']}",
            flush=True,
        )
        if args.record_only:
            for c in row["commands"]:
                print("    " + c)
    print()
    print("| script | family | result | seconds |")
    print("|---|---|---|---|")
    for row in rows:
        result = row["result"] + (f": {row['detail']}" if row["detail"] else "")
        print(f"| `{row['script']}` | {row['family']} | {result} | {row.get('seconds', 0)} |")
    ran = sum(r["result"] == "ran" for r in rows)
    print(f"\n{ran} of {len(rows)} ran")
    for row in rows:
        if row.get("failed"):
            print(f"\n{row['script']} ({row['result']}):\n    {row['failed']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
