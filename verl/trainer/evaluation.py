"""Evaluation metrics of generations: accuracy per data source, mean@n and pass@k.

Input rows are those of :mod:`verl.trainer.generation` (one per prompt, ``n`` responses
each, with ``accs`` and ``scores``) or of a generations file with at least
``data_source`` and ``responses`` (then scored here by the data source's scorer, which
needs ``ground_truth``).

For a prompt with ``n`` responses of which ``c`` are correct (``acc > 0.5``; a scorer that
reports no accuracy counts its score), ``pass@k`` is the unbiased estimate of the chance
that at least one of ``k`` responses drawn without replacement is correct,
``1 - C(n - c, k) / C(n, k)`` (Chen et al., 2021), averaged over prompts; ``k <= n``.
``mean@n`` is the mean accuracy over all ``n`` responses of all prompts (what the mean of
``k`` responses estimates, for any ``k <= n``); ``score/mean@n`` the same for the score.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

CORRECT_ABOVE = 0.5


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt: ``n`` samples, ``c`` of them correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k(n={n}, c={c}, k={k}): need 0 <= c <= n and 1 <= k <= n")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to ``n``, and ``n`` itself."""
    ks, k = [], 1
    while k < n:
        ks.append(k)
        k *= 2
    return [*ks, n]


def evaluate_rows(rows: Sequence[Mapping[str, Any]], ks: Sequence[int] | None = None) -> dict:
    """``{"overall": metrics, "by_source": {data_source: metrics}}`` of scored ``rows``.

    Metrics: ``prompts``, ``n`` (the fewest responses of a prompt), ``acc/mean@n``,
    ``score/mean@n`` and ``pass@k`` for each ``k`` of ``ks`` (default :func:`default_ks`).
    Raises ``ValueError`` naming the problem when there are no rows, a row has no
    responses, or a ``k`` exceeds ``n``.
    """
    if not rows:
        raise ValueError("no generations to evaluate (the file or dataset has no rows)")
    for i, row in enumerate(rows):
        if not row["accs"]:
            raise ValueError(f"row {i} ({row.get('data_source')}) has no responses")
        if len(row["accs"]) != len(row["scores"]):
            raise ValueError(f"row {i}: {len(row['accs'])} accs but {len(row['scores'])} scores")
    n = min(len(row["accs"]) for row in rows)
    ks = default_ks(n) if ks is None else sorted(set(ks))
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        raise ValueError(f"k={bad[0]}: pass@k needs 1 <= k <= n, and n={n} responses per prompt")
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[str(row["data_source"])].append(row)
    return {
        "overall": _metrics(rows, ks),
        "by_source": {src: _metrics(group, ks) for src, group in sorted(groups.items())},
    }


def _metrics(rows: Sequence[Mapping[str, Any]], ks: Sequence[int]) -> dict[str, float]:
    accs = [a for row in rows for a in row["accs"]]
    scores = [s for row in rows for s in row["scores"]]
    n = min(len(row["accs"]) for row in rows)
    out: dict[str, float] = {
        "prompts": len(rows),
        "n": n,
        f"acc/mean@{n}": sum(accs) / len(accs),
        f"score/mean@{n}": sum(scores) / len(scores),
    }
    for k in ks:
        per_prompt = [
            pass_at_k(len(row["accs"]), sum(a > CORRECT_ABOVE for a in row["accs"]), k)
            for row in rows
        ]
        out[f"pass@{k}"] = sum(per_prompt) / len(per_prompt)
    return out


def read_generations(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a generations file (parquet, or JSON lines); errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"generations file {str(path)!r} does not exist")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    elif path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    else:
        raise ValueError(f"generations file {str(path)!r}: expected .parquet or .jsonl")
    for i, row in enumerate(rows):
        missing = [k for k in ("data_source", "responses") if k not in row]
        if missing:
            raise ValueError(
                f"{path} row {i}: missing column(s) {missing}; a generations file has one row "
                "per prompt with data_source and responses (a list), as `verl generate` writes"
            )
    return rows


def score_rows(
    rows: list[dict[str, Any]], compute_score: Callable[..., Any] | None = None
) -> list[dict[str, Any]]:
    """Rows with ``scores`` / ``accs``: kept when a row has them, else computed with
    ``compute_score`` (default: the scorer registered for the row's data source)."""
    if compute_score is None:
        from verl.rewards.scorers import default_compute_score as compute_score
    out = []
    for i, row in enumerate(rows):
        if "scores" in row and "accs" in row:
            out.append(row)
            continue
        if "ground_truth" not in row:
            raise ValueError(f"row {i}: no scores and no ground_truth to score the responses by")
        scores, accs = [], []
        for response in row["responses"]:
            result = compute_score(
                data_source=row["data_source"],
                solution_str=response,
                ground_truth=row["ground_truth"],
                extra_info=row.get("extra_info"),
            )
            score = float(result["score"] if isinstance(result, Mapping) else result)
            acc = result.get("acc", score) if isinstance(result, Mapping) else score
            scores.append(score)
            accs.append(float(acc))
        out.append({**row, "scores": scores, "accs": accs})
    return out


def format_report(report: Mapping[str, Any]) -> str:
    """The report as a fixed-width table: one line per data source, then ``overall``."""
    overall = report["overall"]
    columns = [k for k in overall if k not in ("prompts", "n")]
    header = f"{'data_source':<24} {'prompts':>7} {'n':>3} " + " ".join(f"{c:>12}" for c in columns)
    lines = [header]
    items = [*report["by_source"].items(), ("overall", overall)]
    for name, m in items:
        cells = " ".join(f"{m[c]:>12.4f}" for c in columns)
        lines.append(f"{name:<24} {int(m['prompts']):>7} {int(m['n']):>3} {cells}")
    return "\n".join(lines)
