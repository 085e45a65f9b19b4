"""Nothing verl reads from disk is unpickled freely.

A checkpoint, a dataset or a model directory may come from anywhere; unpickling one runs
whatever code it carries. This scans every module of the ``verl`` package (its AST) for the
calls that unpickle, and allows only the ones in :data:`ALLOWED`, each with its reason:

- ``torch.load`` without ``weights_only=True``, and any call with ``weights_only=False``;
- ``pickle`` / ``_pickle`` / ``dill`` / ``cloudpickle`` loads and unpicklers, ``joblib.load``,
  ``pandas.read_pickle``;
- ``numpy.load(allow_pickle=True)``;
- ``yaml.load`` without a safe loader, ``yaml.unsafe_load`` / ``full_load``;
- ``torch.distributed.checkpoint`` loads without verl's restricted reader and planner
  (``verl.engine.dcp_io``), DCP's ``FileSystemReader`` and its ``format_utils`` converters
  (their ``.metadata`` and non-tensor values are unpickled freely).

Sending objects to Ray actors or multiprocessing workers pickles them in memory between
processes of one run; that is no load path from disk and none of these calls appear for it.

Then the two unpicklers that remain are attacked: a pickled ``inflight.pt`` planted in an
async-rollout checkpoint is refused unread, and a DCP ``.metadata`` whose pickle names a
dotted global (``module`` + ``"os.system"``) is refused before anything is called.
"""

from __future__ import annotations

import ast
import io
import os
import pickle
from pathlib import Path

import pytest
import torch

import verl

PACKAGE = Path(verl.__file__).parent

# (module path relative to the package, the flagged name) -> why it is safe.
ALLOWED = {
    ("engine/dcp_io.py", "pickle.Unpickler"): (
        "_RestrictedUnpickler: DCP's .metadata needs pickle; find_class admits exact, "
        "undotted names of DCP's metadata classes and a few torch / stdlib values only "
        "(attacked below)"
    ),
    ("engine/dcp_io.py", "torch.distributed.checkpoint.filesystem.FileSystemReader"): (
        "MetadataSafeReader subclasses it and replaces read_metadata, its one method that "
        "unpickles; the values go through WeightsOnlyLoadPlanner"
    ),
    ("utils/yaml_text.py", "yaml.load"): (
        "Loader=ConfigLoader, a yaml.SafeLoader subclass (checked below)"
    ),
}

_PICKLE_MODULES = ("pickle", "_pickle", "cPickle", "dill", "cloudpickle")
_PICKLE_NAMES = {"load", "loads", "Unpickler"}
_SAFE_YAML_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted origin, from the module's imports (any nesting level)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    out[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    out[root] = root
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                out[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return out


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    head = aliases.get(node.id, node.id)
    return ".".join([head, *reversed(parts)])


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_const(node: ast.expr | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def _flagged_reference(name: str) -> str | None:
    """The unpickling API ``name`` is, for a reference that is not a checked call."""
    module, _, attr = name.rpartition(".")
    if module in _PICKLE_MODULES and attr in _PICKLE_NAMES:
        return name
    if name in ("joblib.load", "pandas.read_pickle", "yaml.unsafe_load", "yaml.full_load"):
        return name
    if name.startswith("torch.distributed.checkpoint.") and (
        name.endswith(".FileSystemReader") or ".format_utils." in name
    ):
        return name
    return None


def _violations(path: Path) -> list[tuple[int, str, str]]:
    """``(line, flagged name, what is wrong)`` for one module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    aliases = _aliases(tree)
    found: list[tuple[int, str, str]] = []
    called: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, aliases)
        called.add(id(node.func))
        if _is_const(_keyword(node, "weights_only"), False):
            found.append((node.lineno, name or "?", "weights_only=False"))
        if name is None:
            continue
        if name == "torch.load" and not _is_const(_keyword(node, "weights_only"), True):
            found.append((node.lineno, name, "torch.load without weights_only=True"))
        elif name in ("numpy.load", "np.load") and not _is_const(
            _keyword(node, "allow_pickle"), False
        ):
            if _keyword(node, "allow_pickle") is not None:
                found.append((node.lineno, name, "numpy.load with allow_pickle"))
        elif name == "yaml.load":
            loader = _keyword(node, "Loader")
            loader_name = _dotted(loader, aliases) if loader is not None else None
            if loader_name is None or loader_name.rpartition(".")[2] not in _SAFE_YAML_LOADERS:
                found.append((node.lineno, name, f"yaml.load with Loader={loader_name}"))
        elif name in (
            "torch.distributed.checkpoint.load",
            "torch.distributed.checkpoint.load_state_dict",
        ):
            reader = _keyword(node, "storage_reader")
            planner = _keyword(node, "planner")
            safe = (
                isinstance(reader, ast.Call)
                and (_dotted(reader.func, aliases) or "").endswith("MetadataSafeReader")
                and isinstance(planner, ast.Call)
                and (_dotted(planner.func, aliases) or "").endswith("WeightsOnlyLoadPlanner")
            )
            if not safe:
                found.append((node.lineno, name, "DCP load without dcp_io's reader and planner"))
        elif (what := _flagged_reference(name)) is not None:
            found.append((node.lineno, what, "unpickles"))
    for node in ast.walk(tree):
        # a reference (a base class, an alias, an argument) that is not a call checked above
        if isinstance(node, ast.Attribute | ast.Name) and id(node) not in called:
            name = _dotted(node, aliases)
            if name is None or isinstance(getattr(node, "ctx", None), ast.Store):
                continue
            if name == "torch.load" or (what := _flagged_reference(name)) is not None:
                found.append((node.lineno, name if name == "torch.load" else what, "referenced"))
    # an attribute chain is visited once per level: report each line and name once
    return sorted(set(found))


def _all_violations() -> dict[str, list[tuple[int, str, str]]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        hits = [v for v in _violations(path) if (rel, v[1]) not in ALLOWED]
        if hits:
            out[rel] = hits
    return out


def test_no_module_unpickles_freely():
    found = _all_violations()
    assert not found, "unpickling on a load path:\n" + "\n".join(
        f"verl/{rel}:{line}: {name}: {why}"
        for rel, hits in found.items()
        for line, name, why in hits
    )


def test_the_allow_list_is_live():
    """Every allowed entry still exists (a stale entry would hide a new use)."""
    flagged = {
        (path.relative_to(PACKAGE).as_posix(), name)
        for path in PACKAGE.rglob("*.py")
        for _, name, _ in _violations(path)
    }
    assert set(ALLOWED) <= flagged, set(ALLOWED) - flagged
    import yaml

    from verl.utils.yaml_text import ConfigLoader

    assert issubclass(ConfigLoader, yaml.SafeLoader)


@pytest.mark.parametrize(
    "source",
    [
        "import torch\ntorch.load(p)\n",
        "import torch\ntorch.load(p, weights_only=False)\n",
        "from torch import load\nload(p)\n",
        "import pickle as pk\npk.loads(b)\n",
        "from pickle import Unpickler\nclass U(Unpickler): pass\n",
        "import numpy as np\nnp.load(p, allow_pickle=True)\n",
        "import dill\ndill.load(f)\n",
        "import cloudpickle\ncloudpickle.loads(b)\n",
        "import yaml\nyaml.load(t, Loader=yaml.Loader)\n",
        "import yaml\nyaml.unsafe_load(t)\n",
        "import torch.distributed.checkpoint as dcp\ndcp.load(sd, checkpoint_id=p)\n",
        "from torch.distributed.checkpoint.format_utils import dcp_to_torch_save\ndcp_to_torch_save(a, b)\n",
        "import torch\nf = torch.load\n",
        "import torch\nfoo(p, weights_only=False)\n",
    ],
)
def test_the_scan_finds(tmp_path, source):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert _violations(path), source


@pytest.mark.parametrize(
    "source",
    [
        "import torch\ntorch.load(p, map_location='cpu', weights_only=True)\n",
        "import numpy as np\nnp.load(p)\n",
        "import pickle\npickle.dumps(x)\n",
        "import yaml\nyaml.load(t, Loader=yaml.SafeLoader)\n",
        "import torch.distributed.checkpoint as dcp\n"
        "dcp.load(sd, storage_reader=MetadataSafeReader(d), planner=WeightsOnlyLoadPlanner())\n",
    ],
)
def test_the_scan_passes(tmp_path, source):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert not _violations(path), source


# ---------------------------------------------------------------------- the attacks


class _Payload:
    """Unpickling it creates ``marker`` (if anything unpickles it)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_planted_pickle_in_an_async_checkpoint_is_refused_unread(tmp_path):
    from verl.trainer.lifecycle.checkpoint import CheckpointError
    from verl.trainer.rl.async_rollout import AsyncRollout

    marker = tmp_path / "payload_ran"
    directory = tmp_path / "global_step_2" / "async_rollout"
    directory.mkdir(parents=True)
    torch.save([{"prompts": _Payload(marker), "gen": None}], directory / "inflight.pt")
    pipe = AsyncRollout(None, lambda g, p: p, dict, max_staleness=1, seed=0)
    try:
        pipe.load_state_dict({"launched": 3, "inflight": [{"version": 1, "index": 2}]})
        with pytest.raises(
            CheckpointError, match=r"refusing to load .*inflight\.pt: it is a pickle"
        ):
            pipe.load_files(directory)
    finally:
        pipe.close()
    assert not marker.exists()
    assert len(pipe) == 0


def _stack_global(module: str, name: str) -> bytes:
    """A protocol-4 pickle that calls ``module``'s attribute ``name`` with no arguments."""

    def string(s: str) -> bytes:
        data = s.encode()
        return b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE

    return b"\x80\x04" + string(module) + string(name) + b"\x93)R."  # STACK_GLOBAL, (), REDUCE


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("torch.distributed.checkpoint.filesystem", "os.getpid"),  # dotted: reaches os
        ("torch.distributed.checkpoint.metadata", "field"),  # not a metadata class
        ("os", "getpid"),
        ("builtins", "eval"),
    ],
)
def test_dcp_metadata_unpickler_refuses_other_globals(tmp_path, module, name):
    from verl.engine.dcp_io import MetadataSafeReader, _RestrictedUnpickler

    with pytest.raises(pickle.UnpicklingError, match="refusing to unpickle"):
        _RestrictedUnpickler(io.BytesIO(_stack_global(module, name))).load()
    # the same through the reader every DCP load in verl uses
    (tmp_path / ".metadata").write_bytes(_stack_global(module, name))
    with pytest.raises(pickle.UnpicklingError, match="refusing to unpickle"):
        MetadataSafeReader(str(tmp_path)).read_metadata()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_metadata_unpickler_reads_real_metadata(tmp_path):
    """The restriction still reads what DCP writes (a one-process save, no process group)."""
    import torch.distributed.checkpoint as dcp

    from verl.engine.dcp_io import read_dcp_tensors

    state = {
        "model": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3, dtype=torch.bfloat16)}
    }
    dcp.save(state, checkpoint_id=str(tmp_path), no_dist=True)
    got = read_dcp_tensors(str(tmp_path), "model")
    assert set(got) == {"w", "b"}
    assert torch.equal(got["w"], state["model"]["w"]) and got["b"].dtype == torch.bfloat16
    assert os.path.getsize(tmp_path / ".metadata") > 0
