"""Upstream verl's evaluation entry point, so that its command lines run as written:

    python -m verl.trainer.main_eval data.path=gens.parquet data.response_key=responses \\
        data.data_source_key=data_source data.reward_model_key=reward_model \\
        custom_reward_function.path=my_reward.py custom_reward_function.name=compute_score

It scores a generations file (one row per prompt with a list of responses, as
``main_generation`` or ``verl generate`` write it; the ground truth is the row's
``ground_truth`` column or ``<reward_model_key>.ground_truth``, upstream's layout) with the
scorer of each row's data source (or the custom reward function), and prints ``verl eval``'s
table (per data source: prompts, acc/mean@n, score/mean@n, pass@k) and upstream's
``test_score/<data_source>`` lines (the mean score).
"""

from __future__ import annotations

import logging
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

logger = logging.getLogger(__name__)

# upstream key -> default
DATA_KEYS = {
    "data.path": None,
    "data.response_key": "responses",
    "data.data_source_key": "data_source",
    "data.reward_model_key": "reward_model",
    "data.prompt_key": "prompt",
}
REWARD_KEYS = ("custom_reward_function.path", "custom_reward_function.name")
DROPPED = ("ray_init.num_cpus", "ray_init.timeline_json_file")


def translate(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """``({data key: value}, config overrides)``; ``ValueError`` names a key not read."""
    data = dict(DATA_KEYS)
    overrides = []
    for arg in argv:
        key, sep, raw = arg.lstrip("+").partition("=")
        if not sep:
            raise ValueError(f"{arg!r}: expected key=value (upstream's Hydra overrides)")
        if key in DATA_KEYS:
            data[key] = yaml.safe_load(raw)
        elif key in REWARD_KEYS:
            overrides.append(f"{key}={raw}")
        elif key in DROPPED:
            logger.warning("%s is dropped: scoring runs in this process", arg)
        else:
            read = ", ".join(sorted([*DATA_KEYS, *REWARD_KEYS]))
            raise ValueError(f"{key}: not an upstream main_eval key read here ({read})")
    if data["data.path"] is None:
        raise ValueError("data.path is required")
    return data, overrides


def rows_of(path: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """The file's rows as ``verl eval`` reads them (``data_source``, ``responses``,
    ``ground_truth``, ``extra_info``), from upstream's column names."""
    import pyarrow.parquet as pq

    if not Path(path).is_file():
        raise FileNotFoundError(f"data.path={path!r} does not exist")
    out = []
    for i, row in enumerate(pq.read_table(path).to_pylist()):
        where = f"{path} row {i}"
        source_key, response_key = data["data.data_source_key"], data["data.response_key"]
        missing = [k for k in (source_key, response_key) if k not in row]
        if missing:
            raise ValueError(f"{where}: missing column(s) {missing}")
        truth = row.get("ground_truth")
        if truth is None:
            holder = row.get(data["data.reward_model_key"])
            truth = holder.get("ground_truth") if isinstance(holder, dict) else None
        if truth is None:
            raise ValueError(
                f"{where}: no ground truth (neither ground_truth nor "
                f"{data['data.reward_model_key']}.ground_truth)"
            )
        responses = row[response_key]
        responses = [responses] if isinstance(responses, str) else list(responses)
        out.append(
            {
                "data_source": row[source_key],
                "responses": responses,
                "ground_truth": truth,
                "extra_info": row.get("extra_info"),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry; 0 printed, 2 for bad arguments or data."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    prog = "python -m verl.trainer.main_eval"
    from verl.config import ConfigError, load_config
    from verl.trainer.rl.build import load_compute_score
    from verl.trainer.rl.evaluation import evaluate_rows, format_report, score_rows

    try:
        data, overrides = translate(sys.argv[1:] if argv is None else list(argv))
        compute_score = load_compute_score(load_config(overrides=overrides))
        rows = score_rows(rows_of(str(data["data.path"]), data), compute_score)
        report = evaluate_rows(rows)
    except (ConfigError, ValueError, FileNotFoundError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    print(format_report(report))
    by_source: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        by_source[row["data_source"]] += row["scores"]
    for source, scores in sorted(by_source.items()):
        print(f"test_score/{source}: {sum(scores) / len(scores):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
