"""The dashboard's pages as the server renders them, for a known cluster: the figures of each page, the pages
for names the cluster lacks, an API server that stops answering, and no request at all answered with a 5xx."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from dashboard_world import build, node_monitor, place_new_pod, section, text
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.cluster import MemoryCluster
from hami.cluster.port import ClusterError
from hami.dashboard.app import DashboardApp
from hami.dashboard.source import DashboardSource, History
from hami.dashboard.views import cluster_view, take_snapshot
from hami.plugins import VendorPlugins

HOST = VendorPlugins.load()


@pytest.fixture
def cluster() -> MemoryCluster:
    return build()


@pytest.fixture
def app(cluster: MemoryCluster) -> DashboardApp:
    return DashboardApp(DashboardSource(cluster, HOST, max_age=0))


def get(app: DashboardApp, path: str) -> tuple[int, bytes]:
    status, content_type, body = app.handle("GET", path)
    assert content_type.startswith(("text/", "application/json"))
    return status, body


def test_cluster_page_sums_devices_per_model_with_fragmentation(app: DashboardApp) -> None:
    status, body = get(app, "/")
    assert status == 200
    found = re.finditer(r'<tr data-model="([^"]+)">(.*?)</tr>', body.decode(), re.S)
    rows = {m.group(1): text(m.group(2).encode()) for m in found}
    # A100: 4 devices, 10000 + 6000 + 40960 of 4 × 40960 MiB, cores 50 of 400; idle 2, full 1 (big); largest
    # free 40960; free on partly used devices: a100-0's 24960 of 106880 free in all = 23 %.
    # Vendor, kind, model; and stranded: too-big waits for 100000 MiB on one NVIDIA device, which no A100 has free.
    assert rows["NVIDIA-A100"] == (
        "NVIDIA NVIDIA NVIDIA-A100 4 56960 / 163840 MiB 34% 50 / 400 % 12% 2 / 1 40960 MiB 23% "
        "106880 MiB (100%) for 1 waiting"
    )
    # T4: binding's 3000 MiB of 2 × 15360 (t4-0 partly used: 12360 of 27720 free = 44 %).
    assert rows["NVIDIA-Tesla-T4"] == (
        "NVIDIA NVIDIA NVIDIA-Tesla-T4 2 3000 / 30720 MiB 9% 0 / 200 % 0% 1 / 0 15360 MiB 44% "
        "27720 MiB (100%) for 1 waiting"
    )
    assert section(body, "total-devices") == "6"
    assert section(body, "total-pods") == "4"
    assert "too-big 0/2 nodes are available: 2 no device with 100000 MiB free." in section(body, "pending")
    assert "held by binding for 4" in text(body)  # 42 s, or 43 on a slow machine


def test_node_page_shows_each_device_with_its_shares_numa_and_lock(app: DashboardApp) -> None:
    status, body = get(app, "/nodes/gpu-node")
    assert status == 200
    page = text(body)
    assert "Held by binding for" in section(body, "lock")
    assert "GPU-gpu-node-0 NVIDIA-A100 hami-core" in page
    assert "index 0 · NUMA 0 · shared by 3/10 · cores 50/100%" in page
    assert "train 10000 MiB, 30% cores team-a/infer 6000 MiB, 20% cores" in page
    assert "topology.hami.io/nvlink-island 0" in page
    assert "kubernetes.io/hostname" not in page
    # the bar: train then infer, widths in percent of the card's memory
    assert 'style="left: 0.00%; width: 24.41%" title="default/train: 10000 MiB"' in body.decode()
    assert 'style="left: 24.41%; width: 14.65%" title="team-a/infer: 6000 MiB"' in body.decode()


def test_device_page_lists_the_pods_sharing_it_with_their_grants_and_links(app: DashboardApp) -> None:
    status, body = get(app, "/devices/GPU-gpu-node-0")
    assert status == 200
    assert section(body, "sharers") == (
        "Pod Containers Memory granted Cores granted train 1 10000 MiB 30% team-a/infer 2 6000 MiB 20%"
    )
    assert section(body, "shared") == "3 / 10"
    assert "GPU-gpu-node-1 200" in text(body)


def test_pod_pages_show_placement_bind_phase_events_and_why_unschedulable(app: DashboardApp) -> None:
    status, body = get(app, "/pods/team-a/infer")
    assert status == 200
    assert section(body, "placements") == ("Device Node Containers Memory Cores GPU-gpu-node-0 gpu-node 2 6000 MiB 20%")
    assert section(body, "bind-phase") == "success"
    status, body = get(app, "/pods/default/binding")
    assert section(body, "bind-phase").startswith("allocating (3")  # bound 30 s ago
    status, body = get(app, "/pods/default/too-big")
    assert status == 200
    assert section(body, "unschedulable") == (
        "Unschedulable. 0/2 nodes are available: 2 no device with 100000 MiB free."
    )
    assert "Warning FailedScheduling" in section(body, "events")
    assert section(body, "node") == "none yet"


@pytest.mark.parametrize(
    ("path", "says", "offers"),
    [
        ("/nodes/no-such-node", "The cluster has no node no-such-node.", "gpu-node t4-node"),
        ("/devices/GPU-nope", "The cluster has no device GPU-nope.", "GPU-gpu-node-0"),
        ("/pods/default/ghost", "The cluster has no pod default/ghost.", "default/train"),
        ("/pods/%3Cscript%3E/x", "The cluster has no pod <script>/x.", "team-a/infer"),
    ],
)
def test_unknown_names_get_a_page_that_says_what_exists(app: DashboardApp, path: str, says: str, offers: str) -> None:
    status, body = get(app, path)
    assert status == 404
    assert section(body, "missing") == says
    assert offers in text(body)
    assert b"<script>/x" not in body  # escaped, not markup


def test_a_path_that_is_no_page_says_which_pages_there_are(app: DashboardApp) -> None:
    status, body = get(app, "/nodes")
    assert status == 404
    assert "the pages are /, /workloads, /nodes/NAME, /devices/UUID and /pods/NAMESPACE/NAME" in text(body)
    assert app.handle("POST", "/")[0] == 405


class Failing:
    """A cluster whose API server answered once, then stops answering."""

    def __init__(self, inner: MemoryCluster) -> None:
        self.inner, self.down = inner, False

    def list(self, resource: Any, namespace: str | None = None) -> Any:
        if self.down:
            raise ClusterError("GET /api/v1/nodes: connection refused (127.0.0.1:6443)")
        return self.inner.list(resource, namespace)


def test_an_api_server_that_stops_answering_gets_the_last_figures_marked_stale(cluster: MemoryCluster) -> None:
    failing = Failing(cluster)
    app = DashboardApp(DashboardSource(failing, HOST, max_age=0))  # type: ignore[arg-type]
    assert get(app, "/")[0] == 200
    failing.down = True
    status, body = get(app, "/nodes/gpu-node")
    assert status == 200
    assert section(body, "stale").startswith(
        "Figures may be out of date. the Kubernetes API server did not answer: GET /api/v1/nodes: connection refused"
    )
    assert "GPU-gpu-node-0" in text(body)  # the figures last read
    live = json.loads(app.handle("GET", "/live")[2])
    assert live["stale"].startswith("the Kubernetes API server did not answer")


class Slow(Failing):
    """A cluster whose lists take a while: a second reader arrives while the first read is under way."""

    def list(self, resource: Any, namespace: str | None = None) -> Any:
        import time

        time.sleep(0.3)
        return super().list(resource, namespace)


def test_a_page_asked_while_a_read_is_under_way_waits_for_that_read(cluster: MemoryCluster) -> None:
    import threading

    source = DashboardSource(Slow(cluster), HOST, max_age=60)  # type: ignore[arg-type]
    first = threading.Thread(target=source.read)
    first.start()
    while first.is_alive() and source._pending is None:  # until the first read is under way
        threading.Event().wait(0.01)
    reading = source.read()  # the sampler's read (above) is under way: this one waits for it, not returns nothing
    first.join()
    assert reading.snapshot is not None
    assert reading.error == ""


def test_an_api_server_that_never_answered_gets_a_page_saying_so(cluster: MemoryCluster) -> None:
    failing = Failing(cluster)
    failing.down = True
    app = DashboardApp(DashboardSource(failing, HOST, max_age=0))  # type: ignore[arg-type]
    for path in ("/", "/nodes/gpu-node", "/pods/a/b"):
        status, body = get(app, path)
        assert status == 200
        assert section(body, "error") == (
            "the Kubernetes API server did not answer: GET /api/v1/nodes: connection refused (127.0.0.1:6443)."
        )
        assert "Traceback" not in text(body)


def test_live_version_changes_when_a_pod_is_placed(cluster: MemoryCluster, app: DashboardApp) -> None:
    before = json.loads(app.handle("GET", "/live")[2])["version"]
    assert json.loads(app.handle("GET", "/live")[2])["version"] == before
    place_new_pod(cluster)
    assert json.loads(app.handle("GET", "/live")[2])["version"] != before
    assert "late 5000 MiB" in text(get(app, "/nodes/t4-node")[1])


def test_history_keeps_samples_an_interval_apart_and_drops_the_oldest(cluster: MemoryCluster) -> None:
    history = History(interval=10, capacity=3)
    snapshot = take_snapshot(cluster.list("nodes")[0], cluster.list("pods")[0], [], HOST)
    for shift in (0, 5, 10, 20, 30):
        moved = type(snapshot)(
            snapshot.taken.replace(second=0) + __import__("datetime").timedelta(seconds=shift),
            snapshot.nodes, snapshot.pods, snapshot.events, snapshot.status,
        )  # fmt: skip
        history.add(moved)
    samples = history.samples()
    assert [s.at - samples[0].at for s in samples] == [0, 10, 20]  # 5 s was too soon; the first fell off
    assert (samples[0].memory_used, samples[0].memory_total, samples[0].pods, samples[0].pending) == (
        59960, 194560, 4, 1,
    )  # fmt: skip


def test_static_files_are_served_from_the_package_and_nothing_else(app: DashboardApp) -> None:
    status, content_type, css = app.handle("GET", "/static/dashboard.css")
    assert b".meter" in css
    assert (status, content_type) == (200, "text/css; charset=utf-8")
    assert app.handle("GET", "/static/live.js")[0] == 200
    for path in ("/static/../app.py", "/static/templates/base.html", "/static/.x.css", "/static/nope.css"):
        assert app.handle("GET", path)[0] == 404


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=60))
def test_no_path_gets_a_5xx_or_a_traceback(path: str) -> None:
    app = DashboardApp(DashboardSource(CLUSTER, HOST, max_age=60))
    for candidate in ("/" + path, "/nodes/" + path, "/pods/" + path, "/devices/" + path, "/pods/x/" + path):
        status, _, body = app.handle("GET", candidate)
        assert status < 500
        assert b"Traceback" not in body


CLUSTER = build()


def test_view_model_matches_hami_status_totals(cluster: MemoryCluster) -> None:
    snapshot = take_snapshot(cluster.list("nodes")[0], cluster.list("pods")[0], [], HOST)
    view = cluster_view(snapshot)
    devices = [d for n in snapshot.status.nodes for d in n.devices]
    assert view.memory_used == sum(d.memory_used for d in devices) == 59960
    assert view.devices == len(devices) == 6


def metrics_text() -> str:
    return str(node_monitor().render().decode())


METRICS = metrics_text()


@pytest.fixture
def node_daemon() -> Any:
    """A node daemon's metrics endpoint at /<node>/metrics, serving the families of `hami.node.monitor`."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = METRICS.encode() if self.path == "/gpu-node/metrics" else b"not found"
            self.send_response(200 if self.path == "/gpu-node/metrics" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/{{node}}/metrics"
    server.shutdown()
    server.server_close()


def test_device_page_adds_real_usage_from_the_node_daemons_metrics(cluster: MemoryCluster, node_daemon: str) -> None:
    app = DashboardApp(DashboardSource(cluster, HOST, max_age=0), node_metrics=node_daemon)
    status, body = get(app, "/devices/GPU-gpu-node-0")
    assert status == 200
    assert section(body, "sharers") == (
        "Pod Containers Memory granted Cores granted Memory in use Device share used "
        "train 1 10000 MiB 30% 7000 MiB 25% team-a/infer 2 6000 MiB 20% 2000 MiB 0%"
    )
    assert "the device has 9000 MiB in use, busy 50% of the time" in section(body, "usage")
    assert section(body, "power") == "251.5 W"
    assert section(body, "temperature") == "61 °C"
    status, body = get(app, "/devices/GPU-gpu-node-1")  # the driver read nonsense: unknown, never 0
    assert section(body, "in-use") == "unknown"
    assert section(body, "busy") == "unknown"
    assert "big 1 40960 MiB 0% unknown unknown" in section(body, "sharers")  # its container reports nothing yet


def test_a_node_daemon_that_does_not_answer_is_said_and_the_grants_still_shown(cluster: MemoryCluster) -> None:
    app = DashboardApp(DashboardSource(cluster, HOST, max_age=0), node_metrics="http://{address}:9394/metrics")
    status, body = get(app, "/devices/GPU-t4-node-0")
    assert status == 200
    assert section(body, "usage").startswith("Real usage: the node publishes no InternalIP address")
    assert "binding 1 3000 MiB" in section(body, "sharers")
    app.node_metrics = "http://127.0.0.1:9/{node}/metrics"  # nothing listens on the discard port
    status, body = get(app, "/devices/GPU-t4-node-0")
    assert status == 200
    assert section(body, "usage").startswith("Real usage: the node daemon's metrics did not answer")


@pytest.fixture
def prometheus() -> Any:
    """A Prometheus answering /api/v1/query_range for the scheduler's four families, three points each."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from threading import Thread
    from urllib.parse import parse_qs, urlsplit

    from hami.dashboard.prometheus import QUERIES

    values = {
        QUERIES["memory_used"]: ["1000", "2000", "4000"],
        QUERIES["memory_total"]: ["8000", "8000", "8000"],
        QUERIES["cores_used"]: ["10", "20", "40"],
        QUERIES["cores_total"]: ["200", "200", "200"],
    }
    asked: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            asked.append(query)
            series = values.get(query.get("query", ""))
            body: dict[str, Any] = {"status": "error", "error": "unknown query"}
            if url.path != "/api/v1/query_range" or series is None:
                pass
            else:
                start = float(query["start"])
                points = [[start + 60 * i, v] for i, v in enumerate(series)]
                body = {"status": "success", "data": {"resultType": "matrix", "result": [{"values": points}]}}
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", asked
    server.shutdown()
    server.server_close()


def test_history_comes_from_prometheus_when_configured(cluster: MemoryCluster, prometheus: Any) -> None:
    from hami.dashboard.prometheus import prometheus_history

    url, asked = prometheus
    samples, note = prometheus_history(url, hours=2, now=1_000_000)
    assert note == ""
    assert [(s.at - samples[0].at, s.memory_used, s.memory_total, s.cores_used) for s in samples] == [
        (0, 1000, 8000, 10), (60, 2000, 8000, 20), (120, 4000, 8000, 40),
    ]  # fmt: skip
    assert (asked[0]["start"], asked[0]["end"], asked[0]["step"]) == ("992800", "1000000", "30")
    app = DashboardApp(DashboardSource(cluster, HOST, max_age=0), prometheus=url)
    body = get(app, "/")[1]
    assert section(body, "history-count") == "3"
    assert section(body, "history-from") == f"Prometheus ({url})"
    assert "memory from 12% to 50%, cores from 5% to 20%" in body.decode()


def test_a_prometheus_that_does_not_answer_falls_back_to_the_ring_buffer(cluster: MemoryCluster) -> None:
    app = DashboardApp(DashboardSource(cluster, HOST, max_age=0), prometheus="http://127.0.0.1:9")
    status, body = get(app, "/")
    assert status == 200
    assert section(body, "history-from") == "this process"
    assert section(body, "history-note").startswith("Prometheus at http://127.0.0.1:9 did not answer usefully")


def _luminance(colour: str) -> float:
    channels = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: str, b: str) -> float:
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_text_colours_meet_wcag_aa_contrast_on_every_background(app: DashboardApp) -> None:
    css = app.handle("GET", "/static/dashboard.css")[2].decode()
    colours = dict(re.findall(r"--([a-z]+): (#[0-9a-f]{6})", css))
    for text_colour in ("fg", "muted", "link", "warn", "high"):
        for background in ("bg", "panel"):
            ratio = contrast(colours[text_colour], colours[background])
            assert ratio >= 4.5, f"--{text_colour} on --{background}: {ratio:.1f}:1"
    banner = re.search(r"\.stale \{[^}]*background: (#[0-9a-f]{6})", css)
    assert banner is not None
    assert contrast(colours["fg"], banner.group(1)) >= 4.5
