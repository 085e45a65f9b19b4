"""How the Ray backend describes a rank that died: Ray's cause without its id lines, and
whether the rank's node is known to be dead.

A rank's node is named ``"<ip> id <first 12 hex digits of the Ray node id>"``
(``RayWorkerGroup.nodes``): the IP alone does not tell apart two nodes on one machine.
"""

from __future__ import annotations

import logging

import ray
from ray.exceptions import ActorUnavailableError, RayError

logger = logging.getLogger(__name__)


def death_cause(error: RayError) -> str:
    """Ray's explanation of why a worker process died, without its id/namespace lines."""
    text = getattr(error, "error_msg", None) or str(error)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("\t")]
    base = getattr(error, "BASE_ERROR_MSG", None)
    lines = [ln for ln in lines if ln != base] or lines
    cause = " ".join(lines) or type(error).__name__
    if isinstance(error, ActorUnavailableError):
        # what a lost raylet (a node gone) looks like from the driver, before the cluster
        # marks the node dead (its health check takes ~15 s)
        cause += " (the rank's process is unreachable: it or its node's raylet is gone)"
    return cause


def node_death(node: str | None) -> str:
    """``"; node ... is dead: <reason>"`` when the cluster knows the rank's node died."""
    node_id = node.split(" id ", 1)[1] if node and " id " in node else None
    if not node_id:
        return ""
    try:
        table = ray.nodes()
    except Exception as e:  # the cluster itself may be gone
        logger.debug("could not read the node table: %s", e)
        return ""
    for entry in table:
        if str(entry.get("NodeID", "")).startswith(node_id) and not entry.get("Alive", True):
            reason = entry.get("DeathReasonMessage") or "no reason recorded"
            return f"; its node {node} is dead: {reason}"
    return ""
