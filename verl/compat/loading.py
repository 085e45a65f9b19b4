"""The built-in input adapters of the config loader: other spellings read onto the schema.

The native loader (``verl.config.load``) reads native keys only; it asks
``verl.registry.CONFIG_ADAPTERS`` for adapters, and the built-in entries are these (and
``verl.compat.flat_keys.adapt_keywords`` for ``TrainerConfig(...)``'s keywords):

* ``loading`` -- :class:`LoadAdapter`, one per load: the user's YAML tree through
  :func:`verl.compat.aliases.translate_tree` (upstream verl's keys, the tutorials' aliases,
  torch dtypes), and each command-line override through
  :func:`~verl.compat.aliases.translate_override`, with one :class:`~verl.compat.aliases.KeySources`
  shared by the file and the overrides, so that two spellings of one key must agree;
* ``value`` -- :func:`spelled_choice`: a dtype written as text (``"bfloat16"``,
  ``"torch.bfloat16"``) where an enumerated key names a precision.

Each adapter logs one note per alias naming the native spelling (``verl.compat`` logger).
"""

from __future__ import annotations

from typing import Any

from verl.compat.aliases import (
    KeySources,
    Spelling,
    note,
    precision_string,
    translate_override,
    translate_tree,
)
from verl.config.load import schema_paths

__all__ = ["LoadAdapter", "spelled_choice"]


class LoadAdapter:
    """The other spellings of one load of the schema ``root`` (a YAML file, then overrides)."""

    def __init__(self, root: type) -> None:
        self.root = root.__name__
        self.known = schema_paths(root).__contains__  # *_per_gpu only onto a key that exists
        self.sources = KeySources()  # which spelling set each native key (file, command line)

    def tree(self, tree: dict[str, Any], refused: list[str]) -> dict[str, Any]:
        """``tree`` in native keys; each refused key's message is appended to ``refused``
        and the key left out, and the file's other keys are still read."""
        return translate_tree(
            tree, self.root, errors=refused, sources=self.sources, known=self.known
        )

    def override(self, key: str, value: Any, refused: list[tuple[str, str]]) -> list[Any]:
        """The native ``(key, value)`` assignments of the override ``key=value``; raises
        ``AliasError`` for a refused key, and appends ``(native key, message)`` to
        ``refused`` for an assignment that disagrees with another spelling of this load."""
        out = []
        for native_key, native_value in translate_override(key, value, self.root, self.known):
            spelling = Spelling(key, value, native_value, "command line")
            try:
                out.append((native_key, self.sources.claim(native_key, spelling)))
            except ValueError as exc:  # AliasError
                refused.append((native_key, str(exc)))
        return out


def spelled_choice(path: str, value: Any, choices: tuple[Any, ...]) -> str | None:
    """The precision name a dtype written as text spells when it is one of ``choices``
    (``"bfloat16"`` -> ``bf16``, with a note), else None."""
    named = precision_string(value)
    if named not in choices:
        return None
    note(f"{path}={value}", f"{path}={named}")
    return named
