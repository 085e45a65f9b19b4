"""The layering of docs/concepts.md: each package imports only from the layers below it."""

from __future__ import annotations

import ast
from pathlib import Path

import verl

ROOT = Path(verl.__file__).parent

# package -> the verl packages it may import (besides itself)
ALLOWED = {
    # verl.registry is the bottom layer: the registries and their lazy built-in entries,
    # importing nothing of verl, so every layer (the config too) may ask it; the config
    # loader finds its input adapters there (CONFIG_ADAPTERS, built-in ones in verl.compat)
    "registry": set(),
    # the device probes of verl.utils
    "config": {"utils"},
    # the API edge: other spellings read onto the config, adapters over it
    "compat": {"config", "utils"},
    "protocol": set(),
    "algorithms": set(),
    "utils": set(),  # set_device_map is re-exported lazily (by name) from verl.compat
    # verl.utils.reward_score: upstream verl's scorer module paths, adapters over verl.rewards
    "utils.reward_score": {"utils", "rewards"},
    # attention and log-prob kernels, packing, sequence parallelism
    "kernels": {"utils"},
    "models": {"utils"},
    "data": {"protocol", "utils", "models"},
    "engine": {"utils", "models", "kernels"},
    # the agent loop calls tools; agent programs are scored through the reward manager
    "rollout": {"protocol", "utils", "kernels", "tools", "rewards"},
    "rewards": {"protocol", "utils", "algorithms"},
    "controller": {"protocol", "utils"},
    # tools for multi-turn rollouts; the python tool reuses the code-reward sandbox
    "tools": {"utils", "rewards"},
    "workers": {
        "config",
        "protocol",
        "algorithms",
        "utils",
        "kernels",
        "models",
        "engine",
        "rollout",
        "rewards",
        "controller",
        "tools",
    },
    "trainer": {
        "compat",
        "config",
        "protocol",
        "algorithms",
        "utils",
        "kernels",
        "models",
        "data",
        "engine",
        "rollout",
        "rewards",
        "controller",
        "workers",
        "tools",
    },
}


for _package, _deps in ALLOWED.items():
    if _package != "registry":
        _deps.add("registry")


# the modules users run by their upstream paths (``python -m verl.trainer.main_ppo``): shims over
# verl.cli, at the top like it
ENTRY_SHIMS = {
    "trainer/main_ppo.py",
    "trainer/main_sft.py",
    "trainer/main_dpo.py",
    "trainer/main_rm.py",
    "trainer/main_eval.py",
    "trainer/main_generation.py",
    "trainer/sft_trainer.py",
    "trainer/fsdp_sft_trainer.py",
    "model_merger.py",
}


def _package_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    if rel.as_posix() in ENTRY_SHIMS:
        return "entry"
    if rel.parts[:2] == ("utils", "reward_score"):
        return "utils.reward_score"
    return rel.parts[0].removesuffix(".py")


def _imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "verl" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_each_layer_imports_only_lower_layers():
    violations = []
    for path in sorted(ROOT.rglob("*.py")):
        pkg = _package_of(path)
        if pkg not in ALLOWED:  # __init__.py, cli.py: the top level may use anything
            continue
        for dep in _imported_packages(path) - ALLOWED[pkg] - {pkg}:
            violations.append(f"{path.relative_to(ROOT.parent)} imports verl.{dep}")
    assert not violations, "\n".join(violations)
