"""A Ray driver run as a subprocess by tests/controller/test_ray_reliability.py.

It starts a local cluster the way the trainer does (``ensure_ray``), a 2-rank worker group
with a gloo process group, runs one all-reduce, then starts a call that lasts (a step in
progress), prints one JSON line (its pid, the ranks' pids, the dashboard URL) and waits:
until its stdin closes (a normal end), or until the test kills it.

    python tests/controller/ray_driver.py [--dashboard]
"""

from __future__ import annotations

import json
import os
import sys
import time

from verl.controller import (
    Dispatch,
    RayWorkerGroup,
    ResourcePool,
    Worker,
    ensure_ray,
    register,
    shutdown_ray,
)


class Ranks(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def all_reduce(self) -> float:
        import torch
        import torch.distributed as dist

        t = torch.ones(1)
        dist.all_reduce(t)
        return t.item()

    @register(Dispatch.ONE_TO_ALL)
    def pid(self) -> int:
        return os.getpid()

    @register(Dispatch.ONE_TO_ALL)
    def busy(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank


def main() -> None:
    import ray

    dashboard = "--dashboard" in sys.argv
    ensure_ray(num_cpus=2, include_dashboard=dashboard)
    group = RayWorkerGroup(Ranks, ResourcePool(process_on_nodes=[2], name="driver_test"))
    assert group.all_reduce() == [2.0, 2.0]
    ranks = group.pid()
    step = group.submit("busy", 600.0)
    context = ray.get_runtime_context()
    print(
        json.dumps(
            {
                "driver": os.getpid(),
                "ranks": ranks,
                "dashboard_url": ray._private.worker._global_node.webui_url if dashboard else None,
                "gcs_address": context.gcs_address,
            }
        ),
        flush=True,
    )
    sys.stdin.read()  # until the test closes it (or kills this process)
    del step
    group.shutdown()
    shutdown_ray()


if __name__ == "__main__":
    main()
