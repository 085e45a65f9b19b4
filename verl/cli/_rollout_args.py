"""Options shared by ``verl generate`` and ``verl eval``: the model, the prompts and how to
sample, turned into a validated :class:`~verl.config.TrainerConfig` (so each means what
the same key means in training; any other key can be given as ``key=value``)."""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROLLOUT = "actor_rollout_ref.rollout"


def add_rollout_args(parser: argparse.ArgumentParser, data_required: bool = True) -> None:
    parser.add_argument(
        "--model",
        metavar="DIR",
        help="HuggingFace model directory (e.g. a run's huggingface/ or a `verl export`); "
        "default: actor_rollout_ref.model.path (the embedded SmolLM2-135M-Instruct)",
    )
    parser.add_argument(
        "--data",
        nargs="+",
        required=data_required,
        metavar="FILE",
        help="prompt dataset(s) in verl's format, parquet or jsonl (`verl data` makes some)",
    )
    parser.add_argument(
        "--n", type=int, default=1, help="responses per prompt (rollout.n; default 1)"
    )
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)"
    )
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (default 1.0)")
    parser.add_argument("--top-k", type=int, default=-1, help="top-k; -1 = off (default)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true", help="argmax decoding")
    mode.add_argument("--sample", action="store_true", help="sample at --temperature")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        help="tokens per response at most (data.max_response_length; default: that of the run "
        "which trained --model when its config.yaml is found, else the config's)",
    )
    parser.add_argument(
        "--max-prompt-length", type=int, help="prompt tokens at most (data.max_prompt_length)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=16, help="prompts per generate call (default 16)"
    )
    parser.add_argument("--limit", type=int, help="only the first N prompts")
    parser.add_argument(
        "--rollout", help="rollout backend (rollout.name: native, hf, ...; default native)"
    )
    parser.add_argument(
        "--seed", type=int, help="sampling seed (rollout.seed; default trainer.seed)"
    )
    parser.add_argument("--config", metavar="FILE", help="YAML file merged over the defaults")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="any other config key, e.g. data.prompt_key=question or "
        "custom_reward_function.path=my_reward.py",
    )


def rollout_overrides(args: argparse.Namespace) -> list[str]:
    """The dotted overrides the options stand for (the user's key=value come after them)."""
    out = [f"{ROLLOUT}.n={args.n}"]
    # greedy unless asked to sample, or when n > 1 (n identical greedy answers say nothing)
    greedy = args.greedy or (args.n == 1 and not args.sample)
    out += [f"{ROLLOUT}.do_sample={'false' if greedy else 'true'}"]
    out += [f"{ROLLOUT}.temperature={args.temperature}", f"{ROLLOUT}.top_p={args.top_p}"]
    out += [f"{ROLLOUT}.top_k={args.top_k}"]
    optional: dict[str, Any] = {
        "actor_rollout_ref.model.path": args.model,
        "data.max_response_length": args.max_new_tokens,
        "data.max_prompt_length": args.max_prompt_length,
        f"{ROLLOUT}.name": args.rollout,
        f"{ROLLOUT}.seed": args.seed,
    }
    out += [f"{key}={value}" for key, value in optional.items() if value is not None]
    return out


class _TrainingOnly(logging.Filter):
    """Config warnings about the algorithm section concern training, not sampling."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "algorithm." not in record.getMessage()


@contextlib.contextmanager
def _quiet_training_warnings() -> Iterator[None]:
    from verl.config import load  # its logger is the one that emits the config's warnings

    flt = _TrainingOnly()
    load.logger.addFilter(flt)
    try:
        yield
    finally:
        load.logger.removeFilter(flt)


def run_config_file(model: str | None) -> Path | None:
    """The ``config.yaml`` of the run that wrote the model directory ``model``, or None.

    A run writes its final model to ``{trainer.default_local_dir}/huggingface`` and its
    resolved config into every checkpoint (``global_step_N/config.yaml``); a checkpoint's
    own ``global_step_N/actor/huggingface`` sits two levels below that file. Looks in the
    directory and its two parents, each either holding ``config.yaml`` or being the
    checkpoint root of the run (its newest complete checkpoint's config).
    """
    if model is None or not Path(model).is_dir():
        return None
    from verl.trainer.lifecycle.checkpoint import CONFIG_FILE, latest_checkpoint

    here = Path(model).resolve()
    for folder in (here, *list(here.parents)[:2]):
        if (folder / CONFIG_FILE).is_file():
            return folder / CONFIG_FILE
        newest = latest_checkpoint(folder)
        if newest is not None and (newest / CONFIG_FILE).is_file():
            return newest / CONFIG_FILE
    return None


def run_overrides(args: argparse.Namespace) -> list[str]:
    """The lengths of the run that trained ``--model`` (``data.max_response_length``,
    ``data.max_prompt_length``), as overrides placed before every option and ``key=value``
    of the command line; nothing when ``--config`` is given or no run config is found."""
    path = None if args.config is not None else run_config_file(args.model)
    if path is None:
        return []
    from verl.utils.yaml_text import load_yaml_text

    data = (load_yaml_text(path.read_text()) or {}).get("data") or {}
    keys = ("max_response_length", "max_prompt_length")
    out = [f"data.{key}={data[key]}" for key in keys if isinstance(data.get(key), int)]
    if out:
        logging.getLogger(__name__).info(
            "lengths of the run that trained the model (%s): %s", path, ", ".join(out)
        )
    return out


def load_rollout_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Any:
    """The validated config of the options; bad option values are usage errors (exit 2),
    a bad config raises ``ConfigError``."""
    for name in ("n", "batch_size", "limit", "max_new_tokens", "max_prompt_length"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} {value}: must be >= 1")
    from verl.config import load_config

    with _quiet_training_warnings():
        overrides = [*run_overrides(args), *rollout_overrides(args), *args.overrides]
        return load_config(args.config, overrides)
