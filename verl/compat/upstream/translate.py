"""Reading a tree by the table: renames, drops with a note, refusals, ``*_per_gpu`` keys, and
the one pair of spellings :func:`reconcile` combines."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from verl.compat.upstream.entries import DROP, Refused, UpstreamKey
from verl.compat.upstream.offline import OFFLINE_UPSTREAM_KEYS, OFFLINE_UPSTREAM_MOVES
from verl.compat.upstream.rl import UPSTREAM_KEYS, UPSTREAM_MOVES

logger = logging.getLogger("verl.compat")


def translate_upstream(
    tree: dict[str, Any],
    root: str,
    error: type[Exception],
    put: Callable[..., None],
    errors: list[str] | None = None,
    known: Callable[[str], bool] | None = None,
) -> None:
    """Read ``tree``'s upstream keys in place (see the module docstring); ``error`` is the
    exception raised for a refused value, ``put(tree, native key, value, upstream key,
    upstream value)`` sets a renamed key (the alias module's own setter: its conflict check
    and note).

    The subtrees that moved between upstream's releases (:data:`UPSTREAM_MOVES`) are read
    first as their older spelling; then every exact key of the table, then its subtrees
    (``prefix.*``: each leaf under the prefix). A value that is an OmegaConf interpolation
    (``${...}``) or Hydra's missing value ``???`` is dropped with a note: upstream copies
    another key there, and the native default follows that key here.

    With an ``errors`` list, each refused key's message is appended there and the key is
    removed, and the other keys are still read (one message per problem); without one the
    first refusal is raised. ``known(dotted key)`` says whether the schema has a key: a
    ``*_per_gpu`` key is renamed only onto a ``*_per_device`` key that exists (another is
    left for the unknown-key check, under the name it was written with).
    """
    rl = root == "TrainerConfig"
    table = UPSTREAM_KEYS if rl else OFFLINE_UPSTREAM_KEYS
    moves = UPSTREAM_MOVES if rl else OFFLINE_UPSTREAM_MOVES

    def refuse(message: str) -> None:
        if errors is None:
            raise error(message)
        errors.append(message)

    for old, new in moves.items():
        found, value = _pop(tree, old)
        if found:
            logger.warning("%s is read as upstream's %s (its older spelling)", old, new)
            conflict = _merge(tree, new, value)
            if conflict:
                refuse(f"{old} and {new} both set {conflict}; give one of them")
    exact = [(path, key) for path, key in table.items() if not path.endswith(".*")]
    subtrees = [(path[:-2], key) for path, key in table.items() if path.endswith(".*")]
    for path, key in exact:
        if key.choice and not isinstance(_get_path(tree, path), str):
            continue  # a config-group choice is a string; a mapping is the native section
        found, value = _pop(tree, path)
        if found:
            _read_one(tree, path, value, key, error, put, refuse)
    for prefix, key in subtrees:
        found, value = _pop(tree, prefix)
        if found:
            for leaf, leaf_value in _leaves(value, prefix):
                _read_one(tree, leaf, leaf_value, key, error, put, refuse)
    _rename_per_gpu(tree, tree, "", error, put, errors, known)


def _read_one(
    tree: dict[str, Any],
    path: str,
    value: Any,
    key: UpstreamKey,
    error: type[Exception],
    put: Callable[..., None],
    refuse: Callable[[str], None],
) -> None:
    """Read one upstream ``path=value`` by its entry ``key`` (rename, drop or refusal)."""
    if _copies_another_key(value):
        logger.warning(
            "%s=%s is dropped: upstream copies another key there; the native default "
            "follows it here",
            path,
            short_repr(value),
        )
        return
    try:
        if key.keeps is not None and value not in key.keeps:
            raise Refused(key.refusal or key.reason)
        native_value = key.value(value) if key.value is not None else value
    except Refused as exc:
        refuse(f"{path}={short_repr(value)}: {exc}")
        return
    if key.native == path and native_value == value:  # a native value, as it is
        _restore(tree, path, value)
        return
    if key.native is None or native_value is DROP:
        logger.warning("%s=%s is dropped: %s", path, short_repr(value), key.reason)
        return
    try:
        put(tree, key.native, native_value, path, value)
    except error as exc:
        refuse(str(exc))


def _copies_another_key(value: Any) -> bool:
    """An OmegaConf interpolation (``${...}``) or Hydra's missing value (``???``)."""
    return isinstance(value, str) and (value.startswith("${") or value == "???")


def _leaves(value: Any, prefix: str) -> list[tuple[str, Any]]:
    """``(dotted key, value)`` of every leaf of ``value`` under ``prefix``; an empty mapping
    or a non-mapping is one leaf."""
    if not isinstance(value, dict) or not value:
        return [(prefix, value)]
    out: list[tuple[str, Any]] = []
    for name, child in value.items():
        out += _leaves(child, f"{prefix}.{name}")
    return out


def _get_path(tree: dict[str, Any], path: str) -> Any:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _merge(tree: dict[str, Any], path: str, value: Any) -> str | None:
    """Put ``value`` at ``path`` of ``tree``, merging mappings; the dotted key of the first
    leaf already there with another value, else ``None``."""
    *parents, last = path.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return path
    if last not in node:
        node[last] = value
        return None
    current = node[last]
    if isinstance(current, dict) and isinstance(value, dict):
        for name, child in value.items():
            conflict = _merge(current, name, child)
            if conflict:
                return f"{path}.{conflict}"
        return None
    return None if current == value else path


def reconcile(path: str, spellings: dict[str, Any]) -> tuple[bool, Any]:
    """``(True, value)`` when the native key ``path``, given by the two keys of
    ``spellings`` (key as written -> the native value it sets) with different values,
    has one upstream meaning; else ``(False, None)`` (the two are a conflict).

    - ``data.filter_overlong_prompts=True`` with ``data.truncation=error`` or ``left``:
      drop (upstream filters long prompts out before it truncates what remains);
    - the config-group choice ``engine=fsdp`` with ``engine.strategy``: the strategy
      (the choice selects the engine's group, the key sets the strategy within it).
    """
    if path == "engine.strategy" and set(spellings) == {"engine", "engine.strategy"}:
        return True, spellings["engine.strategy"]
    filtered, truncation = spellings.get(_FILTER), spellings.get("data.truncation")
    if path != "data.truncation" or filtered != "drop" or truncation not in ("error", "left"):
        return False, None
    logger.info(
        "%s=True with data.truncation=%s: prompts over data.max_prompt_length are dropped "
        "(data.truncation=drop), as upstream filters them out before its truncation "
        "applies to the prompts that remain",
        _FILTER,
        truncation,
    )
    return True, "drop"


_FILTER = "data.filter_overlong_prompts"
_SHORT = 200  # characters of a value quoted in a message


def short_repr(value: Any) -> str:
    """``repr(value)``, cut to :data:`_SHORT` characters (a message quotes the value, never
    a whole file's worth of it)."""
    text = repr(value)
    return text if len(text) <= _SHORT else f"{text[:_SHORT]}... ({len(text)} characters)"


def _restore(tree: dict[str, Any], path: str, value: Any) -> None:
    """Put back what :func:`_pop` took (its emptied parents included)."""
    *parents, last = path.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _pop(tree: dict[str, Any], path: str) -> tuple[bool, Any]:
    """Remove ``path`` from ``tree``; ``(found, value)``. Emptied parents are removed."""
    *parents, last = path.split(".")
    chain = [tree]
    for part in parents:
        node = chain[-1].get(part)
        if not isinstance(node, dict):
            return False, None
        chain.append(node)
    if last not in chain[-1]:
        return False, None
    value = chain[-1].pop(last)
    for parent, part in zip(reversed(chain[:-1]), reversed(parents), strict=True):
        if parent[part]:
            break
        del parent[part]
    return True, value


# *_per_device keys that take no null (upstream's null there means "derived from another key")
_NOT_NULL = frozenset({"micro_batch_size_per_device"})


def _rename_per_gpu(
    tree: dict[str, Any],
    node: dict[str, Any],
    prefix: str,
    error: type[Exception],
    put: Callable[..., None],
    errors: list[str] | None,
    known: Callable[[str], bool] | None = None,
) -> None:
    """``*_per_gpu`` keys become ``*_per_device`` (upstream says GPU where this says device),
    each set through ``put`` on the whole ``tree`` (its conflict check and note); with
    ``known``, only onto a key the schema has."""
    for name in list(node):
        value = node[name]
        if isinstance(value, dict):
            _rename_per_gpu(tree, value, f"{prefix}{name}.", error, put, errors, known)
        if name.endswith("_per_gpu"):
            native = name[: -len("_per_gpu")] + "_per_device"
            if known is not None and not known(f"{prefix}{native}"):
                continue  # no such key here: reported as unknown, as written
            del node[name]
            if _copies_another_key(value) or (value is None and native in _NOT_NULL):
                logger.warning(
                    "%s%s=%s is dropped: upstream derives it from another key; the native "
                    "default applies here",
                    prefix,
                    name,
                    short_repr(value),
                )
                continue
            try:
                put(tree, f"{prefix}{native}", value, f"{prefix}{name}")
            except error as exc:
                if errors is None:
                    raise
                errors.append(str(exc))
