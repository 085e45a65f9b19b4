"""Upstream verl's offline-generation entry point, so that its command lines run as written:

    python -m verl.trainer.main_generation model.path=MODEL data.path=test.parquet \\
        data.prompt_key=prompt data.n_samples=4 data.output_path=gens.parquet \\
        rollout.temperature=1.0 rollout.top_p=0.7 rollout.response_length=256

It does what ``verl generate`` does (:func:`verl.trainer.rl.generation.generate_rows`: the
configured rollout backend, the validation reward scorers): each upstream key becomes the
native config key it means; the output holds the input's columns (``reward_model``,
``ability``, ... as upstream's does) and upstream's ``responses`` column (a list of
``data.n_samples`` texts per prompt) among ``verl generate``'s columns (their scores,
log-probs, lengths). Keys for machinery this build does not have (``trainer.nnodes``,
``rollout.gpu_memory_utilization``, ...) are dropped with a note; any other key is refused
with the list of the ones read.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import yaml

logger = logging.getLogger(__name__)

ROLLOUT = "actor_rollout_ref.rollout"
# upstream key -> the native config key it sets
KEYS = {
    "model.path": "actor_rollout_ref.model.path",
    "model.trust_remote_code": "actor_rollout_ref.model.trust_remote_code",
    "data.prompt_key": "data.prompt_key",
    "data.n_samples": f"{ROLLOUT}.n",
    "rollout.name": f"{ROLLOUT}.name",
    "rollout.temperature": f"{ROLLOUT}.temperature",
    "rollout.top_p": f"{ROLLOUT}.top_p",
    "rollout.top_k": f"{ROLLOUT}.top_k",
    "rollout.do_sample": f"{ROLLOUT}.do_sample",
    "rollout.response_length": "data.max_response_length",
    "rollout.prompt_length": "data.max_prompt_length",
}
# where the prompts come from and where the rows go (not config keys)
FILES = ("data.path", "data.output_path", "data.batch_size")
# upstream keys of machinery this build does not have: placement and engine speed only
DROPPED = (
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "rollout.tensor_model_parallel_size",
    "rollout.gpu_memory_utilization",
    "rollout.enforce_eager",
    "rollout.free_cache_engine",
    "rollout.max_num_batched_tokens",
    "rollout.log_prob_micro_batch_size_per_gpu",
    "rollout.micro_batch_size",
)


def translate(argv: list[str]) -> tuple[list[str], dict[str, Any]]:
    """``(config overrides, {data.path, data.output_path, data.batch_size})`` of upstream's
    ``key=value`` arguments; ``ValueError`` names a key it does not read."""
    overrides: list[str] = []
    files: dict[str, Any] = {"data.batch_size": 16}
    for arg in argv:
        key, sep, raw = arg.lstrip("+").partition("=")
        if not sep:
            raise ValueError(f"{arg!r}: expected key=value (upstream's Hydra overrides)")
        if key in KEYS:
            overrides.append(f"{KEYS[key]}={raw}")
        elif key in FILES:
            files[key] = yaml.safe_load(raw)
        elif key in DROPPED:
            logger.warning("%s is dropped: placement and engine settings do not apply here", arg)
        else:
            read = ", ".join(sorted([*KEYS, *FILES]))
            raise ValueError(f"{key}: not an upstream main_generation key read here ({read})")
    for key in ("data.path", "data.output_path"):
        if files.get(key) is None:
            raise ValueError(f"{key} is required")
    return overrides, files


def with_input_columns(rows: list[dict[str, Any]], paths: list[str]) -> list[dict[str, Any]]:
    """``rows`` with the input's columns upstream's output keeps (``reward_model``,
    ``ability`` and any other column the generation rows lack), row by row.

    ``reward_model`` is ``{"style": "rule", "ground_truth": ...}`` from the row's ground
    truth when the input rows cannot be matched one to one (prompts dropped by
    ``data.truncation=drop``): then only it is carried, and a warning says so."""
    from verl.data import read_records

    inputs: list[dict[str, Any]] = []
    for path in paths:
        inputs += [record.data or {} for record in read_records(path).records]
    if len(inputs) != len(rows):
        logger.warning(
            "%d generated rows for %d input rows (prompts were dropped): only reward_model "
            "is carried into the output, from each row's ground truth",
            len(rows),
            len(inputs),
        )
        return [
            row
            if "reward_model" in row or "ground_truth" not in row
            else {**row, "reward_model": {"style": "rule", "ground_truth": row["ground_truth"]}}
            for row in rows
        ]
    return [
        {**{k: v for k, v in source.items() if k not in row}, **row}
        for source, row in zip(inputs, rows, strict=True)
    ]


def main(argv: list[str] | None = None) -> int:
    """Command-line entry; 0 written, 2 for bad arguments, config or data."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    prog = "python -m verl.trainer.main_generation"
    try:
        overrides, files = translate(sys.argv[1:] if argv is None else list(argv))
    except ValueError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    from verl.config import ConfigError, load_config
    from verl.data import DatasetValidationError, write_records
    from verl.trainer.rl.generation import generate_rows

    paths = files["data.path"]
    paths = [str(p) for p in paths] if isinstance(paths, list) else [str(paths)]
    try:
        cfg = load_config(overrides=overrides)
        rows = generate_rows(cfg, paths, batch_size=int(files["data.batch_size"]))
    except (ConfigError, DatasetValidationError, ValueError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    rows = with_input_columns(rows, paths)
    path = write_records(rows, str(files["data.output_path"]))
    print(f"wrote {len(rows)} prompts x {cfg.actor_rollout_ref.rollout.n} responses to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
