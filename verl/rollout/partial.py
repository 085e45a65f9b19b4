"""Partial rollouts: new weights for the rollout's module in the middle of a generation call.

A :class:`WeightMailbox` sits between the trainer and the rollout copy. The trainer posts
each update's weights to it (:meth:`WeightMailbox.post`, at a step boundary, from its own
thread); the native engine's continuous loop (:mod:`verl.rollout.continuous`) polls it
between two decode steps (:meth:`WeightMailbox.poll`, on the generating thread) and copies
the newest posted weights into its module in place. The mailbox's lock guards only the
hand-over of the posted ``(state, version)``: it is never held across a forward or the
copy, so a post never waits for a decode step.

What happens to the sequences in flight at a swap is the mailbox's ``mode``
(``trainer.partial_rollout``):

- ``continue``: they decode on under the new weights over the keys / values the old
  weights wrote (no extra compute). A token sampled after the swap is drawn from the new
  weights' logits over that mixed cache; its recorded log-prob is the probability it was
  drawn with (what the importance correction divides by), not ``pi_new(token | prefix)``.
- ``resume``: their caches are dropped and prompt + the tokens generated so far are
  prefilled again under the new weights (one extra forward over every running row's
  context), so every later token is drawn from exactly ``pi_new(. | prefix)``.

Either way the tokens sampled before the swap keep their log-probs, and each token records
the version of the weights that sampled it: ``rollout_token_versions`` (B*n, R) int64
beside ``rollout_log_probs``, -1 past each response's end. Within :func:`weight_mailbox`
every native ``generate`` returns it (a call that does not run the continuous loop, or
runs with no post arriving, has the mailbox's version on every token).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "PARTIAL_MODES",
    "TOKEN_VERSIONS",
    "WeightMailbox",
    "current_weight_mailbox",
    "oldest_token_version",
    "tag_token_versions",
    "weight_mailbox",
]

PARTIAL_MODES = ("continue", "resume")
TOKEN_VERSIONS = "rollout_token_versions"

_MAILBOX: contextvars.ContextVar[WeightMailbox | None] = contextvars.ContextVar(
    "verl_rollout_weight_mailbox", default=None
)


class WeightMailbox:
    """The newest posted weights, waiting for the generating thread (module docstring).

    Args:
        mode: ``continue`` or ``resume`` (what the engine does with the rows in flight).

    ``held`` is the version the module holds (set by :meth:`poll`, or by the owner after
    loading weights itself); ``stats`` counts the swaps made mid-call (``swaps``,
    ``load_s``) and, in resume mode, the re-prefilled rows and tokens (the engine adds them).
    """

    def __init__(self, mode: str) -> None:
        if mode not in PARTIAL_MODES:
            raise ValueError(
                f"trainer.partial_rollout={mode!r}: the mailbox takes {' or '.join(PARTIAL_MODES)}"
            )
        self.mode = mode
        self.held: int | None = None
        self._lock = threading.Lock()
        self._pending: tuple[dict[str, torch.Tensor], int] | None = None
        self._posted: int | None = None
        self.stats = {"swaps": 0.0, "load_s": 0.0, "resumed_rows": 0.0, "reprefill_tokens": 0.0}

    @property
    def posted_version(self) -> int | None:
        """The newest version posted (taken or not), None before the first post."""
        return self._posted

    def post(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Offer ``state`` (full state dict, CPU copies the trainer will not modify) as the
        weights of ``version``; replaces an older post not yet taken."""
        with self._lock:
            if self._posted is None or version > self._posted:
                self._pending, self._posted = (state, version), version

    def take(self) -> tuple[dict[str, torch.Tensor], int] | None:
        """The posted weights newer than ``held``, once (None: nothing new)."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is None or (self.held is not None and pending[1] <= self.held):
            return None
        return pending

    def poll(self, module: torch.nn.Module) -> int | None:
        """Between two decode steps: load the newest post into ``module`` in place and
        return its version (None: nothing new; nothing changed)."""
        pending = self.take()
        if pending is None:
            return None
        start = time.perf_counter()
        load_in_place(module, pending[0])
        self.held = pending[1]
        self.stats["swaps"] += 1
        self.stats["load_s"] += time.perf_counter() - start
        return self.held

    def reset(self) -> None:
        """Forget what was posted and held (after a checkpoint load: post again)."""
        with self._lock:
            self._pending, self._posted = None, None
        self.held = None


def load_in_place(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy ``state`` into ``module``'s parameters and buffers, tensor by tensor, then drop
    this thread's autocast cast cache.

    The swap lands inside the generate call's autocast region (the worker's
    ``engine.autocast()``), whose cache keeps the bf16 cast of each parameter (a leaf that
    requires grad) until the outermost region exits, keyed by the tensor and blind to an
    in-place write: without the clear every later forward of the call would compute with
    the old weights' casts while its tokens are tagged with the new version. The next
    forward casts (and caches) the new weights.

    Raises:
        ValueError: the names differ from the module's state dict (naming a few).
    """
    targets = module.state_dict()
    missing, unknown = sorted(set(targets) - set(state)), sorted(set(state) - set(targets))
    if missing or unknown:
        raise ValueError(
            f"partial rollout: the posted weights do not match the rollout module "
            f"(missing {missing[:3]}, unexpected {unknown[:3]})"
        )
    with torch.no_grad():
        for name, tensor in state.items():
            targets[name].copy_(tensor)
    torch.clear_autocast_cache()


@contextlib.contextmanager
def weight_mailbox(mailbox: WeightMailbox) -> Iterator[None]:
    """Within the block (this thread / context), every native ``generate`` polls
    ``mailbox`` between decode steps and returns ``rollout_token_versions``."""
    if mailbox.held is None:
        raise ValueError("weight_mailbox: set mailbox.held (the module's version) first")
    token = _MAILBOX.set(mailbox)
    try:
        yield
    finally:
        _MAILBOX.reset(token)


def current_weight_mailbox() -> WeightMailbox | None:
    """The mailbox :func:`weight_mailbox` installed here, or None."""
    return _MAILBOX.get()


def tag_token_versions(
    out: Any, versions: torch.Tensor | None, mask: torch.Tensor, mailbox: WeightMailbox | None
) -> Any:
    """``out`` (a rollout output) with ``rollout_token_versions`` (rows, R): ``versions``,
    or ``mailbox.held`` everywhere when None, and -1 where ``mask`` (rows, R) is 0.
    Unchanged without a mailbox."""
    if mailbox is None:
        return out
    device = out.batch["responses"].device
    mask = mask.to(device=device, dtype=torch.bool)
    if versions is None:
        versions = torch.full(mask.shape, int(mailbox.held), dtype=torch.long, device=device)
    out.batch[TOKEN_VERSIONS] = versions.to(device).masked_fill(~mask, -1)
    return out


def oldest_token_version(data: Any, default: int) -> int:
    """The oldest version among the valid tokens of ``data`` (a rollout output, or a group
    of one), ``default`` when it carries no ``rollout_token_versions``."""
    if data.batch is None or TOKEN_VERSIONS not in data.batch:
        return default
    versions = data.batch[TOKEN_VERSIONS]
    valid = versions[versions >= 0]
    return int(valid.min()) if valid.numel() else default
