"""Fixtures shared by the whole test suite.

``ray_session``: one local Ray cluster for the test session, started by the first test that
asks for it (``ensure_ray(num_cpus=4)``: 4 logical CPUs, i.e. 4 single-CPU bundles, on any
machine) and shut down when the session ends. Starting Ray costs seconds, so tests share it;
tests that do not ask for it never start Ray. Tests must shut down the worker groups they
create (``wg.shutdown()`` or ``with RayWorkerGroup(...) as wg``) so later tests find free
bundles.

The pytest process runs torch on one intra-op thread (``_one_torch_thread``, set again after
any test that changed it): the suite's models are tiny, and two OpenMP threads on a 2-core
machine stall whenever anything else runs.

Under pytest-xdist the tests on the session's Ray cluster run in two xdist groups
(``ray_session`` and ``ray_session_b``, a cluster each, whole modules split by their count of
slow tests), so that neither worker waits for the other's Ray tests at the end; and each
worker's collection lists the longest work units first (the Ray groups, then the units with
the most slow tests, then the fast tests in collection order), which ``scripts/test.sh``
keeps (``--no-loadscope-reorder``): the fast tests fill in at the end, when one worker
would otherwise idle behind a long test handed out last.

vLLM's ZeroMQ sockets (``VLLM_RPC_BASE_PATH``) go in a directory of the run, removed when it
ends, not into ``/tmp`` where vLLM leaves one empty socket file per engine.

The suite leaves no process behind: every process it starts inherits the environment
variable ``VERL_TEST_SESSION`` set here, and when the session ends any process (other than
pytest itself) still carrying this session's value is reported, killed, and fails the run,
after a grace period for processes that are already shutting down (Ray's, say). Under
pytest-xdist (``scripts/test.sh`` runs two workers) each worker checks the processes of its own
tests (its value is the controller's plus its id) and hands what it found to the controller,
which fails the run. Sooner than that, a test whose ``multiprocessing`` children outlive it
fails at its teardown (``_no_child_left``), so the report names the test, not the session.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from verl.utils.lifetime import processes_with_env
from verl.utils.omp_wait import PASSIVE, WAIT_POLICY_ENV

RAY_TEST_CPUS = 4
RAY_GROUPS = ("ray_session", "ray_session_b")  # one cluster each, on different workers
SLOW_WEIGHT = 25  # a slow test against a fast one when ordering and splitting work units
SESSION_MARK = "VERL_TEST_SESSION"
LEAK_GRACE_S = float(os.environ.get("VERL_TEST_LEAK_GRACE_S", "15"))
CHILD_GRACE_S = float(os.environ.get("VERL_TEST_CHILD_GRACE_S", "5"))
VLLM_RPC_VAR = "VLLM_RPC_BASE_PATH"


LEFT_BEHIND_KEY = "verl_left_behind"  # an xdist worker's report to the controller
_worker_reports = pytest.StashKey[list]()
_ray_unmarked = pytest.StashKey[set]()  # Ray tests without the slow mark
_vllm_rpc_dir = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    worker = getattr(config, "workerinput", {}).get("workerid")  # set on xdist workers only
    inherited = os.environ.get(SESSION_MARK)
    # A worker's processes carry a value of their own: the worker processes themselves carry
    # the controller's (the environment they started with), so no scan finds its own runner.
    os.environ[SESSION_MARK] = f"{inherited}.{worker}" if worker and inherited else uuid.uuid4().hex
    config.stash[_worker_reports] = []
    # torch's OpenMP threads sleep when they wait, in every process the tests start, as in
    # the processes verl's commands start (verl/utils/omp_wait.py): the suite's processes
    # share two cores, where spinning threads stall each other
    os.environ.setdefault(WAIT_POLICY_ENV, PASSIVE)
    if worker:
        config.pluginmanager.register(_XdistGroupIds(), "verl-xdist-group-ids")
    if VLLM_RPC_VAR not in os.environ:  # xdist workers inherit the controller's directory
        os.environ[VLLM_RPC_VAR] = tempfile.mkdtemp(prefix="verl-vllm-rpc-")
        config.stash[_vllm_rpc_dir] = os.environ[VLLM_RPC_VAR]


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(_vllm_rpc_dir, None)
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        os.environ.pop(VLLM_RPC_VAR, None)


class _XdistGroupIds:
    """Makes ``--dist loadgroup`` group again under pytest >= 9.2.

    pytest-xdist names a test's group by setting ``item._nodeid`` to ``<nodeid>@<group>`` in
    its worker's ``pytest_collection_modifyitems``; the ids the worker then reports to the
    scheduler are ``item.nodeid``. Since pytest 9.2 ``item.nodeid`` is built from ``item._id``
    and ignores ``_nodeid``, so the scheduler saw no group: the Ray tests ran on both workers
    (a cluster each) and a module fixture shared by a group's tests was made by both. This
    hook, after xdist's, gives ``item._id`` the grouped id when the two differ.
    """

    @pytest.hookimpl(trylast=True)  # after xdist's worker hook has set item._nodeid
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        try:
            from _pytest.nodeid import NodeId
        except ImportError:  # pytest < 9.2: item.nodeid is item._nodeid
            return
        for item in items:
            grouped = getattr(item, "_nodeid", None)
            if isinstance(grouped, str) and "@" in grouped and grouped != item.nodeid:
                item._id = NodeId.parse(grouped)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """xdist controller: keep what a finished worker found left behind."""
    message = getattr(node, "workeroutput", {}).get(LEFT_BEHIND_KEY)
    if message:
        node.config.stash[_worker_reports].append(message)


def _left_behind(mark: str) -> dict[int, str]:
    """The session's processes except multiprocessing's resource tracker of pytest itself,
    which ends when pytest does (its pipe closes)."""
    found = processes_with_env(SESSION_MARK, mark)
    for pid, cmd in list(found.items()):
        if "multiprocessing.resource_tracker" in cmd and _parent(pid) == os.getpid():
            del found[pid]
    return found


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if config.pluginmanager.has_plugin("dsession"):  # the xdist controller: runs no test
        reports = config.stash[_worker_reports]
        if reports:
            _report(session, "\n".join(reports))
        return
    message = _kill_left_behind(os.environ.get(SESSION_MARK))
    if message is None:
        return
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its exit status does not reach the run's
        workeroutput[LEFT_BEHIND_KEY] = message
    _report(session, message)


def _report(session: pytest.Session, message: str) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(message, red=True)
    else:
        print(message)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _kill_left_behind(mark: str | None) -> str | None:
    """Wait out the grace period, kill what is still alive, and say what it was."""
    if not mark or not Path("/proc/self/environ").exists():
        return None
    deadline = time.monotonic() + LEAK_GRACE_S
    leaked = _left_behind(mark)
    while leaked and time.monotonic() < deadline:
        time.sleep(0.5)
        leaked = _left_behind(mark)
    if not leaked:
        return None
    for pid in leaked:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    lines = "\n".join(f"  pid {pid}: {cmd[:200]}" for pid, cmd in sorted(leaked.items()))
    return f"the test session left {len(leaked)} process(es) alive (now killed):\n{lines}"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests on the session's Ray cluster run in the xdist groups ``RAY_GROUPS``
    (``--dist loadgroup``), whole modules each: one cluster per group, not one per test
    module or per worker. So do the tests of a module that share a module-scoped fixture of
    that module (a spawned multi-rank run, a training run several tests assert on):
    ``--dist loadgroup`` hands ungrouped tests out one by one, and a module fixture is made
    once per worker that runs one of its tests. An explicit ``xdist_group`` mark wins.

    On an xdist worker the items are then ordered longest work unit first (see
    :func:`_longest_units_first`); both workers order the same collection the same way.

    A test on the session's Ray cluster without ``@pytest.mark.slow`` is noted, and fails
    at its setup (:func:`pytest_runtest_setup`) before it starts Ray: Ray tests are slow
    tests, so that ``-m "not slow"`` never starts a cluster."""
    ray_items = [item for item in items if "ray_session" in getattr(item, "fixturenames", ())]
    config.stash[_ray_unmarked] = {
        item for item in ray_items if item.get_closest_marker("slow") is None
    }
    ray_group = _split_ray_modules(ray_items)
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(ray_group[_module_of(item)]))
        elif item.get_closest_marker("xdist_group") is None:
            group = _module_fixture_group(item)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))
    if getattr(config, "workerinput", None) is not None:
        items[:] = _longest_units_first(items)


@pytest.hookimpl(tryfirst=True)  # before the fixtures' setup, which would start Ray
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item in item.config.stash.get(_ray_unmarked, ()):
        pytest.fail(
            f"{item.nodeid} runs on the session's Ray cluster (fixture ray_session) without "
            "@pytest.mark.slow: a Ray test is a slow test; mark it",
            pytrace=False,
        )


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _weight(item: pytest.Item) -> int:
    """A test's expected share of the run: ``SLOW_WEIGHT`` for a slow test, else 1."""
    return SLOW_WEIGHT if item.get_closest_marker("slow") is not None else 1


def _split_ray_modules(items: list[pytest.Item]) -> dict[str, str]:
    """``{module: group}`` over ``RAY_GROUPS``: the heaviest module (by :func:`_weight`) to the
    lightest group so far, so each group holds about half of the Ray tests' time."""
    weights: dict[str, int] = {}
    for item in items:
        weights[_module_of(item)] = weights.get(_module_of(item), 0) + _weight(item)
    load = dict.fromkeys(RAY_GROUPS, 0)
    groups: dict[str, str] = {}
    for module, weight in sorted(weights.items(), key=lambda mw: (-mw[1], mw[0])):
        lightest = min(RAY_GROUPS, key=lambda g: (load[g], RAY_GROUPS.index(g)))
        groups[module] = lightest
        load[lightest] += weight
    return groups


def _longest_units_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items with each xdist work unit's (an ``xdist_group``, else a single test)
    together, heaviest unit (sum of :func:`_weight`) first, ties in collection order.

    ``--dist loadgroup --no-loadscope-reorder`` hands the units out in this order as the
    workers free up: the two Ray groups start at once on the two workers, the long tests
    follow, and the fast ones balance the end."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        name = (mark.args[0] if mark.args else mark.kwargs.get("name")) if mark else None
        units.setdefault(f"@{name}" if name else item.nodeid, []).append(item)
    ordered = sorted(units.values(), key=lambda unit: -sum(_weight(i) for i in unit))
    return [item for unit in ordered for item in unit]


def _module_fixture_group(item: pytest.Item) -> str | None:
    """``<module>::<fixture>`` for a test that uses a module-scoped fixture defined in its own
    module (the first such fixture by name), else None."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    module = item.nodeid.split("::", 1)[0]
    shared = sorted(
        name
        for name, defs in info.name2fixturedefs.items()
        if defs and defs[-1].scope == "module" and defs[-1].baseid == module
    )
    return f"{module}::{shared[0]}" if shared else None


def kill_ray_children(marker: str = "/ray/") -> list[int]:
    """SIGKILL this process's children whose command line holds ``marker`` (the default:
    those that run Ray's code, its GCS, raylet, log monitor, dashboard, ...) and return their
    pids. A local start that timed out leaves some of them running (the log monitor, seen on
    a loaded machine), which ``ray.shutdown`` does not stop: the session's leak check then
    failed the run."""
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or _parent(int(entry.name)) != os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd:
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Any]:
    """The ``ray`` module, initialised with ``RAY_TEST_CPUS`` logical CPUs. A start that times
    out (Ray waits 30 s for its raylet, which a loaded machine can exceed) is tried once more."""
    ray = pytest.importorskip("ray")
    from verl.controller import ensure_ray, shutdown_ray

    started_here = not ray.is_initialized()
    try:
        ensure_ray(num_cpus=RAY_TEST_CPUS)
    except Exception as err:  # Ray raises a bare Exception for the start-up timeout
        if "timed out during startup" not in str(err):
            raise
        warnings.warn(f"Ray did not start, trying once more: {err}", stacklevel=1)
        shutdown_ray()
        kill_ray_children()  # the timed-out start's processes Ray no longer knows of
        ensure_ray(num_cpus=RAY_TEST_CPUS)
    yield ray
    if started_here:
        shutdown_ray()  # Ray, and the watchdog that ties its processes to this one


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread() -> Iterator[None]:
    """One torch intra-op thread in the pytest process: the suite's models are tiny and
    overhead-bound, and two OpenMP threads on two cores stall at every op whenever anything
    else runs (the session's Ray cluster, a child process): a tiny-model GRPO step took ~10x
    longer. Tests that need more threads set them; runs the suite compares with a child
    pass ``trainer.num_threads=torch.get_num_threads()`` on."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _one_torch_thread_after_each_test(_one_torch_thread: None) -> Iterator[None]:
    """A test that raises the count (``trainer.num_threads``, an example's ``--threads``)
    hands the next test of its worker one thread again, not its own count."""
    import torch

    yield
    if torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _no_child_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test whose ``multiprocessing`` children (a reward pool's ``verl-reward-worker``, a
    DataLoader's workers, a spawned rank) outlive it fails at teardown, naming them, and they
    are stopped so that later tests do not inherit them: a garbage collection first (an owner
    that is garbage stops them its own way), then SIGKILL.

    Only the children this test started count: those alive before it (a module- or
    session-scoped fixture's, set up before this function-scoped fixture) are left alone;
    Ray's processes (the session's clusters) are not ``multiprocessing`` children. A child
    still shutting down gets ``CHILD_GRACE_S`` seconds. The check reads this process's own
    child list (``multiprocessing.active_children``: a non-blocking ``waitpid`` per child),
    about a microsecond per test.
    """
    before = set(multiprocessing.active_children())
    yield
    left = _exiting([p for p in multiprocessing.active_children() if p not in before])
    if not left:
        return
    # what owns them is garbage (a reward pool, a DataLoader iterator in a traceback's cycle):
    # collecting it lets its owner stop them as it would (torch's loader unregisters its
    # workers first; killing them under it raises in the next test's SIGCHLD)
    gc.collect()
    reclaimed = {p.pid for p in left} - {p.pid for p in _exiting(left)}
    names = ", ".join(
        f"{p.name} (pid {p.pid}{', stopped by gc' if p.pid in reclaimed else ''})" for p in left
    )
    for process in left:
        if process.is_alive():
            process.kill()
            process.join(timeout=5.0)
    pytest.fail(
        f"{request.node.nodeid} left {len(left)} multiprocessing child process(es) alive "
        f"{CHILD_GRACE_S:g} s after it ended: {names}. Close what started them (a trainer's "
        "or reward manager's close(), a RewardWorkerPool's with-block, a loader's close()) "
        "in the test, or fix the code that does not.",
        pytrace=False,
    )


def _exiting(processes: list[Any]) -> list[Any]:
    """Those of ``processes`` still alive after up to ``CHILD_GRACE_S`` seconds."""
    deadline = time.monotonic() + CHILD_GRACE_S
    while processes and time.monotonic() < deadline:
        time.sleep(0.05)
        processes = [p for p in processes if p.is_alive()]
    return processes


class ProcessGroupLeft(UserWarning):
    """A test left a torch.distributed default group initialised in the pytest process."""


@pytest.fixture(autouse=True)
def _no_process_group_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """A group made in this process by a test (a one-rank FSDP2 run in the driver) would
    make later tests see a group they did not make: leave it, and say which test made it."""
    import torch.distributed as dist

    before = dist.is_available() and dist.is_initialized()
    yield
    if not before and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        message = f"{request.node.nodeid} left a torch.distributed process group"
        warnings.warn(message, ProcessGroupLeft, stacklevel=2)


@pytest.fixture
def packed_calls(monkeypatch) -> list[int]:
    """The native engine's packed-weight calls (``verl.kernels.packed_linear``): one entry
    per ``generate`` call that packed, the number of ``Linear`` layers it swapped."""
    from verl.kernels import packed_linear

    calls: list[int] = []
    real = packed_linear.packed_linears

    @contextlib.contextmanager
    def counting(module, batch_hint=1):
        with real(module, batch_hint) as swapped:
            calls.append(swapped)
            yield swapped

    monkeypatch.setattr(packed_linear, "packed_linears", counting)
    return calls
