"""``register(..., beside=True)``: on the Ray backend such a method is answered on a second
thread of the worker's actor while another call of the group runs; ordinary calls still run
one after another. On the local backend it is an ordinary call."""

from __future__ import annotations

import threading
import time

import pytest

from verl.controller import Dispatch, LocalWorkerGroup, ResourcePool, Worker, register


class BusyWorker(Worker):
    """``work`` runs until ``release`` is called; ``progress`` reads how far it got."""

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0
        self.go = threading.Event()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, rank_zero_result=True)
    def work(self, steps: int) -> int:
        for _ in range(steps):
            self.steps += 1
            time.sleep(0.01)
        assert self.go.wait(60), "never released"
        return self.steps

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, rank_zero_result=True, beside=True)
    def progress(self) -> int:
        return self.steps

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, rank_zero_result=True, beside=True)
    def release(self) -> None:
        self.go.set()


@pytest.mark.slow
def test_beside_method_answers_while_a_call_runs(ray_session):
    from verl.controller import RayWorkerGroup

    with RayWorkerGroup(BusyWorker, ResourcePool([1], name="beside")) as wg:
        running = wg.work.submit(5)
        deadline = time.monotonic() + 30
        while wg.progress() < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert wg.progress() == 5  # answered while ``work`` still waits
        assert not running.done()
        wg.release()
        assert running.result(timeout=30) == 5


def test_beside_is_an_ordinary_call_in_process():
    wg = LocalWorkerGroup(BusyWorker, ResourcePool([1]))
    wg.release()  # set first: the in-process call below runs on this thread
    assert wg.work(3) == 3 and wg.progress() == 3
