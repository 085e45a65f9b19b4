"""No source file of ``verl/`` over 600 lines: one job per module (docs/contributing.md)."""

from __future__ import annotations

from pathlib import Path

import verl

ROOT = Path(verl.__file__).parent
MAX_LINES = 600


def test_no_file_over_the_limit():
    sizes = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in ROOT.rglob("*.py")}
    over = sorted((n, str(p.relative_to(ROOT.parent))) for p, n in sizes.items() if n > MAX_LINES)
    assert not over, f"files over {MAX_LINES} lines: " + ", ".join(f"{p} ({n})" for n, p in over)
