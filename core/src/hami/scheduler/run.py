"""`hami scheduler`: the extender process, from configuration to serving, until SIGTERM.

Owns the assembly of the running scheduler: the vendor plugins (with their configuration sections), the
cluster backend (the `kubernetes` client from a kubeconfig or in-cluster), the service with its watches and
leader election, the extender's HTTP(S) server, the metrics server and, when configured, the dashboard
(`hami.dashboard`); and an orderly shutdown on SIGTERM or SIGINT (stop serving, stop watching, hand the lease
over).
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

from hami.cluster.port import Cluster
from hami.config import HamiConfig, parse_address
from hami.plugins import VendorHost
from hami.scheduler.extender import ExtenderSettings
from hami.scheduler.server import ExtenderApp, ExtenderServer
from hami.scheduler.service import SchedulerService

__all__ = ["connect", "run_scheduler"]

log = logging.getLogger(__name__)


def connect(config: HamiConfig) -> Cluster:
    """The real cluster: the kubeconfig named in the configuration, or the in-cluster service account."""
    from hami.cluster.kube import KubeCluster

    if config.kubeconfig:
        return KubeCluster.from_kubeconfig(config.kubeconfig)
    return KubeCluster.in_cluster()


def run_scheduler(config: HamiConfig, *, cluster: Cluster | None = None, stop: threading.Event | None = None) -> int:
    """Serve until `stop` is set (or a termination signal arrives); returns the exit status."""
    stop = stop or threading.Event()
    settings = config.scheduler
    host = VendorHost.load(config=config.vendors)
    for failure in host.failed:
        log.error("vendor %s (%s) not loaded: %s", failure.entry_point, failure.distribution, failure.error)
    cluster = cluster or connect(config)
    service = SchedulerService(
        cluster,
        host,
        ExtenderSettings(
            node_policy=settings.node_policy,
            device_policy=settings.device_policy,
            batch_size=settings.batch_size,
            lock_expiry_seconds=settings.lock_expiry_seconds,
            bind_lock_wait_seconds=settings.bind_lock_wait_seconds,
            handshake_interval_seconds=settings.handshake_interval_seconds,
            record_in_background=True,
        ),
        settings.leader_election,
    ).start()
    app = ExtenderApp(
        service.extender, ready=lambda: service.ready, observe=service.metrics.observe, prefix=settings.url_prefix
    )
    tls = settings.tls
    server = ExtenderServer(
        app,
        parse_address(settings.listen),
        certfile=tls.cert_file if tls else None,
        keyfile=tls.key_file if tls else None,
    ).start()
    metrics = service.metrics.serve_metrics(parse_address(settings.metrics_listen))
    dashboard = None
    if settings.dashboard_listen:
        from hami.dashboard.cli import start_dashboard

        dashboard = start_dashboard(
            cluster,
            host,
            parse_address(settings.dashboard_listen),
            node_metrics=settings.dashboard_node_metrics,
            prometheus=settings.dashboard_prometheus,
        )
        log.info("dashboard on http://%s:%d/", dashboard[0].server_address[0], dashboard[0].port)
    webhook = None
    if config.webhook.get("enabled"):
        from hami.webhook.cli import validate_webhook_section
        from hami.webhook.run import start_webhook

        webhook = start_webhook(cluster, host, validate_webhook_section(config.webhook), ledger=service.ledger)
    scheme = "https" if tls else "http"
    log.info(
        "scheduler extender serving %s://%s:%d%s (vendors: %s); metrics on :%d",
        scheme, server.server_address[0], server.port, settings.url_prefix or "/",
        ", ".join(v.name for v in host.vendors) or "none", metrics.port,
    )  # fmt: skip
    previous = _install_signal_handlers(stop)
    try:
        while not stop.wait(0.5):  # wake up: a signal caught by another thread runs its handler only here
            pass
    finally:
        log.info("scheduler shutting down")
        server.stop()
        metrics.stop()
        if dashboard is not None:
            dashboard[0].stop()
            dashboard[1].stop()
        if webhook is not None:
            webhook.stop()
        service.stop()
        _restore_signal_handlers(previous)
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
