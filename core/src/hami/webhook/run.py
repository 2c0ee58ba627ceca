"""`hami webhook`: the admission webhook as a process of its own, or started inside the scheduler's process.

Owns the assembly: the vendor plugins, the cluster connection (`hami.cluster.kube.connect`), the quota ledger
and the namespace labels with their watches, the HTTPS server with its reloadable certificate; and an orderly
shutdown on SIGTERM or SIGINT (stop serving, then stop watching).

`start_webhook` is the piece the scheduler's process calls (through `hami.companions`) to serve the webhook beside
the extender, passing its own `QuotaLedger` (`hami.quota`, below both services) so that admission and filter
count the same usage.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from hami.cluster.port import Cluster, ClusterError
from hami.config import HamiConfig, parse_address
from hami.errors import ConfigError
from hami.plugins import VendorPlugins
from hami.quota import QuotaLedger
from hami.webhook.namespaces import NamespaceLabels
from hami.webhook.server import WebhookApp, WebhookServer
from hami.webhook.settings import WebhookConfig

__all__ = ["RunningWebhook", "run_webhook", "start_webhook"]

log = logging.getLogger(__name__)


@dataclass
class RunningWebhook:
    """A serving webhook and what it watches; `stop` ends all of it (a ledger passed in is left running)."""

    server: WebhookServer
    ledger: QuotaLedger
    namespaces: NamespaceLabels | None
    owns_ledger: bool

    @property
    def accepting(self) -> bool:
        return self.server.accepting

    def stop(self) -> None:
        self.server.stop()
        if self.namespaces is not None:
            self.namespaces.stop()
        if self.owns_ledger:
            self.ledger.stop()


def start_webhook(
    cluster: Cluster,
    plugins: VendorPlugins,
    settings: WebhookConfig,
    *,
    ledger: QuotaLedger | None = None,
    also_ready: Callable[[], bool] = lambda: True,
) -> RunningWebhook:
    """Start watching and serving; returns once the server accepts connections. `/readyz` answers ready when
    the ledger is synced, the server accepts and `also_ready()` (the hosting process's other listeners).

    :raises ConfigError: no usable certificate and key.
    :raises ClusterError: ResourceQuotas or pods cannot be listed (quotas could not be enforced).
    """
    if settings.tls is None:
        raise ConfigError(
            "the webhook needs a TLS certificate and key (kube-apiserver calls webhooks over HTTPS only): "
            "set webhook.tls or --tls-cert/--tls-key; `hami webhook certs` makes a pair"
        )
    owns_ledger = ledger is None
    ledger = ledger if ledger is not None else QuotaLedger(cluster, plugins).start()
    namespaces: NamespaceLabels | None
    try:
        namespaces = NamespaceLabels(cluster).start()
    except ClusterError as exc:
        namespaces = None
        log.warning(
            "cannot watch namespaces (%s): the %s label on a namespace is honoured only through the "
            "MutatingWebhookConfiguration's namespaceSelector", exc, "hami.io/webhook=ignore",
        )  # fmt: skip
    app = WebhookApp(
        plugins,
        settings=settings.admission(),
        quota=ledger,
        namespace_labels=namespaces.labels if namespaces is not None else None,
        ready=lambda: ledger.ready and server.accepting and also_ready(),
    )
    try:
        server = WebhookServer(
            app,
            parse_address(settings.listen),
            certfile=settings.tls.cert_file,
            keyfile=settings.tls.key_file,
            client_ca=settings.tls.client_ca_file,
        ).start()
    except BaseException:
        if namespaces is not None:
            namespaces.stop()
        if owns_ledger:
            ledger.stop()
        raise
    log.info(
        "admission webhook serving https://%s:%d/mutate for scheduler %s (vendors: %s)",
        server.server_address[0], server.port, settings.scheduler_name,
        ", ".join(v.name for v in plugins.vendors) or "none",
    )  # fmt: skip
    return RunningWebhook(server, ledger, namespaces, owns_ledger)


def run_webhook(
    config: HamiConfig,
    settings: WebhookConfig,
    *,
    cluster: Cluster | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Serve until `stop` is set (or a termination signal arrives); returns the exit status."""
    stop = stop or threading.Event()
    plugins = VendorPlugins.load(config=config.vendors)
    for failure in plugins.failed:
        log.error("vendor %s (%s) not loaded: %s", failure.entry_point, failure.distribution, failure.error)
    if cluster is None:
        from hami.cluster.kube import connect

        cluster = connect(config.kubeconfig)
    running = start_webhook(cluster, plugins, settings)
    previous = _install_signal_handlers(stop)
    try:
        while not stop.wait(0.5):  # wake up: a signal caught by another thread runs its handler only here
            pass
    finally:
        log.info("webhook shutting down")
        running.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
    return 0


def _install_signal_handlers(stop: threading.Event) -> dict[int, object]:
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("received signal %d", signum)
        stop.set()

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
