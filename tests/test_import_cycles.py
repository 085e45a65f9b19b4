"""No import circle between files anywhere in ``verl/``.

The graph is read from the source (``ast``): an edge ``a -> b`` for every ``import`` of a
``verl`` module ``b`` in file ``a``, at module level or inside a function (a late import is
still a dependency), except under ``if TYPE_CHECKING:``. ``from pkg import name`` is an
edge to ``pkg.name`` when that is a module, else to the package ``pkg`` (its
``__init__.py``). A strongly connected component of more than one file is a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import verl

ROOT = Path(verl.__file__).parent


def modules_under(root: Path) -> dict[str, Path]:
    """``{dotted module name: file}`` of the package at ``root``."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module of the package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules that ``module`` imports (see the module docstring)."""
    path = modules[module]
    top = module.split(".")[0]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                full = f"{source}.{alias.name}"
                targets.append(full if full in modules else source)
        for target in targets:
            if target.split(".")[0] == top and (resolved := _resolve(target, modules)):
                found.add(resolved)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    found.discard(module)
    return found


def import_circles(root: Path) -> list[list[str]]:
    """Strongly connected components of more than one module of the package at ``root``
    (Tarjan's algorithm, iterative)."""
    modules = modules_under(root)
    graph = {m: sorted(imports_of(m, modules)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_circle_through_a_function_level_import_is_found(tmp_path):
    root = _package(
        tmp_path,
        {
            "a.py": "from pkg import b\n",
            "b.py": "def f():\n    from pkg.c import x\n",
            "c.py": "import pkg.a\nx = 1\n",
            "d.py": "from pkg.a import b\n",  # a leaf: imports into the circle only
        },
    )
    assert import_circles(root) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_type_checking_imports_and_package_inits_count_as_documented(tmp_path):
    root = _package(
        tmp_path,
        {
            "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n",
            "b.py": "import pkg.a\n",
            "sub/__init__.py": "from pkg.sub.m import y\n",
            "sub/m.py": "from pkg.sub import z\ny = 1\n",  # imports its own package's __init__
        },
    )
    assert import_circles(root) == [["pkg.sub", "pkg.sub.m"]]


def test_no_import_circle_between_files():
    circles = import_circles(ROOT)
    assert not circles, "import circles between files:\n" + "\n".join(
        " <-> ".join(c) for c in circles
    )
