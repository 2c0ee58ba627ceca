"""What one `hami scheduler` process hosts beside the extender: the admission webhook and the dashboard, when
the configuration turns them on.

Owns the wiring between services, above all of them: `hami.scheduler`, `hami.webhook` and `hami.dashboard`
never import each other (an import-linter contract in `make lint` checks it); this module builds each hosted
service as a `Companion` that the scheduler starts with its own cluster connection, vendors and quota ledger
(so that the webhook's admission and the extender's filter count the same usage) and stops with itself.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from hami.cluster.port import Cluster
from hami.config import HamiConfig, parse_address
from hami.scheduler.run import Companion, Running, SchedulerParts, run_scheduler

if TYPE_CHECKING:
    from hami.dashboard.app import DashboardServer
    from hami.dashboard.source import DashboardSource

__all__ = ["companions_of", "run_scheduler_process"]

log = logging.getLogger(__name__)


class _Dashboard:
    def __init__(self, server: DashboardServer, source: DashboardSource) -> None:
        self.server = server
        self.source = source

    @property
    def accepting(self) -> bool:
        return self.server.accepting

    def stop(self) -> None:
        self.server.stop()
        self.source.stop()


def companions_of(config: HamiConfig, *, own_connection: bool = True) -> list[Companion]:
    """The services the configuration hosts in the scheduler's process, in start order. `own_connection`: the
    process connects to the cluster with the configuration's kubeconfig (or its service account), so a process
    it starts can too (the dashboard's usage collector does, to keep the scraping of every node daemon off the
    extender's interpreter)."""
    companions: list[Companion] = []
    settings = config.scheduler
    if settings.dashboard_listen:
        address = parse_address(settings.dashboard_listen)

        def dashboard(parts: SchedulerParts) -> Running:
            from hami.dashboard.cli import start_dashboard
            from hami.dashboard.source import Sample

            def sample() -> Sample:
                # from the scheduler's watched state: no list of every node and pod every 30 s
                memory_used, memory_total, cores_used, cores_total, pods = parts.totals()
                return Sample(time.time(), memory_used, memory_total, cores_used, cores_total, pods, parts.waiting())

            server, source = start_dashboard(
                parts.cluster,
                parts.plugins,
                address,
                node_metrics=settings.dashboard_node_metrics,
                prometheus=settings.dashboard_prometheus,
                sampler=sample,
                usage_process=own_connection,
                kubeconfig=config.kubeconfig,
                usage_after=parts.ready,
            )
            log.info("dashboard on http://%s:%d/", server.server_address[0], server.port)
            return _Dashboard(server, source)

        companions.append(dashboard)
    if config.webhook.get("enabled"):
        from hami.webhook.cli import validate_webhook_section

        webhook_settings = validate_webhook_section(config.webhook)

        def webhook(parts: SchedulerParts) -> Running:
            from hami.webhook.run import start_webhook

            # The webhook's /readyz (the chart's readiness probe) speaks for the whole process.
            return start_webhook(
                parts.cluster, parts.plugins, webhook_settings, ledger=parts.ledger, also_ready=parts.ready
            )

        companions.append(webhook)
    return companions


def run_scheduler_process(
    config: HamiConfig, *, cluster: Cluster | None = None, stop: threading.Event | None = None
) -> int:
    """`hami scheduler`: the extender with every service the configuration hosts beside it, until stopped."""
    return run_scheduler(
        config, cluster=cluster, stop=stop, companions=companions_of(config, own_connection=cluster is None)
    )
