"""How torch's CPU threads wait between parallel regions: sleeping, not spinning.

torch's CPU wheels run their intra-op threads on GNU OpenMP, whose idle threads spin for a
while before they sleep. When every core runs one of torch's threads and anything else wants
a core too (a second job, an editor, a test run), a spinning thread holds a core that its
peer needs to finish the same region, and every region waits for a thread the scheduler
took away: the main job's matmuls and decode steps then ran several times slower
(``bench/bench_omp_wait.py``, docs/benchmarks.md). With ``OMP_WAIT_POLICY=PASSIVE`` a thread
that has nothing to do sleeps at once.

The runtime reads the policy once, when it loads with torch, so it has to be in the
environment before the process imports torch. The ``verl`` commands and upstream-style entry
modules (``python -m verl.trainer.main_ppo`` ...) set it on start, unless the user set it or
torch is already imported; processes they start (ranks, Ray workers, reward workers) inherit
it. A program that imports verl as a library sets it itself, before importing torch, e.g.
``OMP_WAIT_POLICY=PASSIVE python train.py``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping

WAIT_POLICY_ENV = "OMP_WAIT_POLICY"
PASSIVE = "PASSIVE"


def prefer_passive_wait(
    environ: MutableMapping[str, str] | None = None,
    modules: Mapping[str, object] | None = None,
) -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` in ``environ`` (default: ``os.environ``) unless it is
    set already (the user's choice stands, even an empty one) or torch is already in
    ``modules`` (default: ``sys.modules``: the runtime has read the environment by then).
    Returns whether it set it."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if WAIT_POLICY_ENV in environ or "torch" in modules:
        return False
    environ[WAIT_POLICY_ENV] = PASSIVE
    return True
