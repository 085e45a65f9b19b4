"""Evaluation metrics of generations: accuracy per data source, mean@n and pass@k.

Input rows are those of :mod:`verl.trainer.rl.generation` (one per prompt, ``n`` responses
each, with ``accs`` and ``scores``) or of a generations file with at least
``data_source`` and ``responses`` (then scored here by the data source's scorer, which
needs ``ground_truth``).

For a prompt with ``n`` responses of which ``c`` are correct (``acc > 0.5``; a scorer that
reports no accuracy counts its score), ``pass@k`` is the unbiased estimate of the chance
that at least one of ``k`` responses drawn without replacement is correct,
``1 - C(n - c, k) / C(n, k)`` (Chen et al., 2021), averaged over prompts; ``k <= n``.
``mean@n`` is the mean accuracy over all ``n`` responses of all prompts (what the mean of
``k`` responses estimates, for any ``k <= n``); ``score/mean@n`` the same for the score.

Prompts may have different numbers of responses: every metric is then the mean over
prompts of each prompt's own value (its mean over its own responses, its pass@k from its
own ``n``), so each prompt weighs the same; ``k`` may not exceed any prompt's ``n``. A
``responses`` value that is a plain string is one response.
"""

from __future__ import annotations

import inspect
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

    Metrics: ``prompts``, ``n`` and ``n_max`` (the fewest and the most responses of a
    prompt), ``acc/mean@n``, ``score/mean@n`` and ``pass@k`` for each ``k`` of ``ks``
    (default :func:`default_ks` of the fewest). Every metric is a mean over prompts of the
    prompt's own value, so prompts with different numbers of responses each weigh one:
    a prompt's mean is over its own responses and its pass@k uses its own ``n``. The
    ``n`` in the names is the fewest responses of any prompt of the report, the same in
    every group. Raises ``ValueError`` naming the row when there are no rows, a row has no
    responses or a non-numeric score, its columns disagree in length, or a ``k`` exceeds a
    row's number of responses.
    """
    if not rows:
        raise ValueError("no generations to evaluate (the file or dataset has no rows)")
    checked = [_checked(i, row) for i, row in enumerate(rows)]
    fewest = min(range(len(checked)), key=lambda i: len(checked[i]["accs"]))
    n = len(checked[fewest]["accs"])
    ks = default_ks(n) if ks is None else sorted(set(ks))
    bad = [k for k in ks if not 1 <= k <= n]
    if bad:
        src = checked[fewest]["data_source"]
        raise ValueError(
            f"k={bad[0]}: pass@k needs 1 <= k <= n, and n={n} responses per prompt "
            f"(row {fewest}, data_source {src!r}, has {n}); lower --k or drop that row"
        )
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in checked:
        groups[str(row["data_source"])].append(row)
    return {
        "overall": _metrics(checked, ks, n),
        "by_source": {src: _metrics(group, ks, n) for src, group in sorted(groups.items())},
    }


def _checked(i: int, row: Mapping[str, Any]) -> dict[str, Any]:
    """Row ``i`` with ``accs`` / ``scores`` as lists of floats (a lone number is one
    response), or ``ValueError`` naming the row and what is wrong."""
    where = f"row {i} ({row.get('data_source')})"
    out = dict(row)
    for key in ("accs", "scores"):
        if key not in row:
            raise ValueError(f"{where}: no {key!r} column; score the rows first")
        values = as_response_list(row[key])
        try:
            out[key] = [float(v) for v in values]
        except (TypeError, ValueError):
            raise ValueError(f"{where}: {key!r} must be numbers, got {values!r}") from None
    if not out["accs"]:
        raise ValueError(f"{where} has no responses")
    if len(out["accs"]) != len(out["scores"]):
        raise ValueError(f"{where}: {len(out['accs'])} accs but {len(out['scores'])} scores")
    if "responses" in row and len(as_response_list(row["responses"])) != len(out["accs"]):
        raise ValueError(
            f"{where}: {len(as_response_list(row['responses']))} responses but "
            f"{len(out['accs'])} accs"
        )
    return out


def _metrics(rows: Sequence[Mapping[str, Any]], ks: Sequence[int], n: int) -> dict[str, float]:
    sizes = [len(row["accs"]) for row in rows]
    out: dict[str, float] = {
        "prompts": len(rows),
        "n": min(sizes),
        "n_max": max(sizes),
        f"acc/mean@{n}": _mean([_mean(row["accs"]) for row in rows]),
        f"score/mean@{n}": _mean([_mean(row["scores"]) for row in rows]),
    }
    for k in ks:
        per_prompt = [
            pass_at_k(len(row["accs"]), sum(a > CORRECT_ABOVE for a in row["accs"]), k)
            for row in rows
        ]
        out[f"pass@{k}"] = _mean(per_prompt)
    return out


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def as_response_list(value: Any) -> list[Any]:
    """A column holding one value per response as a list: a string (or a number) is one
    response, never a sequence of characters; a list, tuple or array is taken as is."""
    if value is None:
        return []
    if isinstance(value, str | bytes | int | float):
        return [value]
    if isinstance(value, Mapping):
        raise ValueError(f"expected a list of responses, got a mapping {value!r}")
    return list(value)


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
        try:  # a plain string is one response, not a list of characters
            row["responses"] = as_response_list(row["responses"])
        except ValueError as exc:
            raise ValueError(f"{path} row {i}: 'responses': {exc}") from None
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
        for response in as_response_list(row["responses"]):
            result = call_reward_fn(
                compute_score,
                row["data_source"],
                response,
                row["ground_truth"],
                row.get("extra_info"),
            )
            score = float(result["score"] if isinstance(result, Mapping) else result)
            acc = result.get("acc", score) if isinstance(result, Mapping) else score
            scores.append(score)
            accs.append(float(acc))
        out.append({**row, "scores": scores, "accs": accs})
    return out


def call_reward_fn(
    fn: Callable[..., Any], data_source: Any, response: str, ground_truth: Any, extra_info: Any
) -> Any:
    """``fn(data_source, response, ground_truth[, extra_info])``, by position as upstream's
    evaluation calls a reward function (its parameters may have any names): ``extra_info``
    is passed as the fourth argument only when ``fn`` takes one (a fourth parameter,
    ``extra_info``, or ``*args``/``**kwargs``)."""
    args = (data_source, response, ground_truth)
    if _takes_fourth(fn):
        return fn(*args, extra_info)
    return fn(*args)


def _takes_fourth(fn: Callable[..., Any]) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read (a builtin): pass it
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 4 or any(p.kind is p.VAR_POSITIONAL for p in params)


def format_report(report: Mapping[str, Any]) -> str:
    """The report as a fixed-width table: one line per data source, then ``overall``
    (``n`` is ``fewest-most`` where prompts have different numbers of responses)."""
    overall = report["overall"]
    columns = [k for k in overall if k not in ("prompts", "n", "n_max")]
    header = f"{'data_source':<24} {'prompts':>7} {'n':>3} " + " ".join(f"{c:>12}" for c in columns)
    lines = [header]
    items = [*report["by_source"].items(), ("overall", overall)]
    for name, m in items:
        cells = " ".join(f"{m[c]:>12.4f}" for c in columns)
        n, most = int(m["n"]), int(m.get("n_max", m["n"]))
        sizes = str(n) if most == n else f"{n}-{most}"  # responses per prompt differ
        lines.append(f"{name:<24} {int(m['prompts']):>7} {sizes:>3} {cells}")
    return "\n".join(lines)
