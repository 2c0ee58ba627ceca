"""The dashboard's pages: routes, templates, and the seams to serve them (a plain function, WSGI, an HTTP server).

Owns the URL space (`/` with `?range=1h|6h|1d`, `/workloads` with `?idle=10m|30m|1h` and `?page=N`, `/nodes/<name>`,
`/devices/<uuid>`, `/pods/<namespace>/<name>`, `/live` for the pages' polling, `/static/…`, `/healthz`) and
rendering each page with Jinja2 (autoescaped templates in `templates/`, CSS and the polling script in `static/`,
all served from the package: nothing from a CDN). With a Prometheus URL the cluster page's history comes from it
(`hami.dashboard.prometheus`), else from the in-process ring buffer. With a node metrics URL template, every page
adds what the node daemons measure (`hami.dashboard.usage`: a `UsageCollector` scraping them in the background,
or, without one started, at most once per interval when a page asks) beside the grants
(`hami.dashboard.usage_views`).
`DashboardApp.handle(method, path)` is the whole of it as a function returning (status, content type, body);
`DashboardApp` is also a WSGI application, and `DashboardServer` serves it on the front every listener shares
(`hami.front`).

Read-only: only GET and HEAD are answered. A name the cluster lacks gets a 404 page saying what exists; an API
server that stops answering gets the last figures read, marked stale with the error, or a page saying nothing
could be read yet (200, never a 5xx, never a traceback).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from importlib import resources
from typing import Any
from urllib.parse import quote, unquote

from jinja2 import Environment, PackageLoader, select_autoescape

from hami.dashboard.charts import Line, bar_segments, history_chart, line_chart, meter
from hami.dashboard.source import DashboardSource, Reading
from hami.dashboard.usage import NodeUsage, UsageCollector
from hami.dashboard.usage_views import (
    device_ranks,
    node_ranks,
    overview,
    pod_containers,
    stranded_memory,
    top_devices,
    top_nodes,
    workloads,
)
from hami.dashboard.views import (
    UnknownObject,
    cluster_view,
    device_view,
    memoised,
    node_view,
    pod_view,
)
from hami.front import JsonServer, Raw

__all__ = ["DashboardApp", "DashboardServer", "Response"]

log = logging.getLogger(__name__)

Response = tuple[int, str, bytes]
HTML = "text/html; charset=utf-8"
STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
CSP = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'"
"""Everything from the dashboard itself; inline styles only for the bars' widths."""
POLL_SECONDS = 2.0
"""How often an open page asks `/live` whether anything changed."""
RANGES = {"1h": 3600.0, "6h": 6 * 3600.0, "1d": 24 * 3600.0}
"""The cluster page's trend ranges (`?range=`); the in-process history holds what its ring keeps."""
IDLE_WINDOWS = {"10m": 600.0, "30m": 1800.0, "1h": 3600.0}
"""The workloads page's idle-grant windows (`?idle=`)."""
PAGE_ROWS = 100
"""Rows of the workloads page's tables per page (`?page=`): the page stays fast at 1,000 nodes and 8,000 pods."""


def _query(path: str) -> dict[str, str]:
    from urllib.parse import parse_qsl

    return dict(parse_qsl(path.split("?", 1)[1])) if "?" in path else {}


def _figure(value: float | None, unit: str = "", digits: int = 0) -> str:
    """A measured figure, or "unknown" when the node does not report it (never 0)."""
    if value is None:
        return "unknown"
    return f"{value:.{digits}f}{unit}"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _percent(used: int, total: int) -> int:
    return 100 * used // total if total else 0


class DashboardApp:
    """The dashboard over a `DashboardSource`; `title` names the cluster in every page's header."""

    def __init__(
        self,
        source: DashboardSource,
        *,
        title: str = "HAMi",
        poll_seconds: float = POLL_SECONDS,
        node_metrics: str | None = None,
        prometheus: str | None = None,
        usage: UsageCollector | None = None,
    ) -> None:
        self.source = source
        self.prometheus = prometheus
        self.node_metrics = node_metrics
        self.usage = usage
        """The node daemons' figures; with `node_metrics` and none given, one collecting when a page asks."""
        self._usage_lock = threading.Lock()
        self.title = title
        self.poll_seconds = poll_seconds
        self.env = Environment(
            loader=PackageLoader("hami.dashboard", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters["age"] = _age
        self.env.filters["percent"] = _percent
        self.env.filters["url"] = lambda value: quote(str(value), safe="")
        self.env.filters["figure"] = _figure
        self.env.globals.update(
            bar_segments=bar_segments, history_chart=history_chart, line_chart=line_chart, Line=Line, meter=meter
        )

    # ---------------------------------------------------------------------------------- routing

    def handle(self, method: str, path: str) -> Response:
        """Answer one request; never raises."""
        try:
            return self._route(method, path)
        except Exception:  # a bug: the page says so, the log has the traceback, the client never does
            log.exception("dashboard: %s %s failed", method, path)
            return self._page(500, "error.html", heading="The dashboard failed", detail="see the server's log")

    def _route(self, method: str, path: str) -> Response:
        route = path.split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            return 405, "text/plain; charset=utf-8", b"the dashboard is read-only: GET only\n"
        if route == "/healthz":
            return 200, "text/plain; charset=utf-8", b"ok\n"
        if route.startswith("/static/"):
            return self._static(route[len("/static/") :])
        parts = [unquote(p) for p in route.strip("/").split("/")] if route.strip("/") else []
        reading = self.source.read()
        if parts == ["live"]:
            return self._live(reading)
        if reading.snapshot is None:
            return self._page(
                200,
                "error.html",
                reading=reading,
                heading="No figures yet",
                detail=reading.error or "the cluster has not been read yet",
            )
        try:
            if not parts:
                return self._cluster(reading, _query(path))
            if parts == ["workloads"]:
                return self._workloads(reading, _query(path))
            if len(parts) == 2 and parts[0] == "nodes":
                return self._node(reading, parts[1])
            if len(parts) == 2 and parts[0] == "devices":
                return self._device(reading, parts[1])
            if len(parts) == 3 and parts[0] == "pods":
                return self._pod(reading, parts[1], parts[2])
        except UnknownObject as exc:
            return self._page(404, "missing.html", reading=reading, missing=exc)
        return self._page(
            404,
            "error.html",
            reading=reading,
            heading="No such page",
            detail=f"{route} is not a dashboard page; the pages are /, /workloads, /nodes/NAME, /devices/UUID and "
            "/pods/NAMESPACE/NAME",
        )

    def _page(self, status: int, template: str, **context: Any) -> Response:
        reading: Reading | None = context.get("reading")
        snapshot = reading.snapshot if reading else None
        body = self.env.get_template(template).render(
            title=self.title,
            poll_ms=int(self.poll_seconds * 1000),
            version=self._version(reading) if reading else "",
            taken=snapshot.taken.strftime("%H:%M:%S UTC") if snapshot else "",
            stale=reading.error if reading else "",
            **context,
        )
        return status, HTML, body.encode()

    def _version(self, reading: Reading) -> str:
        """What the pages compare to know they are stale: the objects listed, and the history's newest sample."""
        if reading.snapshot is None:
            return ""
        samples = self.source.history.samples()
        return f"{reading.snapshot.version}.{samples[-1].at if samples else 0:.0f}"

    def _static(self, name: str) -> Response:
        suffix = name[name.rfind(".") :] if "." in name else ""
        if "/" in name or name.startswith(".") or suffix not in STATIC_TYPES:
            return 404, "text/plain; charset=utf-8", b"no such file\n"
        try:
            data = resources.files("hami.dashboard").joinpath("static", name).read_bytes()
        except OSError:
            return 404, "text/plain; charset=utf-8", b"no such file\n"
        return 200, STATIC_TYPES[suffix], data

    def _live(self, reading: Reading) -> Response:
        body = {
            "version": self._version(reading),
            "taken": reading.snapshot.taken.isoformat() if reading.snapshot else "",
            "stale": reading.error,
        }
        return 200, "application/json", json.dumps(body).encode()

    # ---------------------------------------------------------------------------------- pages

    def _node_usage(self) -> dict[str, NodeUsage]:
        """The node daemons' newest figures (empty without a node metrics URL). Without a collector running in the
        background, the nodes are scraped here, at most once per collector interval."""
        if self.node_metrics and (
            self.usage is None or (not self.usage.running and self.usage.template != self.node_metrics)
        ):
            self.usage = UsageCollector(self.node_metrics, self.source.cluster)
        if self.usage is None:
            return {}
        collector = self.usage
        if not collector.running:
            with self._usage_lock:
                totals = collector.totals()
                if not totals or collector.clock() - totals[-1].at >= collector.interval:
                    collector.collect()
        return collector.nodes()

    def _cluster(self, reading: Reading, query: dict[str, str]) -> Response:
        assert reading.snapshot is not None
        chosen = query.get("range", "6h")
        span = RANGES.get(chosen, RANGES["6h"])
        history, history_from, history_note = self.source.history.samples(), "this process", ""
        if self.prometheus:
            from hami.dashboard.prometheus import prometheus_history

            samples, history_note = prometheus_history(self.prometheus, hours=span / 3600)
            if samples:
                history, history_from = samples, f"Prometheus ({self.prometheus})"
        since = (history[-1].at if history else 0.0) - span
        history = [h for h in history if h.at >= since]
        usage = self._node_usage()
        snapshot = reading.snapshot
        # computed once per snapshot and usage round, whoever asks (`memoised`)
        round_ = self.usage.rounds if self.usage is not None else -1
        ranks = memoised(snapshot, ("ranks", round_), lambda: device_ranks(snapshot, usage))
        nodes = memoised(snapshot, ("node ranks", round_), lambda: node_ranks(ranks))
        lines: list[Line] = []
        if self.usage is not None:
            totals = self.usage.totals()
            totals = [t for t in totals if t.at >= totals[-1].at - span] if totals else []
            memory_total = sum(d.memory_total for n in snapshot.status.nodes for d in n.devices) or 1
            lines = [
                Line(
                    "line-inuse",
                    "memory in use",
                    [(t.at, 100 * t.memory_used / memory_total if t.memory_reported else None) for t in totals],
                ),
                Line("line-busy", "busy", [(t.at, t.utilization) for t in totals]),
            ]
        return self._page(
            200,
            "cluster.html",
            reading=reading,
            view=cluster_view(snapshot),
            history=history,
            history_from=history_from,
            history_note=history_note,
            ranges=list(RANGES),
            chosen=chosen if chosen in RANGES else "6h",
            measured=self.usage is not None,
            overview=memoised(snapshot, ("overview", round_), lambda: overview(snapshot, usage, ranks)),
            usage_lines=lines,
            top=memoised(
                snapshot,
                ("top", round_),
                lambda: {
                    "devices by allocation": top_devices(ranks, "allocated"),
                    "devices by busy time": top_devices(ranks, "busy"),
                    "devices by memory in use": top_devices(ranks, "memory"),
                },
            ),
            top_nodes=memoised(
                snapshot,
                ("top nodes", round_),
                lambda: {
                    "nodes by allocation": top_nodes(nodes, "allocated"),
                    "nodes by busy time": top_nodes(nodes, "busy"),
                },
            ),
            stranded=memoised(snapshot, "stranded", lambda: stranded_memory(snapshot)),
        )

    def _workloads(self, reading: Reading, query: dict[str, str]) -> Response:
        assert reading.snapshot is not None
        usage = self._node_usage()
        window = query.get("idle", "30m") if query.get("idle") in IDLE_WINDOWS else "30m"
        idle = self.usage.idle_grants(IDLE_WINDOWS[window]) if self.usage is not None else []
        page = int(query["page"]) if query.get("page", "").isdigit() and int(query["page"]) > 0 else 1
        total, shown = workloads(reading.snapshot, usage, start=(page - 1) * PAGE_ROWS, count=PAGE_ROWS)
        return self._page(
            200,
            "workloads.html",
            reading=reading,
            workloads=shown,
            total=total,
            page=page,
            pages=max(1, -(-total // PAGE_ROWS)),
            first=(page - 1) * PAGE_ROWS + 1,
            measured=self.usage is not None,
            idle=idle[:PAGE_ROWS],
            idle_total=len(idle),
            idle_memory=sum(g.memory_back for g in idle),
            idle_cores=sum(g.cores_back for g in idle),
            windows=list(IDLE_WINDOWS),
            window=window,
        )

    def _node(self, reading: Reading, name: str) -> Response:
        assert reading.snapshot is not None
        node, labels = node_view(reading.snapshot, name)
        waiting = [w for w in reading.snapshot.status.waiting if w.node == name]
        measured = self._node_usage().get(name)
        trends = {d.uuid: self._device_lines(d.uuid, d.memory_total) for d in node.devices} if measured else {}
        return self._page(
            200,
            "node.html",
            reading=reading,
            node=node,
            labels=labels,
            waiting=waiting,
            measured=measured,
            trends=trends,
        )

    def _device_lines(self, uuid: str, memory_total: int) -> list[Line]:
        trend = self.usage.device_trend(uuid) if self.usage is not None else []
        return [
            Line("line-busy", "busy", [(t, f[0]) for t, f in trend]),
            Line(
                "line-inuse",
                "memory in use",
                [(t, 100 * f[1] / memory_total if f[1] is not None and memory_total else None) for t, f in trend],
            ),
        ]

    def _device(self, reading: Reading, uuid: str) -> Response:
        assert reading.snapshot is not None
        view = device_view(reading.snapshot, uuid)
        measured = self._node_usage().get(view.node)
        trend = self.usage.device_trend(uuid) if self.usage is not None else []
        return self._page(
            200,
            "device.html",
            reading=reading,
            view=view,
            usage=measured,
            use=measured.devices.get(uuid) if measured and not measured.error else None,
            lines=self._device_lines(uuid, view.device.memory_total),
            heat=[
                Line("line-power", "power", [(t, f[2]) for t, f in trend], " W", 10.0),
                Line("line-temp", "temperature", [(t, f[3]) for t, f in trend], " °C"),
            ],
        )

    def _pod(self, reading: Reading, namespace: str, name: str) -> Response:
        assert reading.snapshot is not None
        pod = pod_view(reading.snapshot, namespace, name)
        usage = self._node_usage()
        node = pod.node or (pod.placements[0].node if pod.placements else "")
        containers = pod_containers(usage, node, namespace, name) if node else ()
        peaks = self.usage.container_peaks(namespace, name) if self.usage is not None else {}
        return self._page(
            200,
            "pod.html",
            reading=reading,
            pod=pod,
            measured=self.usage is not None and node in usage,
            node_error=usage[node].error if node in usage else "",
            containers=containers,
            peaks=peaks,
        )

    # ---------------------------------------------------------------------------------- WSGI

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if environ.get("QUERY_STRING"):
            path += "?" + environ["QUERY_STRING"]
        status, content_type, body = self.handle(str(environ.get("REQUEST_METHOD") or "GET"), path)
        start_response(f"{status} {_REASONS.get(status, 'OK')}", _headers(content_type, body))
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]


_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error"}


def _headers(content_type: str, body: bytes) -> list[tuple[str, str]]:
    return [
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Cache-Control", "no-store"),
        ("X-Content-Type-Options", "nosniff"),
        (
            "Content-Security-Policy",
            "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'",
        ),
    ]


class _FrontApp:
    """The dashboard as an app of the front (`hami.front`): its pages with their headers."""

    def __init__(self, app: DashboardApp) -> None:
        self.app = app

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, Raw]:
        status, content_type, page = self.app.handle(method, path)
        headers = tuple((k, v) for k, v in _headers(content_type, page) if k not in ("Content-Type", "Content-Length"))
        return status, Raw(page, content_type, headers)


class DashboardServer(JsonServer):
    """`app` on `address` (port 0 picks one), from a background thread, on the front every listener shares
    (deadlines, backlog, bounded bodies); `stop()` it when done."""

    name = "dashboard"
    max_body = 64 * 1024

    def __init__(self, app: DashboardApp, address: tuple[str, int]) -> None:
        self.dashboard = app
        super().__init__(_FrontApp(app), address)
