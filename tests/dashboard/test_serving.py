"""Where the dashboard is served: by `hami scheduler` when `scheduler.dashboardListen` is set (off by default),
and by `hami dashboard` through a kubeconfig, over HTTP; as WSGI too."""

from __future__ import annotations

import contextlib
import multiprocessing
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from dashboard_world import FlakyApiServer, NodeMetricsServer, build, text

from hami.cli import main
from hami.companions import run_scheduler_process
from hami.config import load_config
from hami.dashboard.app import DashboardApp, DashboardServer
from hami.dashboard.cli import start_dashboard
from hami.dashboard.source import DashboardSource, Sample
from hami.demo.world import free_port
from hami.errors import ConfigError
from hami.plugins import VendorPlugins
from hami.status import connect_cluster
from hami.testing.apiserver import ClusterApiServer


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_dashboard_is_off_by_default_and_its_address_is_validated() -> None:
    assert load_config(None).scheduler.dashboard_listen is None
    with pytest.raises(ConfigError, match=r"scheduler\.dashboardListen: '8090' is not <host>:<port>"):
        load_config(None, {"scheduler.dashboardListen": "8090"})


def test_hami_scheduler_serves_the_dashboard_when_configured() -> None:
    port = free_port()
    config = load_config(
        None,
        {
            "scheduler.listen": "127.0.0.1:0",
            "scheduler.metricsListen": "127.0.0.1:0",
            "scheduler.dashboardListen": f"127.0.0.1:{port}",
        },
    )
    stop = threading.Event()
    thread = threading.Thread(target=run_scheduler_process, args=(config,), kwargs={"cluster": build(), "stop": stop})
    thread.start()
    try:
        for _ in range(100):
            try:
                status, page = fetch(f"http://127.0.0.1:{port}/nodes/gpu-node")
                break
            except OSError:
                stop.wait(0.1)
        assert status == 200
        assert "GPU-gpu-node-0" in page
        assert fetch(f"http://127.0.0.1:{port}/nodes/nope")[0] == 404
    finally:
        stop.set()
        thread.join(timeout=20)
    assert not thread.is_alive()


def test_hami_dashboard_reads_the_cluster_of_a_kubeconfig(tmp_path: Path) -> None:
    with FlakyApiServer(build()) as api:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        cluster = connect_cluster(str(kubeconfig), None, component="hami-dashboard")
        server, source = start_dashboard(cluster, VendorPlugins.load(), ("127.0.0.1", 0))
        try:
            status, page = fetch(f"http://127.0.0.1:{server.port}/devices/GPU-gpu-node-0")
            assert status == 200
            assert "team-a/infer" in page
            api.down = True  # the API server goes away: the page says so, with the figures last read
            source.max_age = 0
            status, page = fetch(f"http://127.0.0.1:{server.port}/devices/GPU-gpu-node-0")
            assert status == 200
            assert "the Kubernetes API server did not answer" in page
            assert "team-a/infer" in page
        finally:
            server.stop()
            source.stop()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--listen", "8090"], "hami dashboard: --listen: '8090' is not <host>:<port>"),
        (["--history-interval", "0"], "--history-interval must be a positive number of seconds"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "cannot load /nonexistent/kubeconfig"),
    ],
)
def test_hami_dashboard_refuses_bad_flags_with_what_to_fix(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dashboard", *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_app_is_a_wsgi_application() -> None:
    app = DashboardApp(DashboardSource(build(), VendorPlugins.load()))
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        seen.update(status=status, headers=dict(headers))

    body = b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": "/pods/default/train"}, start_response))
    assert seen["status"] == "200 OK"
    assert seen["headers"]["Content-Type"] == "text/html; charset=utf-8"
    assert "default-src 'self'" in seen["headers"]["Content-Security-Policy"]
    assert b"GPU-gpu-node-0" in body
    b"".join(app({"REQUEST_METHOD": "GET", "PATH_INFO": "/pods/default/nope"}, start_response))
    assert seen["status"] == "404 Not Found"


def test_the_dashboard_is_served_on_the_front_its_pages_headers_kept_and_silent_clients_dropped() -> None:
    """The dashboard listens on the pod's address: on the standard library's server a client sending nothing
    held a thread for good, and the backlog was 5."""
    server = DashboardServer(DashboardApp(DashboardSource(build(), VendorPlugins.load())), ("127.0.0.1", 0))
    server.header_deadline = 0.5
    server.start()
    try:
        assert server.accepting
        silent = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/pods/default/train", timeout=10) as answer:
            assert answer.status == 200
            assert answer.headers["Content-Type"] == "text/html; charset=utf-8"
            assert "default-src 'self'" in answer.headers["Content-Security-Policy"]
            assert answer.headers["X-Content-Type-Options"] == "nosniff"
            assert b"GPU-gpu-node-0" in answer.read()
        started = time.monotonic()
        assert silent.recv(1) == b""  # closed by the header deadline
        assert time.monotonic() - started < 3
        silent.close()
    finally:
        server.stop()
    assert not server.accepting


def test_an_api_server_that_hangs_does_not_hang_the_page(tmp_path: Path) -> None:
    with FlakyApiServer(build()) as api:
        cluster = connect_cluster(str(api.write_kubeconfig(tmp_path / "kubeconfig")), None)
        server, source = start_dashboard(cluster, VendorPlugins.load(), ("127.0.0.1", 0))
        try:
            assert fetch(f"http://127.0.0.1:{server.port}/")[0] == 200
            source.max_age, source.answer_seconds = 0, 0.5
            api.hang = threading.Event()
            status, page = fetch(f"http://127.0.0.1:{server.port}/nodes/gpu-node")  # answered in 0.5 s, not 60
            assert status == 200
            assert "the Kubernetes API server did not answer within 0.5 s" in page
            assert "GPU-gpu-node-0" in page
        finally:
            if api.hang is not None:
                api.hang.set()
            server.stop()
            source.stop()


class _CountsLists:
    """A cluster whose lists are counted (the dashboard's reads)."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.lists: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cluster, name)

    def list(self, resource: Any, namespace: str | None = None) -> Any:
        self.lists.append(str(resource))
        return self.cluster.list(resource, namespace)


def test_with_a_sampler_the_cluster_is_read_only_for_pages_and_an_unread_snapshot_let_go() -> None:
    """Hosted in the scheduler, the history comes from the scheduler's state: no list of every node and pod at
    start-up or every 30 s; a page reads the cluster, and a snapshot no page asked for since is let go."""
    now = [1000.0]
    cluster = _CountsLists(build())
    sampled = []

    def sampler() -> Sample:
        sampled.append(now[0])
        return Sample(now[0], 10, 100, 5, 50, 3, 1)

    source = DashboardSource(cluster, VendorPlugins.load(), sampler=sampler, keep_seconds=60, clock=lambda: now[0])
    source.history.interval = 0
    source.sample()
    assert cluster.lists == []
    assert [s.pods for s in source.history.samples()] == [3]
    reading = source.read()
    assert reading.snapshot is not None
    assert "pods" in cluster.lists
    assert len(source.history.samples()) == 1, "a page's read is not a history sample: the sampler's are"
    now[0] += 30
    source.sample()
    assert source._last is reading.snapshot  # a page read it 30 s ago: kept
    now[0] += 61
    source.sample()
    assert source._last is None, "no page for more than keep_seconds: the snapshot is let go"
    assert len(sampled) == 3


def test_hami_scheduler_samples_the_dashboards_history_from_its_own_state() -> None:
    config = load_config(
        None,
        {
            "scheduler.listen": "127.0.0.1:0",
            "scheduler.metricsListen": "127.0.0.1:0",
            "scheduler.dashboardListen": f"127.0.0.1:{free_port()}",
        },
    )
    cluster = _CountsLists(build())
    stop = threading.Event()
    thread = threading.Thread(target=run_scheduler_process, args=(config,), kwargs={"cluster": cluster, "stop": stop})
    thread.start()
    try:
        time.sleep(2)
        assert cluster.lists.count("pods") == 1, "the scheduler's one list of pods; none by the dashboard"
    finally:
        stop.set()
        thread.join(timeout=20)


def test_hami_scheduler_scrapes_the_node_daemons_in_a_process_of_its_own_once_ready(tmp_path: Path) -> None:
    metrics = NodeMetricsServer()  # gpu-node's daemon answers; t4-node's does not
    port = free_port()
    with ClusterApiServer(build()) as api:
        config = load_config(
            None,
            {
                "kubeconfig": str(api.write_kubeconfig(tmp_path / "kubeconfig")),
                "scheduler.listen": "127.0.0.1:0",
                "scheduler.metricsListen": "127.0.0.1:0",
                "scheduler.dashboardListen": f"127.0.0.1:{port}",
                "scheduler.dashboardNodeMetrics": metrics.template,
            },
        )
        stop = threading.Event()
        thread = threading.Thread(target=run_scheduler_process, args=(config,), kwargs={"stop": stop})
        thread.start()
        try:
            page = ""
            for _ in range(300):  # until the collector's first round has landed
                with contextlib.suppress(OSError):
                    page = fetch(f"http://127.0.0.1:{port}/nodes/gpu-node")[1]
                if "in use 9000 MiB · busy 50% · 252 W · 61 °C" in text(page.encode()):
                    break
                stop.wait(0.1)
            assert "in use 9000 MiB · busy 50% · 252 W · 61 °C" in text(page.encode())
            collectors = [p for p in multiprocessing.active_children() if p.name == "hami-dashboard-usage"]
            assert len(collectors) == 1, "the node daemons are scraped by a process of the scheduler's own"
        finally:
            stop.set()
            thread.join(timeout=20)
            metrics.stop()
    assert not thread.is_alive()
    assert not collectors[0].is_alive(), "stopped with the scheduler"
