"""The reward both sides of ``bench_vs_trl.py`` use: exact match of the sum.

Standard library only: TRL's side imports this file by path in its own virtual
environment, where verl is not installed, and verl's side loads it as
``custom_reward_function.path``.
"""

from __future__ import annotations

# Chat end markers a decoded completion may still carry (verl decodes with special tokens
# skipped already; TRL's conversational completions do too, this is belt and braces).
_END_MARKERS = ("<|im_end|>", "<|endoftext|>")


def exact_match(completion: str, ground_truth: str) -> float:
    """1.0 if the completion, stripped of whitespace and end markers, is exactly the sum."""
    text = completion
    for marker in _END_MARKERS:
        text = text.replace(marker, "")
    return 1.0 if text.strip() == str(ground_truth).strip() else 0.0


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """verl's custom reward signature (``custom_reward_function.name=compute_score``)."""
    return exact_match(solution_str, ground_truth)
