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

An override of an on/off key with an empty value (``use_kl_loss=``: a script's unset shell
variable) is read as false with a note, as upstream's code reads Hydra's empty string.

Each adapter logs one note per alias naming the native spelling (``verl.compat`` logger).
"""

from __future__ import annotations

import logging
from typing import Any

from verl.compat.aliases import (
    KeySources,
    Spelling,
    note,
    precision_string,
    translate_override,
    translate_tree,
)
from verl.config.load import iter_schema, schema_paths, unwrap_optional

__all__ = ["LoadAdapter", "spelled_choice"]

logger = logging.getLogger("verl.compat")


class LoadAdapter:
    """The other spellings of one load of the schema ``root`` (a YAML file, then overrides)."""

    def __init__(self, root: type) -> None:
        self.root = root.__name__
        self.known = schema_paths(root).__contains__  # *_per_gpu only onto a key that exists
        self.sources = KeySources()  # which spelling set each native key (file, command line)
        self.flags = {  # the on/off keys: an empty value there is upstream's falsy ''
            path for path, _, tp in iter_schema(root) if unwrap_optional(tp)[0] is bool
        }

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
            if native_value == "" and native_key in self.flags:
                native_value = _empty_flag(key)
            spelling = Spelling(key, value, native_value, "command line")
            try:
                out.append((native_key, self.sources.claim(native_key, spelling)))
            except ValueError as exc:  # AliasError
                refused.append((native_key, str(exc)))
        return out


def _empty_flag(key: str) -> bool:
    """``key=`` with nothing after ``=`` on an on/off key (a script's unset shell variable,
    ``use_kl_loss=${use_kl_loss}``): Hydra passes an empty string, which upstream's code
    tests for truth, so the flag is off; read as false with a note."""
    logger.warning(
        "%s= (an empty value: Hydra passes '', which upstream reads as off) is read as %s=false",
        key,
        key,
    )
    return False


def spelled_choice(path: str, value: Any, choices: tuple[Any, ...]) -> str | None:
    """The precision name a dtype written as text spells when it is one of ``choices``
    (``"bfloat16"`` -> ``bf16``, with a note), else None."""
    named = precision_string(value)
    if named not in choices:
        return None
    note(f"{path}={value}", f"{path}={named}")
    return named
