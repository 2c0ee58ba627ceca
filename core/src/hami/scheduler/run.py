"""`hami scheduler`: the extender process, from configuration to serving, until SIGTERM.

Owns the assembly of the running scheduler: the vendor plugins (with their configuration sections), the
cluster backend (the `kubernetes` client from a kubeconfig or in-cluster), the service with its watches and
leader election, the extender's HTTP(S) server and the metrics server; and an orderly shutdown on SIGTERM or
SIGINT (stop serving, stop watching, hand the lease over).

Other services the process hosts beside the extender (the webhook, the dashboard) come in as `companions`,
built above the services (`hami.companions`), so this package imports none of them.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import FrameType
from typing import Protocol

from hami.cluster.port import Cluster
from hami.config import HamiConfig, parse_address
from hami.front import JsonServer
from hami.plugins import VendorPlugins
from hami.quota import QuotaLedger
from hami.scheduler.extender import ExtenderSettings
from hami.scheduler.server import ExtenderApp, ExtenderServer
from hami.scheduler.service import SchedulerService

__all__ = ["Companion", "Running", "SchedulerParts", "run_scheduler"]

log = logging.getLogger(__name__)

SWITCH_INTERVAL_SECONDS = 0.001
"""How long a thread may run Python before a thread waiting for the interpreter lock takes it, while the process
serves (CPython's default: 0.005). A filter that arrives while a watch or bind thread runs Python waits for the lock
up to this long, and again at each switch it loses. Set once the sync is done, restored on return; the figures are
in docs/http-front.md ("Where a request is answered")."""


class Running(Protocol):
    """Something a companion started; stopped when the scheduler stops."""

    @property
    def accepting(self) -> bool:
        """Every listener it serves accepts connections (part of the scheduler's readiness)."""
        ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class SchedulerParts:
    """What the scheduler lends a service it hosts: its cluster connection, vendors and quota ledger (so that
    admission and filter count the same usage), the process's readiness (synced, every listener accepting) for
    the service's own `/readyz`, and figures from its watched state, which a hosted service reads instead of
    listing the cluster."""

    cluster: Cluster
    plugins: VendorPlugins
    ledger: QuotaLedger
    ready: Callable[[], bool]
    totals: Callable[[], tuple[int, int, int, int, int]]
    """`ClusterState.totals`: memory used and total, cores used and total, pods counted."""
    waiting: Callable[[], int]
    """Pods addressed to a HAMi scheduler that wait for a node."""


Companion = Callable[[SchedulerParts], Running]
"""Starts a service beside the extender; stopped when the scheduler stops."""


def run_scheduler(
    config: HamiConfig,
    *,
    cluster: Cluster | None = None,
    stop: threading.Event | None = None,
    companions: Sequence[Companion] = (),
) -> int:
    """Serve until `stop` is set (or a termination signal arrives); returns the exit status."""
    stop = stop or threading.Event()
    settings = config.scheduler
    plugins = VendorPlugins.load(config=config.vendors)
    for failure in plugins.failed:
        log.error("vendor %s (%s) not loaded: %s", failure.entry_point, failure.distribution, failure.error)
    if cluster is None:
        from hami.cluster.kube import connect

        cluster = connect(config.kubeconfig)
    service = SchedulerService(
        cluster,
        plugins,
        ExtenderSettings(
            node_policy=settings.node_policy,
            device_policy=settings.device_policy,
            batch_size=settings.batch_size,
            lock_expiry_seconds=settings.lock_expiry_seconds,
            bind_lock_wait_seconds=settings.bind_lock_wait_seconds,
            handshake_interval_seconds=settings.handshake_interval_seconds,
            dra_driver=settings.dra_driver,
            # Decisions are written with the bind's patch, after the node lock: no API call on the filter's path.
            # Late watch views of a pod (an extender restarted during a burst, tests/e2e/test_nvidia_pods.py) do
            # not undo an assumed decision: `ClusterState.set_pod` ignores views older than what it counted.
            record_at_bind=True,
            pass_over_nodes_in_flight=settings.pass_over_nodes_in_flight,
            preemption_enabled=settings.preemption.enabled,
            preemption_dry_run=settings.preemption.dry_run,
            preemption_hold_seconds=settings.preemption.hold_seconds,
        ),
        settings.leader_election,
    )
    # The sync (list, rebuild, watch) runs while the listeners and the hosted services start: filter and bind
    # answer "still reading the cluster" until it is done, and the process is not ready before.
    syncer = ThreadPoolExecutor(1, thread_name_prefix="sync")
    syncing = syncer.submit(service.start)
    syncer.shutdown(wait=False)
    started: list[Running] = []
    listening: list[JsonServer] = []

    all_started = threading.Event()

    def ready() -> bool:
        # Ready once everything is started, the state is synced and every listener of the process accepts: a
        # probe that sees this can connect to the metrics and the webhook too.
        return (
            all_started.is_set()
            and service.ready
            and all(s.accepting for s in listening)
            and all(r.accepting for r in started)
        )

    app = ExtenderApp(service.extender, ready=ready, observe=service.metrics.observe, prefix=settings.url_prefix)
    tls = settings.tls
    server = ExtenderServer(
        app,
        parse_address(settings.listen),
        certfile=tls.cert_file if tls else None,
        keyfile=tls.key_file if tls else None,
        client_ca=tls.client_ca_file if tls else None,
    ).start()
    metrics = service.metrics.serve_metrics(parse_address(settings.metrics_listen))
    listening += [server, metrics]
    parts = SchedulerParts(
        cluster, plugins, service.ledger, ready, totals=service.state.totals, waiting=lambda: service.waiting
    )
    try:
        for companion in companions:
            started.append(companion(parts))
        syncing.result()  # a sync that fails (the API server refuses the lists) fails the start, as before
    except BaseException:
        for running in reversed(started):
            running.stop()
        server.stop()
        metrics.stop()
        with contextlib.suppress(BaseException):
            syncing.result()
        service.stop()
        raise
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    all_started.set()
    scheme = "https" if tls else "http"
    log.info(
        "scheduler extender serving %s://%s:%d%s (vendors: %s); metrics on :%d",
        scheme, server.server_address[0], server.port, settings.url_prefix or "/",
        ", ".join(v.name for v in plugins.vendors) or "none", metrics.port,
    )  # fmt: skip
    previous = _install_signal_handlers(stop)
    try:
        while not stop.wait(0.5):  # wake up: a signal caught by another thread runs its handler only here
            pass
    finally:
        log.info("scheduler shutting down")
        server.stop()
        metrics.stop()
        for running in reversed(started):
            running.stop()
        service.stop()
        _restore_signal_handlers(previous)
        sys.setswitchinterval(switch_interval)
    return 0


def _install_signal_handlers(stop: threading.Event) -> dict[int, object]:
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("received signal %d", signum)
        stop.set()

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}


def _restore_signal_handlers(previous: dict[int, object]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)  # type: ignore[arg-type]
