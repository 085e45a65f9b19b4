"""Scorer registry: dispatch by data_source, unknown-source errors, user registration."""

from __future__ import annotations

import pytest

from verl.rewards.scorers import (
    UnknownDataSourceError,
    default_compute_score,
    get_scorer,
    known_data_sources,
    register_scorer,
)
from verl.rewards.scorers import registry as registry_module


@pytest.fixture
def clean_registry(monkeypatch):
    """Let a test register scorers without leaking them into other tests."""
    monkeypatch.setattr(registry_module, "_SCORERS", registry_module._SCORERS.copy())


@pytest.mark.parametrize(
    ("data_source", "response", "truth"),
    [
        ("arithmetic", "so 40", "40"),
        ("gsm8k", "#### 1,234", "1234"),
        ("openai/gsm8k", "#### 8", "8"),
        ("math", r"\boxed{\frac12}", r"\frac{1}{2}"),
        ("lighteval/MATH", r"\boxed{3}", "3"),
        ("DigitalLearningGmbH/MATH-lighteval", r"\boxed{3}", "3"),
    ],
)
def test_dispatch_builtin_sources(data_source, response, truth):
    out = default_compute_score(data_source, response, truth)
    assert out["score"] == 1.0
    # keyword form, exactly how the reward manager calls a custom function
    kw = {"data_source": data_source, "solution_str": response, "ground_truth": truth}
    assert default_compute_score(**kw, extra_info={"split": "test"})["acc"] == 1.0


def test_gsm8k_dispatch_is_strict():
    assert default_compute_score("gsm8k", "the total is 8", "8")["score"] == 0.0


def test_unknown_data_source_lists_known_ones():
    with pytest.raises(UnknownDataSourceError, match="'my/dataset'") as info:
        default_compute_score("my/dataset", "1", "1")
    message = str(info.value)
    for name in ("arithmetic", "gsm8k", "openai/gsm8k", "math", "lighteval/MATH"):
        assert name in message
    assert "register_scorer" in message
    assert isinstance(info.value, ValueError)
    with pytest.raises(UnknownDataSourceError):
        get_scorer(["unhashable"])  # a malformed column value still gets the clear error


def test_register_scorer_decorator(clean_registry):
    @register_scorer("echo")
    def echo(solution_str, ground_truth, extra_info=None):
        return float(solution_str.strip() == ground_truth)

    assert echo("x", "x") == 1.0  # the decorator returns the function unchanged
    assert "echo" in known_data_sources()
    assert default_compute_score("echo", " yes ", "yes") == 1.0
    assert default_compute_score("echo", "no", "yes") == 0.0


def test_register_scorer_duplicate_and_override(clean_registry):
    with pytest.raises(ValueError, match="scorer 'gsm8k' is already registered"):
        register_scorer("gsm8k")(lambda s, g, e=None: 0.0)
    register_scorer("gsm8k", override=True)(lambda s, g, e=None: 0.5)
    assert default_compute_score("gsm8k", "#### 1", "1") == 0.5
    with pytest.raises(TypeError, match="non-callable"):
        register_scorer("bad")(42)


def test_known_sources_sorted():
    names = known_data_sources()
    assert names == sorted(names)
    assert {"arithmetic", "gsm8k", "math", "DigitalLearningGmbH/MATH-lighteval"} <= set(names)
