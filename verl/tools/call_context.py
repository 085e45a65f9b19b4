"""The sample a tool call belongs to, for tools that read their row's data.

The agent loop (``verl.rollout.agent_loop``) runs each tool call inside
:func:`row_context` with the sample's ``data_source`` / ``ground_truth`` / ``extra_info``
(the prompts' ``non_tensor_batch`` columns). A tool reads them with :func:`current_row`;
upstream verl's tools get their per-row ``extra_info.tools_kwargs[name].create_kwargs``
this way (:mod:`verl.tools.upstream_adapter`). Plain function tools never need it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["current_row", "row_context"]

_ROW = threading.local()


def current_row() -> Mapping[str, Any]:
    """The row of the tool call running in this thread (``data_source``, ``ground_truth``,
    ``extra_info`` where the prompts had them); ``{}`` outside a call of the agent loop."""
    return getattr(_ROW, "row", None) or {}


@contextlib.contextmanager
def row_context(row: Mapping[str, Any] | None) -> Iterator[None]:
    """Within the block, :func:`current_row` is ``row`` (in this thread)."""
    before = getattr(_ROW, "row", None)
    _ROW.row = row
    try:
        yield
    finally:
        _ROW.row = before
