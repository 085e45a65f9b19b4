"""Benchmark: RL step time with a slow reward, scored after generation vs overlapped with it,
side by side in one run.

The reward is a scoring service on 127.0.0.1 (a thread of the measured process) that sleeps
``--reward-ms`` (50) per sample and answers ``{"score": ...}`` (1 when the response holds
the ground truth), called one sample per request with ``--concurrency`` (2) requests in
flight (``reward_model.remote.*``). The workload: the tiny Qwen2 of ``bench_async.py``
(random init, hidden 256, 4 layers), ``--prompts`` (16) prompts x 4 samples, ``--response-length``
(32) new tokens, GRPO, fp32, the built-in arithmetic prompts, the native rollout, one torch
thread. ``after``: the whole batch is generated, then scored
(``reward_model.overlap.num_chunks=1``); ``overlap``: the prompts are generated in
``--chunks`` (4) chunks and each chunk is scored in the background while the next one
generates (``reward_model.overlap.num_chunks``). Each configuration trains ``--steps``
steps through ``RLTrainer`` in a fresh process; the configurations alternate over
``--repeats`` rounds. Reported: medians over steps after the first, then over repeats, of
``timing_s/step``, ``timing_s/gen`` (generation, with the overlapped scoring of all chunks
but the last) and ``timing_s/reward`` (what is left of scoring after generation), with
overlap/after ratios, as a table and JSON.

    python bench/bench_reward_overlap.py                  # about 2 minutes on 2 shared cores
    python bench/bench_reward_overlap.py --steps 3 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

from _common import grpo_run_overrides, w2_model_dir

STAGES = ("timing_s/step", "timing_s/gen", "timing_s/reward")


def _serve(delay_s: float) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            time.sleep(delay_s)
            score = float(str(body["ground_truth"]) in body["response"])
            data = json.dumps({"score": score}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    Thread(target=server.serve_forever, daemon=True).start()
    return server


def _child(args) -> dict:
    import torch

    from verl.config import load_config
    from verl.trainer.lifecycle.tracking import Tracker
    from verl.trainer.rl.trainer import RLTrainer

    torch.set_num_threads(args.threads)
    server = _serve(args.reward_ms / 1000)
    chunks = args.chunks if args.config == "overlap" else 1
    try:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = load_config(
                overrides=[
                    *grpo_run_overrides(
                        args.model_dir,
                        tmp,
                        args.prompts,
                        args.response_length,
                        args.prompts * args.steps,
                        args.steps,
                    ),
                    "trainer.mixed_precision=none",
                    f"reward_model.remote.url=http://127.0.0.1:{server.server_address[1]}/score",
                    f"reward_model.remote.concurrency={args.concurrency}",
                    "reward_model.max_failure_rate=1.0",
                    f"reward_model.overlap.num_chunks={chunks}",
                ]
            )
            trainer = RLTrainer(cfg, tracker=Tracker([]))
            trainer.fit()
            trainer.close()
    finally:
        server.shutdown()
        server.server_close()
    history = trainer.history[1:] or trainer.history
    return {k: statistics.median(row.get(k, 0.0) for row in history) for k in STAGES} | {
        "score_mean": statistics.mean(row["reward/score_mean"] for row in trainer.history)
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--response-length", type=int, default=32)
    parser.add_argument("--reward-ms", type=float, default=50.0)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--config", default="after", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args)))
        return
    configs = ("after", "overlap")
    results: dict[str, list[dict]] = {name: [] for name in configs}
    load_before = os.getloadavg()[0]
    passed = ["--steps", args.steps, "--prompts", args.prompts, "--threads", args.threads]
    passed += ["--response-length", args.response_length, "--reward-ms", args.reward_ms]
    passed += ["--concurrency", args.concurrency, "--chunks", args.chunks]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = w2_model_dir(Path(tmp))
        for _ in range(args.repeats):
            for name in configs:
                cmd = [sys.executable, __file__, "--child", "--config", name]
                cmd += ["--model-dir", model_dir, *map(str, passed)]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
                if proc.returncode != 0:
                    sys.stderr.write(proc.stderr[-4000:])
                    raise SystemExit(f"{name} failed")
                results[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
                r = results[name][-1]
                print(f"  {name}: {r['timing_s/step']:.2f} s/step", file=sys.stderr)
    summary = {
        name: {k: statistics.median(r[k] for r in runs) for k in (*STAGES, "score_mean")}
        for name, runs in results.items()
    }
    after, overlap = summary["after"], summary["overlap"]
    print(f"{'metric':20} {'after':>9} {'overlap':>9} {'overlap/after':>14}")
    for key in STAGES:
        a, o = after[key], overlap[key]
        ratio = f"{o / a:14.2f}" if a else f"{'-':>14}"
        print(f"{key:20} {a:9.2f} {o:9.2f} {ratio}")
    load = {"before": load_before, "after": os.getloadavg()[0]}
    info = {"args": vars(args), "nproc": os.cpu_count(), "load_avg_1min": load}
    print(json.dumps(info | {"summary": summary}))


if __name__ == "__main__":
    main()
