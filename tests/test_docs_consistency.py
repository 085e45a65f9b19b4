"""The README and docs say what is true: links and anchors resolve, the feature table names
only registered algorithms and existing backends, the README stays a front page, and no
page or module carries development history (that is CHANGELOG.md's job)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]

# README display name -> registry name, for the feature table's algorithm rows
ESTIMATORS = {
    "GAE": "gae",
    "GRPO": "grpo",
    "Dr.GRPO": "grpo",  # GRPO with norm_adv_by_std_in_grpo=false + seq-mean-token-sum-norm
    "RLOO": "rloo",
    "REINFORCE++": "reinforce_plus_plus",
    "REINFORCE++ (+baseline)": "reinforce_plus_plus_baseline",
    "ReMax": "remax",
    "OPO": "opo",
    "GPG": "gpg",
    "GRPO pass@k": "grpo_passk",
    "optimal token baseline": "optimal_token_baseline",
}
LOSSES = {
    "PPO (dual clip, clip-higher)": "vanilla",
    "GSPO": "gspo",
    "CISPO": "cispo",
    "Clip-Cov": "clip_cov",
    "KL-Cov": "kl_cov",
    "REINFORCE": "reinforce",
    "GPG": "gpg",
    "SAPO": "sapo",
    "GMPO": "gmpo",
    "decoupled PPO": "decoupled_ppo",
}


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", lambda m: "_" if m.group() == "_" else "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def _table_row(first_cell: str) -> list[str]:
    for line in README.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == first_cell:
            return cells
    raise AssertionError(f"README's feature table has no row {first_cell!r}")


def _listed(cell: str) -> list[str]:
    """The comma-separated names of a table cell, the parenthesised ones kept whole."""
    names, depth, current = [], 0, ""
    for ch in cell:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            names.append(current.strip())
            current = ""
        else:
            current += ch
    names.append(current.strip())
    return [n.split(";")[0].strip() for n in names if n]


def _builtin(registry) -> set[str]:
    """The names verl itself registers (tests and users may add their own entries)."""
    return {
        name
        for name in registry.names()
        if getattr(registry.entry(name).target, "__module__", "").startswith("verl.")
    }


def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines (a front page keeps to 200)"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_anchors_resolve(page: Path):
    for link in _links(page):
        if re.match(r"[a-z]+:", link):  # https:, mailto:
            continue
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{page.relative_to(ROOT)} links to a missing {link}"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), (
                f"{page.relative_to(ROOT)} links to {link}: {path.name} has no heading "
                f"with that anchor"
            )


def test_feature_table_names_registered_algorithms():
    from verl.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES

    row = _table_row("advantage estimators")
    listed = _listed(row[1])
    assert set(listed) <= set(ESTIMATORS), f"unmapped estimators: {set(listed) - set(ESTIMATORS)}"
    for name in listed:
        assert ESTIMATORS[name] in ADVANTAGE_ESTIMATORS.names(), name

    row = _table_row("policy losses")
    listed = [n for n in _listed(row[1].split(";")[0]) if n]
    assert set(listed) <= set(LOSSES), f"unmapped losses: {set(listed) - set(LOSSES)}"
    for name in listed:
        assert LOSSES[name] in POLICY_LOSSES.names(), name
    # every registered algorithm is on the front page
    assert set(ESTIMATORS.values()) == _builtin(ADVANTAGE_ESTIMATORS)
    assert set(LOSSES.values()) == _builtin(POLICY_LOSSES)


def test_feature_table_names_existing_backends_and_no_placeholder():
    from verl.registry import ROLLOUT_BACKENDS

    row = _table_row("rollout backends")
    named = set(re.findall(r"`(\w+)` \(", row[1]))
    assert named == _builtin(ROLLOUT_BACKENDS), named  # the lazy entries import
    assert "placeholder" not in README.read_text().lower()


HISTORY = re.compile(
    r"\b\d{1,2}:\d{2} UTC\b"  # clock times
    r"|\bthis (stop|session|afternoon|evening|morning)\b"
    r"|\bissue \d+\b|\bissues? #\d+"
    r"|\b(until|since) (yesterday|today|20\d\d-\d\d-\d\d)\b"
    r"|\bmain [0-9a-f]{7,40}\b"  # "main 0661135"
    r"|\bcommit [0-9a-f]{7,40}\b",
    flags=re.I,
)


def _history_sources() -> list[Path]:
    files = [README, ROOT / "pyproject.toml", *sorted((ROOT / "docs").rglob("*.md"))]
    return files + sorted((ROOT / "verl").rglob("*.py"))


def test_no_development_history_in_readme_docs_or_code():
    found = []
    for path in _history_sources():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if HISTORY.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not found, "development history belongs in CHANGELOG.md:\n" + "\n".join(found)
