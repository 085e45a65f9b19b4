"""The one Registry type: lazy entries, declared needs, hyperparameters, the duplicate rule."""

from __future__ import annotations

import pytest

from verl.registry import Registry, UnknownNameError


def _registry() -> Registry:
    return Registry(
        "widget",
        needs={"needs_critic": False, "needs_index": False},
        inputs={"x": "the batch", "gamma": "algorithm.gamma"},
    )


def scale(x, gamma=1.0, factor=2.0, *, shift=0):
    return x * factor + shift


def strict(x, factor=2.0):
    return x * factor


def test_needs_are_declared_with_defaults_and_unknown_needs_are_rejected():
    reg = _registry()
    reg.add("scale", scale, "s", needs_critic=True)
    assert reg.info("s") == {"needs_critic": True, "needs_index": False}
    assert reg.needs("scale", "needs_critic") is True
    assert reg.needs("nope", "needs_critic") is False  # unknown: left to validation
    with pytest.raises(TypeError, match=r"unknown needs \['needs_critc'\].*needs_critic"):
        reg.add("bad", scale, needs_critc=True)


def test_hyperparameters_come_from_the_signature_minus_the_call_site_inputs():
    reg = _registry()
    reg.add("scale", scale)
    assert reg.hyperparameters("scale") == {"factor": 2.0, "shift": 0}
    entry = reg.entry("scale")
    reg.add("open", lambda x, factor=1.0, **kwargs: x * factor)
    assert reg.entry("open").accepts("anything")  # **kwargs takes every call-site value
    assert reg.hyperparameters("open") == {"factor": 1.0}
    reg.add("strict", strict)
    strict_entry = reg.entry("strict")
    assert not strict_entry.accepts("gamma") and strict_entry.accepts("factor")
    # call-site values the target does not take are left out; overrides are added
    kwargs = strict_entry.call_kwargs({"x": 3.0, "gamma": 0.9}, {"factor": 5.0}, "w.kwargs")
    assert kwargs == {"x": 3.0, "factor": 5.0}
    assert strict_entry.target(**kwargs) == 15.0
    assert entry.call_kwargs({"x": 1.0, "gamma": 0.9}) == {"x": 1.0, "gamma": 0.9}


def test_scale_accepts_keyword_only_but_not_unknown():
    reg = _registry()
    reg.add("scale", scale)
    entry = reg.entry("scale")
    assert entry.accepts("shift") and not entry.accepts("anything")


def test_unknown_hyperparameter_names_the_key_the_entry_and_the_allowed_names():
    reg = _registry()
    reg.add("scale", scale)
    entry = reg.entry("scale")
    problems = entry.kwargs_problems({"factr": 1.0, "gamma": 0.5, "shift": 1}, "w.kwargs")
    assert problems == [
        "w.kwargs.factr: unknown hyperparameter of widget 'scale'; its hyperparameters "
        "are: factor, shift; did you mean factor?",
        "w.kwargs.gamma: widget 'scale' gets 'gamma' from algorithm.gamma, not from w.kwargs",
    ]
    with pytest.raises(ValueError, match=r"w.kwargs.factr: unknown hyperparameter"):
        entry.call_kwargs({"x": 1.0}, {"factr": 1.0}, "w.kwargs")
    reg.add("none", lambda x: x)
    assert reg.entry("none").kwargs_problems({"a": 1}, "k") == [
        "k.a: unknown hyperparameter of widget 'none'; its hyperparameters are: none"
    ]


def test_lazy_entries_are_known_without_import_and_fail_clearly_when_used():
    reg = _registry()
    reg.add("json_dumps", "json:dumps", needs_index=True)
    reg.add("missing", "no_such_module_for_verl_tests:thing")
    assert reg.entry("json_dumps").lazy and reg.info("json_dumps")["needs_index"] is True
    import json

    assert reg.get("json_dumps") is json.dumps and not reg.entry("json_dumps").lazy
    assert "missing" in reg
    with pytest.raises(ImportError, match=r"widget 'missing' is registered as 'no_such_module"):
        reg.get("missing")
    with pytest.raises(ValueError, match="must be 'module:attr'"):
        reg.add("bad", "json.dumps")


def test_one_duplicate_rule_same_target_is_a_noop_other_target_needs_override():
    reg = _registry()
    reg.add("scale", scale, "s")
    reg.add("scale", scale, "s")  # the same registration again: nothing happens
    with pytest.raises(ValueError, match=r"widget 's' is already registered \(as 'scale'\)"):
        reg.add("s", strict)
    with pytest.raises(ValueError, match="pass override=True"):
        reg.add("scale", strict)
    reg.add("scale", strict, override=True)
    assert reg.get("scale") is strict
    assert "s" not in reg  # the replaced entry's aliases went with it
    with pytest.raises(UnknownNameError, match="unknown widget 's'; available: scale"):
        reg.get("s")


def test_copy_is_independent_and_remove_drops_aliases():
    reg = _registry()
    reg.add("scale", scale, "s")
    other = reg.copy()
    other.add("strict", strict)
    other.remove("s")
    assert reg.names(include_aliases=True) == ["s", "scale"]
    assert other.names() == ["strict"]
    assert other.kind == reg.kind and other.inputs == reg.inputs
