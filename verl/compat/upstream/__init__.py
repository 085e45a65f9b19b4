"""Upstream verl's run-script keys, read onto this schema.

Upstream verl's example scripts (``examples/*/run_*.sh``) set keys that this schema spells
differently, or that configure machinery this build does not have (GPU engine knobs,
Ascend features, sequence parallelism). So that such a script runs as pasted, each key of
:data:`UPSTREAM_KEYS` is, by its value:

- **renamed** to the native key with the same meaning (``*_per_gpu`` becomes
  ``*_per_device`` everywhere; ``model.use_remove_padding`` is ``pack_sequences``);
- **dropped with a note** when the value asks for what happens here anyway, or for a
  setting that changes speed or memory and never results (an engine's eager mode, batch
  balancing across ranks, the log-prob passes' token budgets);
- **refused** (:class:`~verl.compat.aliases.AliasError`) when the value would change results
  and has no native meaning; the message says what to use instead.

Every rename and drop logs one WARNING on the ``verl.compat`` logger naming the native
key or the reason. :func:`translate_upstream` runs inside
:func:`verl.compat.aliases.translate_tree`, so YAML files and command-line overrides read
the same table. ``docs/config.md`` lists it (a test keeps the two in step).

Two spellings of one native key (an upstream key and the native key, or two upstream keys)
must agree, in a YAML file and on the command line alike; :func:`reconcile` holds the one
pair whose upstream meaning combines two different values: ``data.filter_overlong_prompts=
True`` with ``data.truncation=error`` (or ``left``) drops long prompts, because upstream
filters them out before its truncation applies to what remains.

The table is one module per section (:mod:`.core`, :mod:`.rl_policy`, :mod:`.rl_run`,
assembled with the per-role knobs in :mod:`.rl`; :mod:`.offline`), over the entry type of
:mod:`.entries`; :mod:`.translate` reads a tree by it. This package imports nothing of verl.
"""

from __future__ import annotations

from verl.compat.upstream.entries import DROP, Refused, UpstreamKey
from verl.compat.upstream.offline import OFFLINE_UPSTREAM_KEYS, OFFLINE_UPSTREAM_MOVES
from verl.compat.upstream.rl import UPSTREAM_KEYS, UPSTREAM_MOVES
from verl.compat.upstream.translate import reconcile, short_repr, translate_upstream

__all__ = [
    "DROP",
    "OFFLINE_UPSTREAM_KEYS",
    "OFFLINE_UPSTREAM_MOVES",
    "UPSTREAM_KEYS",
    "UPSTREAM_MOVES",
    "Refused",
    "UpstreamKey",
    "reconcile",
    "short_repr",
    "translate_upstream",
]
