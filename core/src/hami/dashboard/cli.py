"""`hami dashboard`: the web dashboard for anyone with read access to a cluster, from their own machine.

Owns the command's flags and its run: a kubeconfig (or the in-cluster account), the vendor plugins with their
configuration sections (for the accounting), the dashboard served until Ctrl-C or SIGTERM. The same app is what
`hami scheduler` serves when `scheduler.dashboardListen` is set; here it reads the cluster itself, needing only
`list` on nodes, pods and events.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the app (and Jinja2) load when the dashboard starts, not for `hami --help`
    from hami.cluster.port import Cluster
    from hami.dashboard.app import DashboardServer
    from hami.dashboard.source import DashboardSource, Sample

__all__ = ["add_dashboard_parser", "run_dashboard", "start_dashboard"]

log = logging.getLogger(__name__)


def add_dashboard_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register `hami dashboard` on the `hami` command's subparsers; returns the new parser."""
    parser = subparsers.add_parser(
        "dashboard",
        help="serve the web dashboard: devices, who shares them, how full they are, live",
        description="Serve a read-only web dashboard of the cluster's shared devices: per vendor and model, per "
        "node, per device and per pod, updating by itself. Needs list access to nodes, pods and events.",
        epilog=(
            "Examples:\n"
            "  hami dashboard                                   $KUBECONFIG's cluster on http://127.0.0.1:8090\n"
            "  hami dashboard --kubeconfig /tmp/hami-demo-x/kubeconfig   a running `hami demo --keep`\n"
            "  hami dashboard --listen 0.0.0.0:8090 --history-interval 10"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--kubeconfig", metavar="FILE", help="kubeconfig to use (default: $KUBECONFIG or ~/.kube/config)"
    )
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (default: the current one)")
    parser.add_argument("--config", metavar="FILE", help="configuration file (YAML): the vendors' sections")
    parser.add_argument("--listen", metavar="HOST:PORT", default="127.0.0.1:8090", help="address (default %(default)s)")
    parser.add_argument(
        "--history-interval", metavar="SECONDS", type=float, default=30.0, help="seconds between history samples"
    )
    parser.add_argument(
        "--node-metrics",
        metavar="URL",
        help="the node daemons' metrics, for what devices and containers really use: {node} and {address} "
        "(InternalIP) are replaced, e.g. http://{address}:9394/metrics; scraped every --history-interval "
        "(default: not read)",
    )
    parser.add_argument(
        "--prometheus", metavar="URL", help="a Prometheus scraping the scheduler: the history comes from it"
    )
    parser.set_defaults(func=run_dashboard)
    return parser


def start_dashboard(
    cluster: Cluster,
    plugins: object,
    address: tuple[str, int],
    *,
    history_interval: float = 30.0,
    title: str = "HAMi",
    node_metrics: str | None = None,
    prometheus: str | None = None,
    sampler: Callable[[], Sample] | None = None,
    usage_process: bool = False,
    kubeconfig: str | None = None,
    usage_after: Callable[[], bool] | None = None,
) -> tuple[DashboardServer, DashboardSource]:
    """Serve the dashboard of `cluster` on `address` and sample its history (from `sampler` when given, see
    `DashboardSource`); stop both when done. With `node_metrics`, the nodes that run a daemon of HAMi are scraped
    in the background from when `usage_after()` is true: on threads of this process, or with `usage_process` in a
    process of its own connected with `kubeconfig` (None: the pod's service account), which spares a process that
    serves something else (the scheduler's extender) the scraping and parsing."""
    from hami.dashboard.app import DashboardApp, DashboardServer
    from hami.dashboard.source import DashboardSource, History
    from hami.dashboard.usage import UsageCollector, daemon_annotations

    source = DashboardSource(cluster, plugins, history=History(interval=history_interval), sampler=sampler).start()
    usage = None
    if node_metrics:  # the node daemons scraped in the background, at the history's pace
        usage = UsageCollector(
            node_metrics, cluster, interval=history_interval, annotations=daemon_annotations(plugins)
        )
        if usage_process:
            usage.start_in_child(kubeconfig, after=usage_after)
        else:
            usage.start(after=usage_after)
        source.also_stop(usage.stop)
    app = DashboardApp(source, title=title, node_metrics=node_metrics, prometheus=prometheus, usage=usage)
    server = DashboardServer(app, address).start()
    return server, source


def run_dashboard(args: argparse.Namespace) -> int:
    """What `hami dashboard` runs."""
    from hami.config import load_config, parse_address
    from hami.errors import ConfigError
    from hami.plugins import VendorPlugins
    from hami.status import connect_cluster

    if args.history_interval <= 0:
        raise ConfigError("hami dashboard: --history-interval must be a positive number of seconds")
    try:
        address = parse_address(args.listen)
    except ValueError as exc:
        raise ConfigError(f"hami dashboard: --listen: {exc}") from None
    config = load_config(args.config, {"kubeconfig": args.kubeconfig})
    plugins = VendorPlugins.load(config=config.vendors)
    cluster = connect_cluster(config.kubeconfig, args.context, component="hami-dashboard")
    try:
        server, source = start_dashboard(
            cluster,
            plugins,
            address,
            history_interval=args.history_interval,
            node_metrics=args.node_metrics,
            prometheus=args.prometheus,
        )
    except OSError as exc:
        raise ConfigError(f"hami dashboard: cannot listen on {args.listen}: {exc.strerror}") from None
    print(f"dashboard on http://{address[0]}:{server.port}/ (Ctrl-C stops it)", flush=True)
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
        source.stop()
        for sig, old in previous.items():
            signal.signal(sig, old)
        close = getattr(cluster, "close", None)
        if callable(close):
            close()
    return 0
