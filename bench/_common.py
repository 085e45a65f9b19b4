"""Helpers shared by the benchmarks: RSS sampling, allocator trimming, model directories and
running one measured configuration in a fresh child process.

Benchmarks run each configuration in its own process so that peaks are independent and
allocator caches of one configuration never count for the next.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
MiB = 1024 * 1024


# --------------------------------------------------------------------------- helpers


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or ``platform.processor()`` without one."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def trim_heap() -> None:
    import gc

    gc.collect()
    # Not glibc: no malloc_trim, and RSS then includes allocator caches.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PeakSampler:
    """Samples this process's RSS in a thread; ``phase(name)`` starts a new peak."""

    def __init__(self, interval_s: float = 0.002) -> None:
        self.interval_s = interval_s
        self.peaks: dict[str, int] = {}
        self._name = "start"
        self._peak = rss_bytes()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = rss_bytes()
            with self._lock:
                self._peak = max(self._peak, rss)
            time.sleep(self.interval_s)

    def phase(self, name: str) -> None:
        with self._lock:
            self.peaks[self._name] = max(self._peak, rss_bytes())
            self._name, self._peak = name, rss_bytes()

    def close(self) -> dict[str, int]:
        self.phase("end")
        self._stop.set()
        self._thread.join()
        return self.peaks


# Issue 14's W1/W2 tiny model: random init, hidden 256, 4 layers, 4 heads / 2 KV heads,
# MLP 1024, tied embeddings (build_tiny_model's defaults for the rest).
W2_MODEL_KWARGS = dict(
    hidden_size=256,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=1024,
    tie_word_embeddings=True,
    seed=0,
)


def w2_model_dir(workdir: Path) -> str:
    """The W2 tiny model saved under ``workdir`` (once), for benches that load by path."""
    from verl.models.tiny import save_tiny_model_dir

    path = workdir / "w2_model"
    if not path.exists():
        save_tiny_model_dir(path, **W2_MODEL_KWARGS)
    return str(path)


def model_dir_for(kind: str, workdir: Path) -> str:
    if kind == "tiny":
        from verl.models.tiny import save_tiny_model_dir

        path = workdir / "tiny_model"
        if not path.exists():
            save_tiny_model_dir(path, arch="qwen2")
        return str(path)
    from verl.models.embedded import embedded_model_dir

    return str(embedded_model_dir())


def run_child(script: str, mode: str, extra: list[str], model_dir: str) -> dict:
    """Run ``script --child MODE --model-dir DIR *extra`` in a fresh process; its last
    stdout line is a JSON object, returned. The child runs with ``MALLOC_MMAP_THRESHOLD_``
    lowered so RSS tracks live tensor memory rather than glibc's heap caches."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", PYTHONUNBUFFERED="1")
    env.setdefault("RAY_DEDUP_LOGS", "1")
    cmd = [sys.executable, script, "--child", mode, "--model-dir", model_dir, *extra]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise RuntimeError(f"child {mode} {extra} failed with exit code {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def grpo_run_overrides(
    model_dir: str, run_dir: str, prompts: int, response_length: int, train_size: int, steps: int
) -> list[str]:
    """Config overrides of the timed GRPO runs the step benchmarks share: the arithmetic
    task, ``prompts`` x 4 samples per step, one mini-batch per step, no validation, saving
    or logging, files under ``run_dir``. Each benchmark adds its own keys after these."""
    return [
        f"actor_rollout_ref.model.path={model_dir}",
        "algorithm.adv_estimator=grpo",
        f"data.train_batch_size={prompts}",
        f"data.max_response_length={response_length}",
        f"data.arithmetic.train_size={train_size}",
        "data.arithmetic.val_size=4",
        "actor_rollout_ref.rollout.n=4",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[]",
        f"trainer.default_local_dir={run_dir}",
        f"trainer.log_dir={run_dir}",
        "trainer.device=cpu",
    ]


def prompt_batch(tokenizer, count: int):
    """``count`` one-digit arithmetic chat prompts, left-padded, as a ``DataProto``."""
    from verl.protocol import DataProto

    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": f"What is {i % 9 + 1} + {(3 * i) % 9 + 1}?"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for i in range(count)
    ]
    tokenizer.padding_side = "left"
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    mask = enc["attention_mask"]
    return DataProto.from_dict(
        tensors={
            "input_ids": enc["input_ids"],
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp_min(0),
        }
    )


# --------------------------------------------------------------------------- process trees


def _children_map() -> dict[int, list[int]]:
    """``ppid -> [pid, ...]`` for every process visible in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # the process ended while we looked
            continue
        # the command name may hold spaces and parentheses: fields start after the last ')'
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(root: int) -> list[int]:
    """Pids of every live descendant of ``root`` (not ``root`` itself)."""
    children = _children_map()
    found, stack = [], list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


def pid_rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except OSError:  # gone
        return 0


def pid_private_bytes(pid: int) -> int:
    """Pages only ``pid`` maps (its USS). For a forked child this excludes the pages it
    still shares copy-on-write with its parent, which summed RSS would count twice."""
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    return total


@dataclass
class TreePeaks:
    """Peaks over a process tree's run, in bytes. ``tree`` is the root's RSS plus the
    private memory (USS) of its descendants: what the tree really holds, counting each
    shared page once. ``rss_sum`` adds the descendants' full RSS instead (overcounts forked
    children); ``root_rss`` is the root process alone."""

    tree: int = 0
    rss_sum: int = 0
    root_rss: int = 0


def run_tree_measured(
    cmd: list[str],
    env: dict[str, str],
    log_path: Path,
    interval_s: float = 0.1,
    descendants_interval_s: float = 1.0,
) -> tuple[int, TreePeaks, float]:
    """Run ``cmd`` with stdout and stderr to ``log_path`` and measure its process tree's
    memory. Returns ``(exit code, peaks, wall s)``; the peaks cover the whole run (imports
    and model loading included).

    The root's RSS is read every ``interval_s`` (cheap); descendants are found and their
    private memory read every ``descendants_interval_s``, because reading it walks their
    page tables (~10 ms per GiB mapped), which would otherwise take CPU from the run."""
    start = time.perf_counter()
    peaks = TreePeaks()
    desc_private = desc_rss = 0
    next_desc = 0.0
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                now = time.perf_counter()
                if now >= next_desc:
                    pids = descendants(proc.pid)
                    desc_private = sum(pid_private_bytes(p) for p in pids)
                    desc_rss = sum(pid_rss_bytes(p) for p in pids)
                    next_desc = now + descendants_interval_s
                root = pid_rss_bytes(proc.pid)
                peaks.root_rss = max(peaks.root_rss, root)
                peaks.tree = max(peaks.tree, root + desc_private)
                peaks.rss_sum = max(peaks.rss_sum, root + desc_rss)
                time.sleep(interval_s)
        finally:
            if proc.poll() is None:  # interrupted: leave no process behind
                proc.kill()
                proc.wait()
    return proc.returncode, peaks, time.perf_counter() - start


# --------------------------------------------------------------------------- gloo ranks


def local_nbytes(tensor) -> int:
    """Bytes this process holds of ``tensor``: a DTensor's local shard, else the tensor."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def lower_mmap_threshold(threshold: int = 65536) -> None:
    """What ``MALLOC_MMAP_THRESHOLD_`` does at start-up, for a process already running (a
    forked one): allocations of ``threshold`` bytes or more get their own mapping, returned
    to the system when freed, so RSS tracks live tensor memory."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL("libc.so.6").mallopt(-3, threshold)  # -3: M_MMAP_THRESHOLD


def _rank_entry(target, *args) -> None:
    lower_mmap_threshold()
    target(*args)


def spawn_ranks(
    target, world: int, args: tuple = (), start_method: str = "spawn", poll_s: float = 0.2
) -> list[dict]:
    """Run ``target(rank, world, port, out_path, *args)`` in ``world`` new processes (the
    target joins the gloo group itself with ``init_distributed(rank, world, "127.0.0.1",
    port)``) and return the JSON object each rank wrote to ``out_path``, in rank order.

    ``start_method``: ``"spawn"`` starts fresh interpreters; ``"fork"`` copies this one,
    so modules it imported are not imported again (seconds per rank): import what the
    ranks use first, and start no torch threads before. Either way each rank runs with
    glibc's mmap threshold lowered (:func:`lower_mmap_threshold`, as :func:`run_child`). When
    a rank fails the others, which may wait in a collective for it, are killed: no process
    is left behind.

    Raises:
        RuntimeError: a rank exited with a non-zero code (the codes are in the message).
    """
    import tempfile

    import torch.multiprocessing as mp

    from verl.utils.distributed import find_free_port

    ctx = mp.get_context(start_method)
    with tempfile.TemporaryDirectory(prefix="bench_ranks_") as tmp:
        outs = [str(Path(tmp, f"rank{r}.json")) for r in range(world)]
        port = find_free_port()
        procs = [
            ctx.Process(target=_rank_entry, args=(target, r, world, port, outs[r], *args))
            for r in range(world)
        ]
        try:
            for proc in procs:
                proc.start()
            while any(p.exitcode is None for p in procs):
                if any(p.exitcode not in (None, 0) for p in procs):
                    break
                time.sleep(poll_s)
        finally:
            for proc in procs:
                if proc.pid is None:  # never started
                    continue
                if proc.exitcode is None:
                    proc.kill()
                proc.join()
        codes = [p.exitcode for p in procs]
        if any(codes):
            raise RuntimeError(f"ranks of a {world}-rank run exited with codes {codes}")
        return [json.loads(Path(o).read_text()) for o in outs]
