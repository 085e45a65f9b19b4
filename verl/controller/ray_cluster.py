"""Starting or joining the Ray cluster a run uses, with safe network defaults.

``ensure_ray(num_cpus, address)`` connects the driver to Ray once:

- **A new local cluster** (no ``address`` and no ``$RAY_ADDRESS``) is for this machine only:
  every Ray service (GCS, raylet, object manager, runtime-env and dashboard agents, the
  workers' and the driver's gRPC servers, the dashboard) listens on 127.0.0.1, never on
  ``0.0.0.0`` or ``::``. Ray binds its gRPC servers to loopback only when the node's IP is
  127.0.0.1, and ``ray.init(_node_ip_address="127.0.0.1")`` alone is turned back into the
  machine's address; so the node IP is pinned the way Ray does it on macOS and Windows
  (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, set while the cluster starts, so that the
  processes it starts inherit it). Ray's token authentication is on as well (Ray >= 2.52
  turns it on for a new local cluster; the token is ``~/.ray/auth_token``), unless
  ``RAY_AUTH_MODE`` says otherwise. A missing token file is created here, readable by its
  owner only (mode 0600; Ray's own writer leaves it 0644 under the usual umask), and an
  existing one that others can read is made 0600 with a warning
  (:func:`private_token_file`). The cluster's processes die with the driver
  (``verl.controller.ray_reaper``).
- **An existing cluster** (``address``, ``"auto"`` or ``$RAY_ADDRESS``) is joined as given.
  Token authentication is required (``RAY_AUTH_MODE=token`` unless the environment already
  sets ``RAY_AUTH_MODE``): the cluster must have been started with it
  (``scripts/multinode.sh`` does) and this machine needs the cluster's token (in
  ``~/.ray/auth_token`` or ``$RAY_AUTH_TOKEN``); without one the error says so.
- **The dashboard** (``include_dashboard=True``) needs Ray's dashboard packages (the
  ``ray[default]`` extra); without them ``ensure_ray`` fails before starting anything,
  with the install command.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray

logger = logging.getLogger(__name__)

__all__ = [
    "LOOPBACK",
    "DashboardUnavailableError",
    "dashboard_install_command",
    "ensure_ray",
    "private_token_file",
    "shutdown_ray",
]

LOOPBACK = "127.0.0.1"

# Ray's switch for "this machine only": with it off, the node IP is the loopback address
# and Ray's gRPC servers listen on loopback (Ray's own default on macOS and Windows).
_LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_AUTH_MODE_ENV = "RAY_AUTH_MODE"


class DashboardUnavailableError(RuntimeError):
    """``include_dashboard=True`` but Ray's dashboard packages are not installed."""


def shutdown_ray() -> None:
    """``ray.shutdown()``, then stop and reap the watchdogs of the clusters this driver started.

    Use it instead of ``ray.shutdown()`` where no process may outlive the call (the end of a
    run, the end of a test session).
    """
    from verl.controller.ray_reaper import release_watchdogs

    ray.shutdown()
    release_watchdogs()


def dashboard_install_command() -> str:
    """The pip command that installs the dashboard packages for the Ray installed here."""
    return f"pip install 'ray[default]=={ray.__version__}'"


def _dashboard_missing() -> str | None:
    """Why the dashboard cannot start here (an import error), or None when it can."""
    try:
        import ray.dashboard.optional_deps  # noqa: F401  (what Ray itself checks)
    except ImportError as err:
        return str(err)
    return None


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    """Set environment variables for the duration of the block (children inherit them)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


@contextlib.contextmanager
def _local_only() -> Iterator[None]:
    """Make the Ray node this process starts use 127.0.0.1 as its IP (loopback services)."""
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        with _env(**{_LOCAL_ONLY_ENV: "0"}):
            yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def ensure_ray(
    num_cpus: int | None = None,
    address: str | None = None,
    *,
    include_dashboard: bool = False,
    runtime_env: dict[str, Any] | None = None,
    **init_kwargs: Any,
) -> None:
    """Connect to Ray once per driver: an existing cluster, or a new local one.

    Args:
        num_cpus: logical CPUs of a new local cluster (default ``os.cpu_count()``). Give at
            least the number of bundles every pool needs together (processes x
            ``num_cpus_per_worker``); logical CPUs may exceed physical ones.
        address: an existing cluster's address (``"auto"``, ``"10.0.0.1:6379"``,
            ``"ray://host:10001"``, ...); default ``$RAY_ADDRESS``. Without either a new
            local cluster bound to 127.0.0.1 is started (never a stray ``ray start``
            cluster found on this machine).
        include_dashboard: start the dashboard (on 127.0.0.1) with a local cluster; raises
            ``DashboardUnavailableError`` with the install command when its packages are
            missing, before anything starts.
        runtime_env: job-wide Ray runtime environment, e.g.
            ``{"env_vars": {"PYTHONPATH": ...}}`` when workers need modules that the
            driver imports from outside the installed packages and its working directory.
        init_kwargs: passed to ``ray.init``.

    A no-op when Ray is already initialised (it warns if that cluster has fewer CPUs than
    ``num_cpus``).
    """
    if ray.is_initialized():
        have = ray.cluster_resources().get("CPU", 0)
        if num_cpus is not None and have < num_cpus:
            logger.warning(
                "Ray is already initialised with %s logical CPUs, fewer than num_cpus=%d "
                "asked for; placement groups that do not fit will not be scheduled",
                have,
                num_cpus,
            )
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    kwargs: dict[str, Any] = dict(init_kwargs)
    if runtime_env is not None:
        kwargs["runtime_env"] = runtime_env
    if address is not None:
        _join(address, num_cpus, include_dashboard, kwargs)
    else:
        _start_local(num_cpus, include_dashboard, kwargs)


def _join(address: str, num_cpus: int | None, include_dashboard: bool, kwargs: dict) -> None:
    if num_cpus is not None:
        logger.info("connecting to Ray at %s: num_cpus=%d is not applied", address, num_cpus)
    if include_dashboard:
        logger.info("joining Ray at %s: the dashboard is the cluster's (ray start)", address)
    mode = os.environ.get(_AUTH_MODE_ENV)
    if mode is None:
        # Ray enables token authentication for clusters it starts itself, not for an
        # explicit address: ask for it, the cluster's services are reachable by others.
        os.environ[_AUTH_MODE_ENV] = "token"
        _refresh_ray_config()
    elif mode.lower() != "token":
        logger.warning(
            "joining Ray at %s with %s=%s: the cluster accepts work from anyone who can "
            "reach it (docs/distributed.md, 'Several machines')",
            address,
            _AUTH_MODE_ENV,
            mode,
        )
    try:
        ray.init(address=address, **kwargs)
    except ConnectionError as err:
        raise ConnectionError(
            f"could not join the Ray cluster at {address!r} (trainer.ray_address / "
            "RAY_ADDRESS): check that the address is the head's (`ray status` there) and "
            "reachable, and that this machine has the cluster's authentication token (a "
            "missing or different token is refused the same way): copy the head's "
            "~/.ray/auth_token (`ray get-auth-token` there) to this machine's "
            "~/.ray/auth_token or set RAY_AUTH_TOKEN; the cluster must run with "
            f"RAY_AUTH_MODE=token (scripts/multinode.sh does). Ray said: {err}"
        ) from err
    logger.info("connected to Ray cluster at %s", address)


def _refresh_ray_config() -> None:
    # Ray caches its C++ config (which holds the auth mode) per process; reload it so the
    # mode set above applies to this process, as Ray does when it turns the mode on itself.
    from ray._raylet import Config

    Config.initialize("")


def private_token_file() -> Path | None:
    """``~/.ray/auth_token``, created (a random 256-bit token, as Ray makes them) with mode
    0600 when token authentication is on and Ray would create it; an existing file that
    group or others can read is made 0600 (WARNING). None when Ray reads no such file
    (``RAY_AUTH_MODE`` other than ``token``, or the token given by ``RAY_AUTH_TOKEN`` /
    ``RAY_AUTH_TOKEN_PATH``)."""
    mode = os.environ.get(_AUTH_MODE_ENV)
    if mode is not None and mode.lower() != "token":
        return None
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return None
    path = Path.home() / ".ray" / "auth_token"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        st = path.stat()
        if st.st_mode & 0o077 and st.st_uid == os.getuid():
            path.chmod(0o600)
            logger.warning(
                "%s was readable by others (mode %o): made it 0600, the token lets anyone "
                "who reads it run code on the Ray cluster",
                path,
                stat.S_IMODE(st.st_mode),
            )
        return path
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    with contextlib.suppress(Exception):  # Ray caches "no token" per process: look again
        from ray._raylet import AuthenticationTokenLoader

        AuthenticationTokenLoader.instance().reset_cache()
    logger.info("created Ray's authentication token %s (mode 0600)", path)
    return path


def _start_local(num_cpus: int | None, include_dashboard: bool, kwargs: dict) -> None:
    if include_dashboard:
        missing = _dashboard_missing()
        if missing is not None:
            raise DashboardUnavailableError(
                f"trainer.ray_dashboard=true needs Ray's dashboard packages, which are not "
                f"installed ({missing}); install them with: {dashboard_install_command()} "
                "(or `pip install 'verl[ray]'`), or set trainer.ray_dashboard=false"
            )
        kwargs.setdefault("dashboard_host", LOOPBACK)
    num_cpus = num_cpus if num_cpus is not None else os.cpu_count() or 1
    start = time.monotonic()
    from verl.controller.ray_reaper import CLUSTER_ENV, tie_cluster_to_driver

    private_token_file()  # before Ray writes it world-readable
    name = tie_cluster_to_driver()
    marker = {CLUSTER_ENV: name} if name is not None else {}
    with _local_only(), _env(**marker):
        context = ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=include_dashboard,
            _node_ip_address=LOOPBACK,
            **kwargs,
        )
    node_ip = ray.util.get_node_ip_address()
    if node_ip != LOOPBACK:
        logger.warning(
            "the local Ray cluster runs on %s instead of %s: its services may be reachable "
            "from the network (this Ray version, %s, ignored the loopback settings)",
            node_ip,
            LOOPBACK,
            ray.__version__,
        )
    logger.info(
        "started a local Ray cluster (%s, %d logical CPUs%s) in %.1fs",
        node_ip,
        num_cpus,
        f", dashboard at http://{context.dashboard_url}" if include_dashboard else "",
        time.monotonic() - start,
    )
