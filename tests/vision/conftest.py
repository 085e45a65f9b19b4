"""Shared fixtures of the vision tests: the tiny Qwen2-VL saved as a model directory, its
processor, and the synthetic shapes task written as parquet."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from verl.data.vision_dataset import VisionRLHFDataset, collate_vision_fn
from verl.models.tiny_vision import save_tiny_vision_model_dir, tiny_vision_model
from verl.models.vision_processor import load_vision_processor
from verl.protocol import DataProto


@dataclass
class VisionSetup:
    """The tiny Qwen2-VL (directory, processor, model) and the shapes task's files."""

    model_dir: Path
    train: Path
    processor: Any
    model: Any

    def __iter__(self):  # (model_dir, train, processor, model)
        return iter((self.model_dir, self.train, self.processor, self.model))

    def __getitem__(self, i: int) -> Any:
        return tuple(self)[i]

    def prompts(self, rows: int = 4) -> tuple[VisionRLHFDataset, DataProto]:
        """The training set and a collated batch of its first ``rows`` prompts."""
        ds = VisionRLHFDataset(self.train, self.processor, self.model.config, max_prompt_length=64)
        return ds, collate_vision_fn([ds[i] for i in range(rows)], ds.pad_token_id)


@pytest.fixture(scope="module")
def vl(tmp_path_factory) -> VisionSetup:
    """The tiny Qwen2-VL (seed 0) and 16 + 4 rows of the shapes task (seed 0)."""
    from verl.data.visual_tasks import main as tasks_main

    base = tmp_path_factory.mktemp("vl")
    model_dir = save_tiny_vision_model_dir(base / "model", seed=0)
    args = ["--out", str(base / "data"), "--train-size", "16", "--val-size", "4"]
    tasks_main([*args, "--seed", "0", "--format", "parquet"])
    processor = load_vision_processor(str(model_dir))
    model = tiny_vision_model(processor, seed=0)
    return VisionSetup(model_dir, base / "data" / "train.parquet", processor, model)
