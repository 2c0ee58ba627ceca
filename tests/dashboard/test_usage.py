"""Usage beside the grants: the node daemons' figures read without Prometheus, their history, the overview, the top
lists, the workloads page with idle grants, the pod page per container, memory stranded for waiting pods; nonsense
and silence shown as unknown."""

from __future__ import annotations

import itertools
import os
import pickle
import re
import time
from collections.abc import Callable
from concurrent.futures import Future
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from dashboard_world import NodeMetricsServer, build, node_monitor, section, text
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.cluster import MemoryCluster
from hami.cluster.port import KubeObject, meta
from hami.dashboard import usage as usage_module
from hami.dashboard.app import DashboardApp
from hami.dashboard.source import DashboardSource
from hami.dashboard.usage import (
    BATCH,
    NO_ADDRESS,
    NO_DAEMON,
    NodeUsage,
    Peaks,
    ScrapeRounds,
    Trend,
    UsageCollector,
    daemon_annotations,
    read_metrics,
)
from hami.dashboard.usage_views import device_ranks, overview, stranded_memory, top_devices, workloads
from hami.dashboard.views import take_snapshot
from hami.plugins import VendorPlugins
from hami.testing.apiserver import ClusterApiServer

HOST = VendorPlugins.load()
TEXT = node_monitor().render().decode()


class Clock:
    def __init__(self, at: float = 1_000_000.0) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def collector(cluster: MemoryCluster, clock: Clock, answers: dict[str, str] | None = None) -> UsageCollector:
    """A collector over the cluster's nodes whose fetch answers gpu-node with `TEXT` (or `answers`), others refuse."""
    answers = answers if answers is not None else {"gpu-node": TEXT}

    def fetch(url: str, timeout: float) -> str:
        node = url.split("/")[3]
        if node not in answers:
            raise OSError("connection refused")
        return answers[node]

    return UsageCollector("http://metrics/{node}/metrics", cluster, fetch=fetch, clock=clock, interval=30)


def test_read_metrics_takes_the_figures_and_leaves_unknown_out() -> None:
    usage = read_metrics("gpu-node", "u", TEXT, 5.0)
    card = usage.devices["GPU-gpu-node-0"]
    assert (card.memory_used, card.utilization, card.power, card.temperature) == (9000, 50, 251.5, 61)
    assert "GPU-gpu-node-1" not in usage.devices  # nonsense from its driver: no figures at all
    train = next(c for c in usage.containers if c.pod == "train")
    assert (train.memory_used, train.utilization, train.memory_granted, train.cores_granted) == (7000, 25, 10000, 30)
    big = next(c for c in usage.containers if c.pod == "big")
    assert (big.memory_used, big.utilization, big.memory_granted) == (None, None, 40960)  # not started: unknown


def test_a_daemon_with_only_hamis_families_is_read_through_them() -> None:
    hami_only = "\n".join(line for line in TEXT.splitlines() if "hami_container_" not in line or "device_util" in line)
    usage = read_metrics("n", "u", hami_only, 0.0)
    train = next(c for c in usage.containers if c.pod == "train")
    assert (train.memory_used, train.utilization) == (7000, 25)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('hami_memory_used{}="device_uuid,x 0.5e3-NaN+Inf\n#\\')), max_size=400))
def test_any_answer_from_a_node_reads_without_raising(answer: str) -> None:
    usage = read_metrics("n", "u", answer, 0.0)
    for d in usage.devices.values():
        assert all(v is None or v == v for v in (d.memory_used, d.utilization))  # never NaN


def test_trend_and_peaks_keep_a_bounded_history_with_gaps_as_unknown() -> None:
    trend = Trend(3, 2)
    for n in range(5):
        trend.add(float(n), (n * 10.0, None if n == 3 else 1.0))
    assert trend.samples() == [(2.0, (20.0, 1.0)), (3.0, (30.0, None)), (4.0, (40.0, 1.0))]
    peaks = Peaks(4, at=0.0)
    peaks.add(0, 100.0, 5.0)
    peaks.add(0, 50.0, 9.0)
    peaks.add(2, 10.0, None)
    assert peaks.peak(0) == (100.0, 9.0)
    assert peaks.peak(1) == (10.0, None)
    peaks.add(9, 1.0, 1.0)  # far later: the old buckets are gone
    assert peaks.peak(0) == (1.0, 1.0)


def test_overview_and_top_lists_put_usage_beside_allocation() -> None:
    cluster = build()
    snapshot = take_snapshot(cluster.list("nodes")[0], cluster.list("pods")[0], [], HOST)
    usage = {"gpu-node": read_metrics("gpu-node", "u", TEXT, 0.0)}
    o = overview(snapshot, usage)
    assert (o.memory_in_use, o.memory_reported_total, o.busy, o.power) == (9000, 40960, 50, 251.5)
    assert (o.devices, o.devices_reporting, o.nodes, o.nodes_answering) == (6, 1, 2, 1)
    ranks = device_ranks(snapshot, usage)
    assert [r.device.uuid for r in top_devices(ranks, "busy")] == ["GPU-gpu-node-0"]
    allocated = top_devices(ranks, "allocated", count=2)
    assert [r.device.uuid for r in allocated] == ["GPU-gpu-node-1", "GPU-gpu-node-0"]
    nothing = overview(snapshot, {})
    assert (nothing.memory_in_use, nothing.busy, nothing.power) == (None, None, None)


def test_workloads_show_granted_against_used_per_pod() -> None:
    cluster = build()
    snapshot = take_snapshot(cluster.list("nodes")[0], cluster.list("pods")[0], [], HOST)
    total, listed = workloads(snapshot, {"gpu-node": read_metrics("gpu-node", "u", TEXT, 0.0)})
    assert total == len(listed) == 4
    found = {f"{w.namespace}/{w.name}": w for w in listed}
    assert (found["default/train"].memory_granted, found["default/train"].memory_used) == (10000, 7000)
    assert found["team-a/infer"].memory_used == 2000
    assert found["default/big"].memory_used is None  # its container has not reported: unknown, not 0
    assert found["default/binding"].memory_used is None  # t4-node's daemon is not read
    total, page = workloads(snapshot, {}, start=1, count=2)  # by namespace and name, a page at a time
    assert (total, [w.name for w in page]) == (4, ["binding", "train"])


def test_stranded_memory_counts_free_memory_no_waiting_pod_could_use() -> None:
    cluster = build()
    snapshot = take_snapshot(cluster.list("nodes")[0], cluster.list("pods")[0], [], HOST)
    stranded = stranded_memory(snapshot)
    a100 = stranded[("NVIDIA", "NVIDIA-A100")]
    assert (a100.free, a100.stranded, a100.waiting) == (106880, 106880, 1)  # too-big wants 100000 MiB on one card
    pod = next(p for p in cluster.list("pods")[0] if meta(p)["name"] == "too-big")
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "20000"
    cluster.replace("pods", pod)
    snapshot = take_snapshot(cluster.list("nodes")[0], cluster.list("pods")[0], [], HOST)
    a100 = stranded_memory(snapshot)[("NVIDIA", "NVIDIA-A100")]
    assert a100.stranded == 0  # every A100 with free memory has 20000 MiB of it


def test_idle_grants_are_found_after_the_window_with_what_they_could_give_back() -> None:
    cluster = build()
    clock = Clock()
    usage = collector(cluster, clock)
    usage.collect()
    assert usage.idle_grants(600) == []  # watched for no time yet
    for _ in range(21):
        clock.at += 30
        usage.collect()
    idle = {(g.pod, g.container): g for g in usage.idle_grants(600)}
    # infer's c0 holds 4000 MiB and 20 % and used 1000 MiB (25 %): not idle; train used 70 %: not idle; big never
    # reported: not judged; infer's c1 holds 2000 MiB, used 1000 MiB: not idle either.
    assert idle == {}
    quiet = TEXT.replace(
        'hami_container_memory_used{container_name="c0",device_type="NVIDIA-A100",device_uuid="GPU-gpu-node-0",namespace_name="team-a"',
        "x",
    )
    assert quiet != TEXT
    cold = "\n".join(
        line.replace(" 1000.0", " 100.0")
        if line.startswith("hami_container_memory_used") and 'pod_name="infer"' in line
        else line
        for line in TEXT.splitlines()
    )
    usage = collector(cluster, clock, {"gpu-node": cold})
    usage.collect()
    for _ in range(21):
        clock.at += 30
        usage.collect()
    idle = {(g.pod, g.container): g for g in usage.idle_grants(600)}
    assert set(idle) == {("infer", "c0"), ("infer", "c1")}
    assert (idle[("infer", "c0")].memory_back, idle[("infer", "c0")].cores_back) == (3900, 20)
    assert (idle[("infer", "c1")].memory_back, idle[("infer", "c1")].cores_back) == (1900, 0)  # no core limit


def test_a_node_that_stops_answering_keeps_its_history_and_says_why() -> None:
    cluster = build()
    clock = Clock()
    answers = {"gpu-node": TEXT}
    usage = collector(cluster, clock, answers)
    usage.collect()
    clock.at += 30
    answers.clear()
    usage.collect()
    node = usage.node("gpu-node")
    assert node is not None
    assert node.error.startswith("the node daemon's metrics did not answer")
    assert len(usage.device_trend("GPU-gpu-node-0")) == 1
    t4 = usage.node("t4-node")
    assert t4 is not None
    assert t4.error


def app_with_usage(cluster: MemoryCluster, clock: Clock) -> DashboardApp:
    usage = collector(cluster, clock)
    for _ in range(3):
        usage.collect()
        clock.at += 30
    return DashboardApp(DashboardSource(cluster, HOST, max_age=0), usage=usage)


def get(app: DashboardApp, path: str) -> bytes:
    status, _, body = app.handle("GET", path)
    assert status == 200, body[:400]
    return body


def test_cluster_page_shows_allocation_and_usage_side_by_side_with_trends_and_tops() -> None:
    app = app_with_usage(build(), Clock())
    body = get(app, "/")
    assert section(body, "used-memory") == "9000 / 40960 MiB 21%"
    assert section(body, "used-busy") == "50%"
    assert section(body, "used-power") == "252 W"
    assert section(body, "used-reporting") == "1 of 6 devices, 1 of 2 nodes"
    tops = text(body)
    assert "Devices by busy time GPU-gpu-node-0 gpu-node 50%" in tops
    assert "Nodes by allocation gpu-node" in tops
    assert "Usage over the last 90 s: memory in use from 5% to 5%, busy from 50% to 50%" in body.decode()
    assert section(body, "ranges") == "Last 1h · 6h · 1d"
    assert get(app, "/?range=1h").count(b'aria-current="true">1h') == 1


def test_without_node_metrics_the_page_says_usage_is_not_read() -> None:
    app = DashboardApp(DashboardSource(build(), HOST, max_age=0))
    body = get(app, "/")
    assert "Usage is not read" in section(body, "no-usage")
    body = get(app, "/workloads")
    assert "train" in section(body, "workloads")
    assert "unknown" in section(body, "workloads")


def test_workloads_page_lists_pods_and_idle_grants() -> None:
    cluster = build()
    app = app_with_usage(cluster, Clock())
    body = get(app, "/workloads")
    rows = {
        m.group(1): text(m.group(2).encode())
        for m in re.finditer(r'<tr data-pod="([^"]+)">(.*?)</tr>', body.decode(), re.S)
    }
    assert rows["default/train"].startswith("train gpu-node GPU-gpu-node-0 10000 MiB 7000 MiB (70%) 30% 25%")
    assert "unknown" in rows["default/big"]
    assert "No container has been idle" in section(body, "idle")
    assert section(body, "windows").count("10m") == 1


def test_pod_page_details_each_container_and_device_page_its_trend() -> None:
    app = app_with_usage(build(), Clock())
    body = get(app, "/pods/team-a/infer")
    assert section(body, "containers") == (
        "Container Device Memory granted Memory used Cores granted Device share used Peak, last hour (memory, share) "
        "c0 GPU-gpu-node-0 4000 MiB 1000 MiB 20% 0% 1000 MiB, 0% "
        "c1 GPU-gpu-node-0 2000 MiB 1000 MiB no limit 0% 1000 MiB, 0%"
    )
    body = get(app, "/devices/GPU-gpu-node-0")
    assert "Device usage over the last 90 s: busy from 50% to 50%, memory in use from 22% to 22%" in body.decode()
    assert "Power and temperature over the last 90 s: power from 252 W to 252 W, temperature from 61 °C to 61 °C" in (
        unescape(body.decode())
    )
    body = get(app, "/nodes/gpu-node")
    assert "in use 9000 MiB · busy 50% · 252 W · 61 °C" in text(body)
    assert "in use unknown · busy unknown · unknown · unknown" in text(body)  # card 1's nonsense


def test_usage_pages_never_fail_on_a_node_answering_garbage() -> None:
    cluster = build()
    clock = Clock()
    usage = collector(cluster, clock, {"gpu-node": 'hami_memory_used{device_uuid="GPU-gpu-node-0"} -Inf\n\x00{{{'})
    usage.collect()
    app = DashboardApp(DashboardSource(cluster, HOST, max_age=0), usage=usage)
    for path in ("/", "/workloads", "/nodes/gpu-node", "/devices/GPU-gpu-node-0", "/pods/default/train"):
        assert b"unknown" in get(app, path) or path == "/"


def _unused(_: Any, __: KubeObject) -> None:
    pass


# --------------------------------------------------------------------------------------------------------
# Which nodes are scraped, and when
# --------------------------------------------------------------------------------------------------------


def counting_fetch(answers: dict[str, str]) -> tuple[Callable[[str, float], str], list[str]]:
    """A fetch answering the nodes of `answers` (by the `{node}` of the URL), refusing others; and the nodes it was
    asked for, in order."""
    asked: list[str] = []

    def fetch(url: str, timeout: float) -> str:
        node = url.split("/")[3]
        asked.append(node)
        if node not in answers:
            raise OSError("connection refused")
        return answers[node]

    return fetch, asked


def test_only_nodes_with_a_daemons_annotation_and_an_address_are_scraped_and_the_others_say_why_once() -> None:
    cluster = build()
    plain = {"metadata": {"name": "cpu-node", "annotations": {"team": "a"}}, "status": {}}
    cluster.create("nodes", plain)
    fetch, asked = counting_fetch({"gpu-node": TEXT})
    annotations = daemon_annotations(HOST)
    assert "hami.io/node-nvidia-register" in annotations
    assert "hami.io/node-handshake" in annotations
    clock = Clock()
    usage = UsageCollector("http://metrics/{node}/metrics", cluster, fetch=fetch, clock=clock, annotations=annotations)
    usage.collect()
    assert sorted(asked) == ["gpu-node", "t4-node"]  # cpu-node runs no daemon of HAMi
    cpu = usage.node("cpu-node")
    assert cpu is not None
    assert cpu.error == NO_DAEMON
    clock.at += 30
    usage.collect()
    assert asked.count("cpu-node") == 0
    cpu = usage.node("cpu-node")  # still said, from the first round, not sent again
    assert cpu is not None
    assert cpu.error == NO_DAEMON
    assert usage.totals()[-1].nodes == 3
    assert usage.totals()[-1].nodes_answering == 1

    # the same nodes by their address: a node without an InternalIP is not fetched either
    rounds = ScrapeRounds("http://{address}:9394/metrics", annotations=annotations, fetch=fetch, clock=clock)
    nodes = cluster.list("nodes")[0]
    due, told, listed = rounds.plan(nodes)
    assert due == []
    assert sorted(listed) == ["cpu-node", "gpu-node", "t4-node"]
    assert {u.node: u.error for u in told} == {"cpu-node": NO_DAEMON, "gpu-node": NO_ADDRESS, "t4-node": NO_ADDRESS}
    gpu = next(n for n in nodes if meta(n)["name"] == "gpu-node")
    gpu["status"]["addresses"] = [{"type": "InternalIP", "address": "10.0.0.7"}]
    due, told, _ = rounds.plan(nodes)
    assert due == [("gpu-node", "http://10.0.0.7:9394/metrics")]
    assert told == []
    # without vendors to say which annotations a daemon writes, every node is scraped
    assert daemon_annotations(object()) == frozenset()


def test_a_silent_daemon_backs_off_doubling_up_to_the_cap_and_an_answer_resets_it() -> None:
    cluster = build()
    answers: dict[str, str] = {}
    fetch, asked = counting_fetch(answers)
    clock = Clock()
    usage = UsageCollector(
        "http://metrics/{node}/metrics", cluster, fetch=fetch, clock=clock, interval=30, back_off_cap=20.0
    )
    scraped_at: list[float] = []
    for _ in range(120):  # two minutes, a round a second
        before = asked.count("t4-node")
        usage.collect()
        if asked.count("t4-node") > before:
            scraped_at.append(clock.at - 1_000_000.0)
        clock.at += 1
    # after each failure in a row the wait doubles from 2 s: 2, 4, 8, 16, then the cap, 20 s
    gaps = [b - a for a, b in itertools.pairwise(scraped_at)]
    assert gaps[:5] == [2, 4, 8, 16, 20]
    assert set(gaps[4:]) == {20}
    t4 = usage.node("t4-node")
    assert t4 is not None
    assert t4.error.startswith("the node daemon's metrics did not answer")
    # the daemon comes up: seen at its next scrape, then scraped every round again
    answers["t4-node"] = TEXT.replace("gpu-node", "t4-node")
    while usage.node("t4-node").error:  # type: ignore[union-attr]
        usage.collect()
        clock.at += 1
    before = asked.count("t4-node")
    for _ in range(5):
        usage.collect()
        clock.at += 1
    assert asked.count("t4-node") == before + 5
    # it fails again: the back-off starts over from 2 s, not from where it was
    answers.clear()
    usage.collect()
    clock.at += 1
    usage.collect()
    assert asked.count("t4-node") == before + 6  # 1 s later: still waiting
    clock.at += 1
    usage.collect()
    assert asked.count("t4-node") == before + 7


class FakeTime:
    """A monotonic clock and a stop event whose waits move it on (and record when each scrape started)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.stopped = False

    def monotonic(self) -> float:
        return self.now

    def is_set(self) -> bool:
        return self.stopped

    def set(self) -> None:
        self.stopped = True

    def wait(self, seconds: float | None = None) -> bool:
        self.now += seconds or 0.0
        return self.stopped


class InlinePool:
    """An executor running each task when submitted, at the fake time."""

    def submit(self, fn: Callable[..., None], *args: Any) -> Future[None]:
        future: Future[None] = Future()
        future.set_result(fn(*args))
        return future


def paced_round(nodes: int, scrapes_per_second: float, warm: bool) -> tuple[list[float], list[int], FakeTime]:
    """One round of `run` over `nodes` answering nodes: when each scrape started, the size of each batch of figures
    reported, and the fake time at the end."""
    time_ = FakeTime()
    started: list[float] = []

    def fetch(url: str, timeout: float) -> str:
        started.append(time_.now)
        return TEXT

    rounds = ScrapeRounds(
        "http://metrics/{node}/metrics", interval=30, scrapes_per_second=scrapes_per_second, fetch=fetch,
        monotonic=time_.monotonic,
    )  # fmt: skip
    rounds.warm = warm
    listed = [{"metadata": {"name": f"n{i}"}} for i in range(nodes)]
    batches: list[int] = []
    ended: list[list[str]] = []

    def end(names: list[str]) -> None:
        ended.append(names)
        time_.set()

    rounds.run(lambda: listed, lambda b: batches.append(len(b)), end, time_, InlinePool())  # type: ignore[arg-type]
    assert ended == [[f"n{i}" for i in range(nodes)]]
    assert sum(batches) == nodes
    return started, batches, time_


def test_a_rounds_scrapes_are_spread_evenly_over_it_never_in_a_burst() -> None:
    # warm: 4 nodes over the 30 s interval, one every 7.5 s
    started, batches, _ = paced_round(4, 200.0, warm=True)
    assert started == [0.0, 7.5, 15.0, 22.5]
    # warming up: a round every 2 s, but 1,000 nodes at 200 a second take 5 s, one every 5 ms
    started, batches, time_ = paced_round(1000, 200.0, warm=False)
    gaps = {round(b - a, 6) for a, b in itertools.pairwise(started)}
    assert gaps == {0.005}
    assert started[-1] == pytest.approx(4.995)
    assert max(batches) <= BATCH + 1
    assert len(batches) > 1000 // (BATCH + 1)
    assert time_.now == pytest.approx(5.0)  # the next round starts when this one's time is over


def test_the_collector_in_a_process_of_its_own_lists_scrapes_and_sends_what_the_pages_show(tmp_path: Path) -> None:
    cluster = build()
    metrics = NodeMetricsServer()
    with ClusterApiServer(cluster) as api:
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        usage = UsageCollector(metrics.template, cluster, interval=0.5, annotations=daemon_annotations(HOST))
        usage.start_in_child(kubeconfig)
        try:
            deadline = time.monotonic() + 60
            while usage.rounds < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            child = usage._child
            assert child is not None
            assert child.is_alive()
            assert child.pid != os.getpid()
        finally:
            usage.stop()
            metrics.stop()
    assert usage.rounds >= 2, "the collector's process sent no rounds"
    gpu = usage.node("gpu-node")
    assert gpu is not None
    assert not gpu.error
    assert "GPU-gpu-node-0" in gpu.devices
    t4 = usage.node("t4-node")  # no daemon answers for it on this server: 404
    assert t4 is not None
    assert t4.error
    assert len(usage.device_trend("GPU-gpu-node-0")) >= 2
    assert not child.is_alive()  # stopped with the collector


def test_figures_sent_between_processes_read_back_the_same() -> None:
    gpu = read_metrics("gpu-node", "http://x/metrics", TEXT, 12.5)
    assert gpu.devices
    assert gpu.containers
    assert NodeUsage.unpacked(pickle.loads(pickle.dumps(gpu.packed()))) == gpu
    silent = NodeUsage("t4-node", "http://y/metrics", 13.0, error="refused")
    assert NodeUsage.unpacked(silent.packed()) == silent


_NAME = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True)
_VALUE = st.text(st.characters(blacklist_characters='"\\\n', blacklist_categories=("Cs",)), max_size=20)


@given(st.dictionaries(_NAME, _VALUE, min_size=1, max_size=6), st.sampled_from([",", ", ", ""]), st.booleans())
def test_labels_read_without_the_expression_are_those_the_expression_reads(
    labels: dict[str, str], comma: str, trailing: bool
) -> None:
    inner = comma.join(f'{k}="{v}"' for k, v in labels.items())
    line = "hami_memory_used{" + inner + ("," if trailing else "") + "} 1"
    brace, close = line.find("{"), line.rfind("}")
    assert usage_module._labels(line, brace, close) == labels
    escaped = line.replace('="', '="\\\\', 1)  # a backslash: the expression reads it
    assert usage_module._labels(escaped, brace, escaped.rfind("}")) == {
        k: v.replace('\\"', '"').replace("\\\\", "\\")
        for k, v in usage_module._LABEL.findall(escaped, brace, escaped.rfind("}"))
    }
