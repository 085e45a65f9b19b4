"""The name registry: lookup, aliases, metadata and error messages."""

import pytest

from verl.algorithms.registry import Registry, UnknownNameError


def _make():
    reg = Registry("widget")

    @reg.register("alpha", "a", fast=True)
    def alpha():
        return 1

    @reg.register("beta")
    def beta():
        return 2

    return reg


def test_get_by_name_and_alias_and_info():
    reg = _make()
    assert reg.get("alpha")() == 1
    assert reg.get("a")() == 1
    assert reg.canonical_name("a") == "alpha"
    assert reg.info("a") == {"fast": True}
    assert reg.info("beta") == {}
    assert reg.names() == ["alpha", "beta"]
    assert reg.names(include_aliases=True) == ["a", "alpha", "beta"]
    assert "a" in reg and "gamma" not in reg and 3 not in reg
    assert len(reg) == 2


def test_unknown_name_lists_names_and_suggests():
    reg = _make()
    with pytest.raises(UnknownNameError) as err:
        reg.get("alpah")
    msg = str(err.value)
    assert msg == "unknown widget 'alpah'; available: a, alpha, beta. Did you mean 'alpha'?"
    # catchable as either a config error or a failed lookup
    with pytest.raises(ValueError):
        reg.get("zzz")
    with pytest.raises(KeyError, match=r"available: a, alpha, beta$"):
        reg.get("zzz")


def test_duplicate_registration_is_an_error():
    reg = _make()
    with pytest.raises(ValueError, match="'a' is already registered"):
        reg.register("a")(lambda: 3)
    assert reg.get("a")() == 1
