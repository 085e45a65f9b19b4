"""Callables written as text: the import path ``module:qualname`` and back.

A config is saved as YAML (``--print-config``, every checkpoint's ``config.yaml``), so a
Python object in it must have a textual form that a later process (a resumed run, a Ray
worker) can turn back into the same object. For a function, a class or any module-level
object that form is its import path, ``package.module:Outer.name``.

:func:`import_path` gives that path, checked by importing it back (the result must be the
very object), or raises :class:`NotImportableError` saying why there is none (a lambda, a
function defined inside another, one defined in the ``__main__`` script) and what to do.
:func:`resolve_import_path` is the inverse; :func:`is_import_path` tells such a text apart
from a file path.
"""

from __future__ import annotations

import importlib
import re
import sys
from typing import Any

__all__ = ["NotImportableError", "import_path", "is_import_path", "resolve_import_path"]

_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")


class NotImportableError(ValueError):
    """The object has no import path another process could load it from."""


def is_import_path(text: Any) -> bool:
    """Whether ``text`` reads as ``module:qualname`` (``pkg.mod:Outer.fn``), not a file path."""
    return isinstance(text, str) and _IMPORT_PATH.match(text) is not None


def resolve_import_path(text: str) -> Any:
    """The object at ``module:qualname``. Raises ``ImportError`` (module) or
    ``AttributeError`` (qualname) naming the path."""
    if not is_import_path(text):
        raise ValueError(f"{text!r} is not an import path of the form 'package.module:name'")
    module_name, qualname = text.split(":", 1)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f"import path {text!r}: module {module_name!r} cannot be imported ({exc}); "
            "it must be importable from the working directory or the installed packages"
        ) from exc
    for part in qualname.split("."):
        if not hasattr(obj, part):
            raise AttributeError(f"import path {text!r}: {module_name} defines no {qualname!r}")
        obj = getattr(obj, part)
    return obj


def _name_of(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)


def _find_binding(obj: Any) -> tuple[str, str]:
    """``(module, name)`` of a module-level name bound to the instance ``obj``: in the
    module of its ``fn`` or class first, then in any imported module."""
    first = getattr(getattr(obj, "fn", None), "__module__", None) or type(obj).__module__
    for module_name in [first, *list(sys.modules)]:
        module = sys.modules.get(module_name)
        found = [k for k, v in list(vars(module).items()) if v is obj] if module else []
        if found and module_name not in ("__main__", "__mp_main__"):
            return module_name, found[0]
    raise NotImportableError(
        f"{_name_of(obj)} is not bound to a module-level name of an imported module; "
        "define it at the top level of an importable module"
    )


def import_path(obj: Any) -> str:
    """``obj``'s ``module:qualname``, checked to import back to ``obj`` itself.

    An object without ``__qualname__`` (a :class:`verl.tools.Tool`, say) is found by
    identity among the module-level names of the module of its ``fn`` / its class.

    Raises:
        NotImportableError: ``obj`` has no such path (the message says why and the fix).
    """
    module_name = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if qualname is None:  # an instance: the module-level name bound to it
        module_name, qualname = _find_binding(obj)
    if module_name in (None, "__main__", "__mp_main__"):
        raise NotImportableError(
            f"{_name_of(obj)!r} is defined in the script being run ({module_name}), which "
            "another process cannot import; move it into an importable module (or a .py "
            "file given by path)"
        )
    if module_name.startswith("_verl_"):  # verl.utils.file_import's fresh modules
        source = getattr(sys.modules.get(module_name), "__file__", "?")
        raise NotImportableError(
            f"{_name_of(obj)!r} was loaded from the file {source!r}, not imported; name "
            "that file and the function instead of the function itself"
        )
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise NotImportableError(
            f"{_name_of(obj)!r} of {module_name} is a lambda or is defined inside a "
            "function, so it has no import path; define it at the top level of a module"
        )
    text = f"{module_name}:{qualname}"
    try:
        found = resolve_import_path(text)
    except (ImportError, AttributeError, ValueError) as exc:
        raise NotImportableError(f"{_name_of(obj)!r} does not import back: {exc}") from exc
    if found is not obj:
        raise NotImportableError(
            f"{text} names another object than {_name_of(obj)!r} (redefined, or loaded "
            "from a file as a fresh module); define it once at the top level of a module"
        )
    return text
