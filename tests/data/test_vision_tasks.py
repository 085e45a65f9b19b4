"""Tests for verl/data/visual_tasks.py (synthetic PIL image questions) and its scorer,
verl/rewards/scorers/visual_shapes.py."""

from __future__ import annotations

import io
import os
import random

import pytest
from PIL import Image

from verl.data.io import read_records
from verl.data.vision import process_prompt, read_vision_rows
from verl.data.visual_tasks import (
    BACKGROUND,
    COLOURS,
    DATA_SOURCE,
    draw_task,
    main,
    make_visual_rows,
    write_visual_dataset,
)
from verl.rewards.scorers.registry import get_scorer
from verl.rewards.scorers.visual_shapes import compute_score


def _count_blobs(image: Image.Image) -> int:
    """Connected non-background regions (4-neighbour flood fill)."""
    w, h = image.size
    px = image.load()
    seen = set()
    blobs = 0
    for y in range(h):
        for x in range(w):
            if (x, y) in seen or px[x, y] == BACKGROUND:
                continue
            blobs += 1
            stack = [(x, y)]
            seen.add((x, y))
            while stack:
                cx, cy = stack.pop()
                for nx, ny in ((cx + 1, cy), (cx - 1, cy), (cx, cy + 1), (cx, cy - 1)):
                    inside = 0 <= nx < w and 0 <= ny < h
                    if inside and (nx, ny) not in seen and px[nx, ny] != BACKGROUND:
                        seen.add((nx, ny))
                        stack.append((nx, ny))
    return blobs


def test_drawings_show_their_answer():
    rng = random.Random(0)
    for _ in range(20):
        image, answer = draw_task("colour", rng)
        colours = {c for _, c in image.getcolors()} - {BACKGROUND}
        assert colours == {COLOURS[answer]}
        image, answer = draw_task("count", rng, size=64)
        assert _count_blobs(image) == int(answer)
    with pytest.raises(ValueError, match="too small"):
        draw_task("count", rng, size=20)


def test_rows_are_deterministic_for_a_seed():
    a = make_visual_rows(12, "train", seed=5)
    b = make_visual_rows(12, "train", seed=5)
    c = make_visual_rows(12, "train", seed=6)
    assert a == b
    assert a != c
    row, png = a[0]
    assert row["data_source"] == DATA_SOURCE
    assert row["prompt"][0]["content"].startswith("<image>")
    assert row["reward_model"]["ground_truth"] == row["extra_info"]["answer"]
    assert Image.open(io.BytesIO(png)).size == (56, 56)
    tasks = {r["extra_info"]["task"] for r, _ in make_visual_rows(40, "train", 0)}
    assert tasks == {"colour", "count"}


@pytest.mark.parametrize(
    ("fmt", "storage"), [("parquet", None), ("jsonl", None), ("parquet", "path")]
)
def test_written_files_read_back_through_vision(tmp_path, fmt, storage):
    train, test = write_visual_dataset(
        tmp_path / "d", train_size=6, val_size=3, seed=1, fmt=fmt, image_storage=storage
    )
    assert train.endswith(f"train.{fmt}") and test.endswith(f"test.{fmt}")
    rows = read_vision_rows([train, test])
    assert len(rows) == 9
    assert [r.data["extra_info"]["split"] for r in rows] == ["train"] * 6 + ["test"] * 3
    expected = make_visual_rows(6, "train", seed=2)
    for row, (want, png) in zip(rows[:6], expected):
        assert row.data["reward_model"]["ground_truth"] == want["reward_model"]["ground_truth"]
        (image,) = row.load_images()
        assert image.tobytes() == Image.open(io.BytesIO(png)).convert("RGB").tobytes()
    entry = read_records(train).records[0].data["images"][0]
    if fmt == "jsonl" or storage == "path":
        assert entry["path"] == os.path.join("images", "train_00000.png")
    else:
        assert isinstance(entry["bytes"], bytes)
    # the same seed writes the same files
    again, _ = write_visual_dataset(
        tmp_path / "e", train_size=6, val_size=3, seed=1, fmt=fmt, image_storage=storage
    )
    assert [r.data for r in read_vision_rows(again)] == [r.data for r in rows[:6]]


def test_rows_process_into_model_inputs(tmp_path):
    from verl.models.tiny_vision import tiny_vision_processor

    processor = tiny_vision_processor()
    (train, _) = write_visual_dataset(tmp_path, train_size=2, val_size=1, seed=0)
    row = read_vision_rows(train)[0]
    out = process_prompt(processor, row.data["prompt"], row.load_images())
    assert out["image_grid_thw"].tolist() == [[1, 4, 4]]


def test_cli(tmp_path, capsys):
    assert (
        main(
            [
                "--out",
                str(tmp_path),
                "--train-size",
                "3",
                "--val-size",
                "2",
                "--tasks",
                "count",
                "--format",
                "jsonl",
            ]
        )
        == 0
    )
    assert "train:" in capsys.readouterr().out
    rows = read_vision_rows(tmp_path / "train.jsonl")
    assert {r.data["extra_info"]["task"] for r in rows} == {"count"}
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--format", "jsonl", "--image-storage", "bytes"])


# ------------------------------------------------------------------ scorer


@pytest.mark.parametrize(
    ("response", "truth", "score", "pred"),
    [
        ("red", "red", 1.0, "red"),
        ("The square is Red.", "red", 1.0, "red"),
        ("It is not blue but red", "red", 1.0, "red"),
        ("Answer: green\nThough red is also nice", "green", 1.0, "green"),
        (r"I think \boxed{blue}.", "blue", 1.0, "blue"),
        ("blue", "red", 0.0, "blue"),
        ("3", "3", 1.0, "3"),
        ("There are three circles.", "3", 1.0, "3"),
        ("I count 2 circles", "3", 0.0, "2"),
        ("The answer is 4", "4", 1.0, "4"),
        ("", "red", 0.0, None),
        ("I cannot tell.", "red", 0.0, None),
        ("purplish", "purple", 0.0, None),
    ],
)
def test_scorer(response, truth, score, pred):
    out = compute_score(response, truth)
    assert (out["score"], out["acc"], out["pred"]) == (score, score, pred)


def test_scorer_choices_and_bad_ground_truth():
    info = {"choices": ["1", "2", "3", "4", "5"]}
    # with choices, a number outside them is no answer
    assert compute_score("7 circles", "3", info)["pred"] is None
    assert compute_score("2 or 3", "3", info)["score"] == 1.0
    assert compute_score("gray", "grey")["score"] == 1.0
    for bad in (None, "", "two words", 1.5, True, -1):
        assert compute_score("red", bad)["invalid_ground_truth"] == 1.0
    assert compute_score(None, "red")["score"] == 0.0  # type: ignore[arg-type]
    assert compute_score("3", 3)["score"] == 1.0


def test_scorer_is_registered_for_the_data_source():
    scorer = get_scorer(DATA_SOURCE)
    assert scorer("yellow", "yellow")["score"] == 1.0
