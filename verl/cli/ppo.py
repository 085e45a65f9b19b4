"""Entry point of PPO/GRPO training: ``python -m verl.trainer.main_ppo [--config FILE] key=value ...``

The config is loaded, overridden and validated before anything heavy is imported: a
config error is printed to stderr with exit code 2 without importing torch. Only then is
the training loop (``verl.trainer.rl.trainer.RLTrainer``) imported and run.

    python -m verl.trainer.main_ppo data.train_batch_size=16 actor_rollout_ref.rollout.n=4
    python -m verl.trainer.main_ppo --config my.yaml --print-config
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl.config import ConfigError, TrainerConfig, load_config, to_yaml
from verl.config.load import ConfigProblem

# upstream's --config-path is relative to its entry module, verl/trainer/main_ppo.py
_TRAINER_DIR = Path(__file__).resolve().parents[1] / "trainer"

EXIT_CONFIG_ERROR = 2
# the run stopped on an error its message explains (checkpoint, run lock, divergence)
EXIT_RUN_ERROR = 1


def add_config_file_args(parser: argparse.ArgumentParser) -> None:
    """``--config FILE``, and Hydra's spelling of it that upstream verl's scripts use:
    ``--config-path DIR --config-name NAME`` (see :func:`config_file`)."""
    parser.add_argument("--config", metavar="FILE", help="YAML file merged over the defaults")
    parser.add_argument(
        "--config-path", metavar="DIR", help="Hydra style: the directory of --config-name"
    )
    parser.add_argument(
        "--config-name",
        metavar="NAME",
        help="Hydra style: NAME.yaml in --config-path (the packaged defaults' own name, e.g. "
        "ppo_trainer, means the defaults)",
    )


def config_file(args: argparse.Namespace, defaults_name: str) -> str | None:
    """The YAML file the arguments name: ``--config``, or ``--config-name`` looked up in
    ``--config-path`` (relative to the working directory, then to ``verl/trainer``, as
    Hydra resolves it beside the entry module). The packaged defaults' own name
    (``defaults_name``) not found there means the defaults. Raises ``ConfigError``."""
    name, where = args.config_name, args.config_path
    if name is None:
        if where is not None:
            raise ConfigError([ConfigProblem("--config-path", "--config-path needs --config-name")])
        return args.config
    if args.config is not None:
        raise ConfigError(
            [ConfigProblem("--config-name", "give --config or --config-name, not both")]
        )
    stem = name[: -len(".yaml")] if name.endswith(".yaml") else name
    tried = []
    for base in (Path(where or "."), _TRAINER_DIR / (where or "config")):
        candidate = base / f"{stem}.yaml"
        if candidate.is_file() and candidate.resolve() != _packaged(defaults_name):
            return str(candidate)
        tried.append(str(candidate))
    if stem == defaults_name:
        return None
    if "megatron" in stem:
        raise ConfigError(
            [
                ConfigProblem(
                    "--config-name",
                    f"--config-name {name!r}: upstream's Megatron-LM config; there is no "
                    "Megatron engine here (Megatron-Core needs CUDA GPUs). The same training "
                    "runs with FSDP2: drop --config-name and the megatron.* keys and set "
                    "actor_rollout_ref.actor.strategy=fsdp2 (critic.strategy=fsdp2), or auto",
                )
            ]
        )
    raise ConfigError(
        [
            ConfigProblem(
                "--config-name",
                f"--config-name {name!r}: no such file (looked for {', '.join(tried)}); this build's "
                f"packaged config is {defaults_name} (its defaults), anything else is a YAML "
                "file of yours (--config FILE)",
            )
        ]
    )


def _packaged(name: str) -> Path:
    return (_TRAINER_DIR / "config" / f"{name}.yaml").resolve()


def build_parser(prog: str = "python -m verl.trainer.main_ppo") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Train a language model with PPO/GRPO. Settings: docs/config.md.",
    )
    add_config_file_args(parser)
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config as YAML and exit"
    )
    parser.add_argument("--validate-only", action="store_true", help="validate the config and exit")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted overrides, e.g. actor_rollout_ref.actor.optim.lr=1e-6",
    )
    return parser


def config_from_argv(
    argv: list[str], prog: str | None = None
) -> tuple[TrainerConfig, argparse.Namespace]:
    """Parse arguments and load the validated config (raises ``ConfigError``). Torch-free."""
    parser = build_parser() if prog is None else build_parser(prog)
    args = parser.parse_intermixed_args(argv)
    return load_config(config_file(args, "ppo_trainer"), args.overrides), args


def run_ppo(cfg: TrainerConfig) -> dict:
    """Run the training loop on a validated config (imports the torch-heavy modules).

    Returns the trainer's results (validation before/after, last metrics, saved model dir,
    and ``plot``: the run's ``metrics.png`` when it logged jsonl and matplotlib is there).
    """
    import transformers

    from verl.trainer.lifecycle.plot import plot_after_run
    from verl.trainer.rl.trainer import RLTrainer

    # One progress bar (the trainer's) rather than one per weight load and save.
    transformers.utils.logging.disable_progress_bar()
    trainer = RLTrainer(cfg)
    results = trainer.fit()
    plot = plot_after_run(trainer.tracker.jsonl_path)
    if plot is not None:
        results["plot"] = str(plot)
    return results


def format_results(results: dict, seconds: float) -> str:
    """A before/after validation table and the run's wall time, for the console."""
    if "val_only" in results:  # trainer.val_only: one validation, nothing trained
        where = results.get("resumed_from") or "the initial model"
        lines = [f"validation of {where}:"]
        lines += [f"  {k}: {v:.4f}" for k, v in sorted(results["val_only"].items())]
        lines.append(f"wall time: {seconds / 60:.1f} min")
        return "\n".join(lines)
    before = results.get("val_before", {})
    after = results.get("val_after", {})
    lines = []
    keys = sorted(k for k in after if k.startswith("val/acc"))
    if keys:
        width = max(len(k) for k in keys)
        lines.append(f"{'validation':<{width}}  {'before':>8}  {'after':>8}")
        for key in keys:
            b = before.get(key)
            b_text = f"{b:8.3f}" if b is not None else f"{'-':>8}"
            lines.append(f"{key:<{width}}  {b_text}  {after[key]:8.3f}")
    lines.append(f"wall time: {seconds / 60:.1f} min; actor saved to {results.get('hf_dir')}")
    if results.get("plot"):
        lines.append(f"metrics plotted to {results['plot']} (verl plot RUN_DIR draws any run)")
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Command-line entry; returns the exit code (0 ok, 1 a run error its message explains,
    2 bad config, 128 + N stopped by signal N: 143 SIGTERM, 130 SIGINT)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg, args = config_from_argv(sys.argv[1:] if argv is None else argv, prog)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return EXIT_CONFIG_ERROR
    return execute(cfg, args, run_ppo, format_results)


def execute(
    cfg: Any,
    args: argparse.Namespace,
    run: Callable[[Any], dict],
    report: Callable[[dict, float], str],
) -> int:
    """The actions after a config loaded: print it, or validate only, or ``run`` and report."""
    if args.print_config:
        sys.stdout.write(to_yaml(cfg))
        return 0
    if args.validate_only:
        print("config OK")
        return 0
    from verl.engine.base import NonFiniteLossError
    from verl.trainer.lifecycle.checkpoint import CheckpointError
    from verl.trainer.lifecycle.run_lock import RunLockError
    from verl.trainer.lifecycle.stopping import RunInterrupted, TrainingDivergedError

    # errors whose message says all a user needs (which file, which step, what to do)
    run_errors = (CheckpointError, RunLockError, NonFiniteLossError, TrainingDivergedError)
    start = time.perf_counter()
    try:
        results = run(cfg)
    except RunInterrupted as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    except run_errors as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_RUN_ERROR
    print(report(results, time.perf_counter() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
