"""Generate synthetic visual question datasets (images drawn with PIL) in verl's image
prompt format.

    python -m verl.data.visual_tasks --out data/shapes --train-size 1000 --val-size 100 \\
        --tasks colour count --seed 0 --format parquet

writes ``train.parquet`` and ``test.parquet`` (or ``.jsonl``). Two tasks:

    colour  one filled square of a colour from :data:`COLOURS` on a light grey background
            "<image>What colour is the square? Answer with one word."     ground truth "red"
    count   1-5 filled circles of one colour, not overlapping
            "<image>How many circles are there? Answer with just the number."    "3"

Each row (geo3k layout, ``verl.data.vision``):

    data_source   "visual_shapes"    (scored by verl.rewards.scorers.visual_shapes)
    prompt        [{"role": "user", "content": "<image>What colour ..."}]
    images        [{"bytes": <PNG>}] (parquet), or [{"path": "images/train_00000.png"}]
                  (JSON lines, and parquet with image_storage="path"; relative to the file)
    ability       "visual"
    reward_model  {"style": "rule", "ground_truth": "red"}
    extra_info    {"split", "index", "task", "answer", "choices"}

``choices`` lists the answers the task can have (the scorer reads the last one named).
Rows are drawn from ``random.Random`` seeded with ``2 * seed`` (train) and ``2 * seed + 1``
(test), one task per row uniformly over ``tasks``, so a seed gives the same files (PNG
encoding is deterministic). Images are ``image_size`` pixels square (default 56: 4 image
tokens for Qwen2-VL's processor at its smallest).
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import random
import sys
from collections.abc import Sequence
from typing import Any

from verl.data.io import write_records

logger = logging.getLogger(__name__)

__all__ = [
    "COLOURS",
    "DATA_SOURCE",
    "MAX_CIRCLES",
    "TASKS",
    "draw_task",
    "make_visual_rows",
    "write_visual_dataset",
]

DATA_SOURCE = "visual_shapes"
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 170, 50),
    "blue": (30, 60, 220),
    "yellow": (240, 210, 20),
    "purple": (140, 40, 170),
    "orange": (245, 130, 20),
}
BACKGROUND = (235, 235, 235)
MAX_CIRCLES = 5
TASKS = ("colour", "count")
FORMATS = ("parquet", "jsonl")
STORAGES = ("bytes", "path")
QUESTIONS = {
    "colour": "<image>What colour is the square? Answer with one word.",
    "count": "<image>How many circles are there? Answer with just the number.",
}
CHOICES = {
    "colour": list(COLOURS),
    "count": [str(n) for n in range(1, MAX_CIRCLES + 1)],
}


def _png(image: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _draw_colour(rng: random.Random, size: int) -> tuple[Any, str]:
    from PIL import Image, ImageDraw

    name = rng.choice(list(COLOURS))
    image = Image.new("RGB", (size, size), BACKGROUND)
    side = rng.randint(size // 3, size * 2 // 3)
    x, y = rng.randint(0, size - side), rng.randint(0, size - side)
    ImageDraw.Draw(image).rectangle([x, y, x + side - 1, y + side - 1], fill=COLOURS[name])
    return image, name


def _draw_count(rng: random.Random, size: int) -> tuple[Any, str]:
    from PIL import Image, ImageDraw

    count = rng.randint(1, MAX_CIRCLES)
    colour = COLOURS[rng.choice(list(COLOURS))]
    image = Image.new("RGB", (size, size), BACKGROUND)
    draw = ImageDraw.Draw(image)
    radius = max(2, size // 14)
    placed: list[tuple[int, int]] = []
    # rejection sampling of centres at least 2 radii + a gap apart; a fresh grid of
    # candidate cells when it keeps failing (always room for MAX_CIRCLES at size >= 28)
    while len(placed) < count:
        for _ in range(200):
            cx = rng.randint(radius + 1, size - radius - 2)
            cy = rng.randint(radius + 1, size - radius - 2)
            if all((cx - px) ** 2 + (cy - py) ** 2 > (2 * radius + 3) ** 2 for px, py in placed):
                placed.append((cx, cy))
                break
        else:
            placed.clear()
    for cx, cy in placed:
        draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=colour)
    return image, str(count)


_DRAW = {"colour": _draw_colour, "count": _draw_count}


def draw_task(task: str, rng: random.Random, size: int = 56) -> tuple[Any, str]:
    """One image of ``task`` drawn from ``rng``, and its answer (a colour word or a count)."""
    if task not in _DRAW:
        raise ValueError(f"task {task!r} is not one of {TASKS}")
    if size < 28:
        raise ValueError(f"image_size={size} is too small; use at least 28 pixels")
    return _DRAW[task](rng, size)


def make_visual_rows(
    n: int,
    split: str,
    seed: int,
    tasks: Sequence[str] = TASKS,
    image_size: int = 56,
) -> list[tuple[dict[str, Any], bytes]]:
    """``n`` rows of ``split`` without their ``images`` column, each with its PNG bytes."""
    bad = [t for t in tasks if t not in TASKS]
    if bad or not tasks:
        raise ValueError(f"tasks {list(tasks)}: choose one or more of {TASKS}")
    if n < 1:
        raise ValueError(f"n={n} must be >= 1")
    rng = random.Random(seed)
    rows = []
    for index in range(n):
        task = rng.choice(list(tasks))
        image, answer = draw_task(task, rng, image_size)
        row = {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": QUESTIONS[task]}],
            "ability": "visual",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {
                "split": split,
                "index": index,
                "task": task,
                "answer": answer,
                "choices": CHOICES[task],
            },
        }
        rows.append((row, _png(image)))
    return rows


def write_visual_dataset(
    out_dir: str | os.PathLike,
    train_size: int = 1000,
    val_size: int = 100,
    tasks: Sequence[str] = TASKS,
    seed: int = 0,
    fmt: str = "parquet",
    image_size: int = 56,
    image_storage: str | None = None,
) -> tuple[str, str]:
    """Write ``train.<fmt>`` and ``test.<fmt>`` into ``out_dir``; returns their paths.

    ``image_storage``: ``"bytes"`` (in the file; parquet only) or ``"path"`` (PNG files
    under ``out_dir/images/``, referenced relative to the data file); default bytes for
    parquet, paths for JSON lines.
    """
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {FORMATS}")
    storage = image_storage or ("bytes" if fmt == "parquet" else "path")
    if storage not in STORAGES:
        raise ValueError(f"image_storage {storage!r} is not one of {STORAGES}")
    if storage == "bytes" and fmt != "parquet":
        raise ValueError("JSON lines files cannot hold image bytes: use image_storage='path'")
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for split, n, split_seed in (("train", train_size, 2 * seed), ("test", val_size, 2 * seed + 1)):
        rows = []
        for row, png in make_visual_rows(n, split, split_seed, tasks, image_size):
            if storage == "bytes":
                row["images"] = [{"bytes": png}]
            else:
                rel = os.path.join("images", f"{split}_{row['extra_info']['index']:05d}.png")
                os.makedirs(os.path.join(out_dir, "images"), exist_ok=True)
                with open(os.path.join(out_dir, rel), "wb") as f:
                    f.write(png)
                row["images"] = [{"path": rel}]
            rows.append(row)
        paths.append(write_records(rows, os.path.join(out_dir, f"{split}.{fmt}")))
    logger.info("wrote %s (%d rows) and %s (%d rows)", paths[0], train_size, paths[1], val_size)
    return paths[0], paths[1]


def _build_parser(prog: str = "python -m verl.data.visual_tasks") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description="Generate synthetic visual question datasets (PIL drawings)."
    )
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--train-size", type=int, default=1000)
    p.add_argument("--val-size", type=int, default=100)
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", choices=FORMATS, default="parquet", dest="fmt")
    p.add_argument("--image-size", type=int, default=56, help="pixels per side (>= 28)")
    p.add_argument(
        "--image-storage",
        choices=STORAGES,
        default=None,
        help="image bytes in the file (parquet only) or PNG files beside it",
    )
    return p


def main(argv: Sequence[str] | None = None, prog: str = "python -m verl.data.visual_tasks") -> int:
    parser = _build_parser(prog)
    args = parser.parse_args(argv)
    if args.train_size < 1 or args.val_size < 1:
        parser.error("--train-size and --val-size must be >= 1")
    try:
        train_path, val_path = write_visual_dataset(
            args.out,
            args.train_size,
            args.val_size,
            args.tasks,
            args.seed,
            args.fmt,
            args.image_size,
            args.image_storage,
        )
    except ValueError as e:
        parser.error(str(e))
    print(f"train: {train_path} ({args.train_size} rows)")
    print(f"val:   {val_path} ({args.val_size} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
