"""The config package's modules form an acyclic import graph, and each imports alone."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "verl" / "config"
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def config_imports(module: str, *, in_functions: bool = False) -> set[str]:
    """Modules of ``verl.config`` that ``module`` imports anywhere in its body (functions
    included), except under ``if TYPE_CHECKING:``; only those inside a function body with
    ``in_functions``."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found: set[str] = set()

    def visit(node: ast.AST, inside: bool = False) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child, inside)
            return
        inside = inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            names = []
        for name in names:
            parts = name.split(".")
            in_config = parts[:2] == ["verl", "config"] and len(parts) > 2
            if in_config and parts[2] in MODULES and (inside or not in_functions):
                found.add(parts[2])
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree)
    found.discard(module)
    return found


def test_config_import_graph_is_acyclic():
    graph = {m: config_imports(m) for m in MODULES}
    done: set[str] = set()

    def walk(module: str, stack: list[str]) -> None:
        if module in stack:
            cycle = [*stack[stack.index(module) :], module]
            pytest.fail("import cycle in verl/config: " + " -> ".join(cycle))
        if module in done:
            return
        for dep in sorted(graph[module]):
            walk(dep, [*stack, module])
        done.add(module)

    for module in MODULES:
        walk(module, [])


def test_no_function_level_imports_between_config_modules():
    late = {m: sorted(deps) for m in MODULES if (deps := config_imports(m, in_functions=True))}
    assert not late, f"function-level imports inside verl/config: {late}"


@pytest.mark.parametrize("module", MODULES)
def test_each_config_module_imports_alone(module: str):
    """A fresh interpreter imports the module first, before anything else of verl.config."""
    result = subprocess.run(
        [sys.executable, "-c", f"import verl.config.{module}"],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def test_no_import_cycle_through_the_modules_the_config_imports():
    """The API edge (``verl.compat``) imports parts of the config, the config and its probes
    (``verl.utils``) the bottom layer (``verl.registry``): the graph over all their files,
    packages' ``__init__`` included, module by module, has no cycle either."""
    verl_root = ROOT / "verl"

    def dotted(path: Path) -> str:
        parts = path.relative_to(ROOT).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    files = {
        dotted(p): p
        for d in ("config", "compat", "utils", "registry")
        for p in (verl_root / d).rglob("*.py")
    }

    def imports(module: str) -> set[str]:
        found: set[str] = set()

        def visit(node: ast.AST) -> None:
            if isinstance(node, ast.If) and _is_type_checking(node):
                return
            if isinstance(node, ast.ImportFrom) and node.module:
                found.update({node.module} | {f"{node.module}.{a.name}" for a in node.names})
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            for child in ast.iter_child_nodes(node):
                visit(child)

        visit(ast.parse(files[module].read_text()))
        return (found & set(files)) - {module}

    graph = {m: imports(m) for m in files}
    assert "verl.config.load" in graph["verl.compat.flat_keys"]  # the walk sees the edge
    assert not {m for m in graph["verl.config.load"] if m.startswith("verl.compat")}
    done: set[str] = set()

    def walk(module: str, stack: list[str]) -> None:
        if module in stack:
            pytest.fail("import cycle: " + " -> ".join([*stack[stack.index(module) :], module]))
        if module not in done:
            for dep in sorted(graph[module]):
                walk(dep, [*stack, module])
            done.add(module)

    for module in sorted(files):
        walk(module, [])
