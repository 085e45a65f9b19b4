"""Giving memory back between the phases of a step (rollout, log-probs, update).

Each phase frees its activations when it ends, but the allocators keep the pages: glibc's
malloc keeps freed heap memory (and raises its mmap threshold after large frees, so later
large tensors land on the heap too), and the CUDA caching allocator keeps its blocks. The
next phase then adds its own peak on top of memory nothing uses. :func:`release_memory`
returns it (``malloc_trim`` on glibc, ``torch.cuda.empty_cache`` on CUDA); it costs a few
milliseconds and changes no value.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import torch

logger = logging.getLogger(__name__)


@functools.cache
def _malloc_trim():
    # The symbols already loaded into this process (the C library among them), looked up
    # without ctypes.util.find_library: that spawns ldconfig, and a spawn from a thread
    # can hang forever when another thread forks meanwhile (the child keeps the pipe open).
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        logger.debug("no malloc_trim in the C library: host memory is not trimmed")
        return None


def release_memory() -> None:
    """Return freed host (and CUDA cache) memory to the system."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
