"""verl.utils.lazy: the one lazy-export helper behind verl, verl.data, verl.controller and
verl.utils."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest

from verl.utils.lazy import lazy_exports

PACKAGES = ["verl", "verl.data", "verl.controller", "verl.utils"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_lazy_name_resolves_to_its_defining_module(package):
    pkg = importlib.import_module(package)
    assert pkg._LAZY, package
    for name, module in pkg._LAZY.items():
        value = getattr(pkg, name)
        assert value is getattr(importlib.import_module(module), name)
        assert name in pkg.__all__
        assert pkg.__dict__[name] is value  # cached: later lookups skip __getattr__


@pytest.mark.parametrize("package", PACKAGES)
def test_unknown_name_raises_attribute_error_naming_the_module(package):
    pkg = importlib.import_module(package)
    with pytest.raises(AttributeError, match=rf"module '{package}' has no attribute 'no_such'"):
        pkg.no_such  # noqa: B018
    assert not hasattr(pkg, "no_such")
    with pytest.raises(ImportError, match=rf"cannot import name 'no_such' from '{package}'"):
        exec(f"from {package} import no_such", {})


def test_helper_on_a_fresh_module(monkeypatch):
    mod = types.ModuleType("fake_pkg")
    monkeypatch.setitem(sys.modules, "fake_pkg", mod)
    mod.__getattr__ = lazy_exports("fake_pkg", {"sqrt": "math", "dumps": "json"})
    import json
    import math

    assert mod.sqrt is math.sqrt and mod.dumps is json.dumps
    assert "sqrt" in vars(mod)
    with pytest.raises(AttributeError, match="module 'fake_pkg' has no attribute 'loads'"):
        mod.loads  # noqa: B018


def test_importing_the_packages_stays_cheap():
    # the point of being lazy: no torch for verl / verl.data, no Ray for verl.controller
    code = (
        "import sys, verl, verl.data, verl.utils; assert 'torch' not in sys.modules, 'torch';"
        "import verl.controller; assert 'ray' not in sys.modules, 'ray';"
        "verl.data.write_records; assert 'ray' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
