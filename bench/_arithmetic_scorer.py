"""verl's arithmetic scorer, loaded by path for a process that cannot import verl.

TRL's side of ``bench_convergence_vs_trl.py`` runs in its own virtual environment, where
verl is not installed (and ``import verl.rewards`` would need verl's dependencies). The
scorer itself is standard library only: ``verl/rewards/scorers/arithmetic.py`` and the
``extract.py`` beside it. This module executes those two files from this checkout, so TRL's
reward is the very function verl's main job scores its ``arithmetic`` rows with.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCORERS = Path(__file__).resolve().parents[1] / "verl" / "rewards" / "scorers"
# the name arithmetic.py imports its helpers under
_EXTRACT_NAME = "verl.rewards.scorers.extract"


def _exec(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}: is this a verl checkout?")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_compute_score():
    """``compute_score(solution_str, ground_truth, extra_info=None) -> {"score", "acc", ...}``
    of ``verl/rewards/scorers/arithmetic.py``."""
    extract = _exec("_bench_scorer_extract", SCORERS / "extract.py")
    # arithmetic.py does ``from verl.rewards.scorers.extract import ...``: a module already in
    # sys.modules under that name is taken as it is, without importing the verl packages
    # above it. The entry is removed again, so nothing else sees it.
    previous = sys.modules.get(_EXTRACT_NAME)
    sys.modules[_EXTRACT_NAME] = extract
    try:
        arithmetic = _exec("_bench_scorer_arithmetic", SCORERS / "arithmetic.py")
    finally:
        if previous is None:
            del sys.modules[_EXTRACT_NAME]
        else:
            sys.modules[_EXTRACT_NAME] = previous
    return arithmetic.compute_score
