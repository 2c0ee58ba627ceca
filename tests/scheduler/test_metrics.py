"""The scheduler's Prometheus metrics, scraped and parsed as Prometheus would, over state built by real filters."""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from scheduler_harness import FakeNodeSide, Harness, gpu_node, gpu_pod

from hami.codec import encode_legacy_register
from hami.model import Device
from hami.scheduler.extender import FilterResult
from hami.scheduler.metrics import ABSENT_FAMILIES, FILTER_OUTCOMES, SchedulerMetrics, _escape, filter_outcome
from hami.scheduler.server import ExtenderApp, ExtenderServer

MIB = 2**20

HAMI_FAMILIES = {
    "hami_gpu_memory_limit_bytes",
    "hami_gpu_core_limit_ratio",
    "hami_gpu_memory_allocated_bytes",
    "hami_gpu_core_allocated_ratio",
    "hami_gpu_shared_count",
    "hami_node_gpu_overview",
    "hami_node_gpu_memory_allocated_ratio",
    "hami_vgpu_memory_allocated_bytes",
    "hami_vgpu_core_allocated_ratio",
}


class Scrape:
    """One scrape of `render()`, parsed by prometheus_client's own text parser."""

    def __init__(self, metrics: SchedulerMetrics) -> None:
        text = metrics.render().decode()
        self.families = {f.name: f for f in text_string_to_metric_families(text)}

    def samples(self, name: str, family: str | None = None) -> list[Sample]:
        f = self.families[family or name]
        return [s for s in f.samples if s.name == name]

    def find(self, name: str, family: str | None = None, **labels: str) -> list[Sample]:
        return [s for s in self.samples(name, family) if all(s.labels.get(k) == v for k, v in labels.items())]

    def value(self, name: str, family: str | None = None, **labels: str) -> float:
        found = self.find(name, family, **labels)
        assert len(found) == 1, f"{name}{labels}: {found}"
        return float(found[0].value)

    def histogram_count(self, name: str) -> float:
        return self.value(f"{name}_count", name)


def device_labels(node: str, index: int, model: str = "NVIDIA-A100", uuid: str | None = None) -> dict[str, str]:
    return {
        "zone": "vGPU",
        "node": node,
        "device_uuid": uuid or f"GPU-{node}-{index}",
        "device_index": str(index),
        "device_type": model,
    }


def metrics_for(h: Harness) -> SchedulerMetrics:
    """Start the harness (its nodes and pods added first) and build metrics over its state."""
    if h.service is None:
        h.start()
    assert h.service is not None
    return SchedulerMetrics(h.service.state, h.plugins)


def test_devices_show_with_exact_limits_and_zero_usage_before_any_pod(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a", gpus=2, memory=16384))
    metrics = metrics_for(harness)
    s = Scrape(metrics)
    assert s.families.keys() >= HAMI_FAMILIES
    assert not set(ABSENT_FAMILIES) & s.families.keys()
    for i in range(2):
        d = device_labels("node-a", i)
        assert s.value("hami_gpu_memory_limit_bytes", **d) == 17179869184
        assert s.value("hami_gpu_core_limit_ratio", **d) == 100  # HAMi's unit: percent
        assert s.value("hami_gpu_memory_allocated_bytes", device_cores="100", **d) == 0
        assert s.value("hami_gpu_core_allocated_ratio", **d) == 0
        assert s.value("hami_gpu_shared_count", **d) == 0
        overview = s.find("hami_node_gpu_overview", **d)
        assert [(o.labels["device_cores"], o.labels["device_memory_limit"], o.value) for o in overview] == [
            ("100", "16384", 0)
        ]
        assert s.value("hami_node_gpu_memory_allocated_ratio", **d) == 0  # with device_type, as HAMi
    assert s.samples("hami_vgpu_memory_allocated_bytes") == []
    assert s.samples("hami_vgpu_core_allocated_ratio") == []
    assert s.value("hami_scheduler_leader") == 0
    assert s.value("hami_scheduler_requeues_total", "hami_scheduler_requeues") == 0
    for outcome in FILTER_OUTCOMES:
        assert s.value("hami_scheduler_filter_outcomes_total", "hami_scheduler_filter_outcomes", result=outcome) == 0
    for verb in ("filter", "bind", "prioritize", "node_lock_wait"):
        assert s.histogram_count(f"hami_scheduler_{verb}_seconds") == 0


def test_a_placed_pod_shows_on_its_device_and_as_its_container(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a", gpus=2, memory=16384))
    harness.add_pod(gpu_pod("p1", gpu=1, mem=3000, cores=30))
    metrics = metrics_for(harness)
    assert harness.filter("p1")["NodeNames"] == ["node-a"]
    s = Scrape(metrics)  # at once: the filter's own assumption already counts
    used, idle = device_labels("node-a", 1), device_labels("node-a", 0)  # equal scores: HAMi's highest index
    assert s.value("hami_gpu_memory_allocated_bytes", **used) == 3000 * MIB
    assert s.value("hami_gpu_core_allocated_ratio", **used) == 30
    assert s.value("hami_gpu_shared_count", **used) == 1
    assert s.value("hami_node_gpu_overview", **used) == 3000 * MIB
    assert s.value("hami_node_gpu_memory_allocated_ratio", **used) == pytest.approx(3000 / 16384)  # 0-1, as HAMi
    assert s.value("hami_gpu_memory_limit_bytes", **used) == 16384 * MIB
    assert s.value("hami_gpu_memory_allocated_bytes", **idle) == 0
    container = {"zone": "vGPU", "namespace": "default", "node": "node-a", "pod": "p1", "container_index": "0"}
    assert s.value("hami_vgpu_memory_allocated_bytes", device_uuid="GPU-node-a-1", **container) == 3000 * MIB
    assert s.value("hami_vgpu_core_allocated_ratio", device_uuid="GPU-node-a-1", **container) == 30
    assert len(s.samples("hami_vgpu_memory_allocated_bytes")) == 1

    harness.flush()  # the pod's own annotations come back through the watch: the same numbers
    assert Scrape(metrics).value("hami_gpu_memory_allocated_bytes", **used) == 3000 * MIB


def test_container_index_is_the_position_in_the_annotation_init_containers_first(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a", gpus=4, memory=16384))
    gpu = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2500", "nvidia.com/gpucores": "25"}
    harness.add_pod(gpu_pod("mixed", init=[{"cpu": "1"}], apps=[gpu, gpu]))
    harness.add_pod(gpu_pod("multi", gpu=2, mem=3000, cores=30, namespace="team"))
    metrics = metrics_for(harness)
    assert harness.filter("mixed")["NodeNames"] == ["node-a"]
    assert harness.filter("multi", namespace="team")["NodeNames"] == ["node-a"]
    s = Scrape(metrics)
    mixed = {
        (x.labels["container_index"], x.labels["device_uuid"]): x.value
        for x in s.find("hami_vgpu_memory_allocated_bytes", pod="mixed", namespace="default")
    }
    assert mixed == {("1", "GPU-node-a-3"): 2500 * MIB, ("2", "GPU-node-a-2"): 2500 * MIB}  # HAMi's order
    multi = s.find("hami_vgpu_core_allocated_ratio", pod="multi", namespace="team", node="node-a")
    assert sorted(x.labels["container_index"] for x in multi) == ["0", "0"]
    assert len({x.labels["device_uuid"] for x in multi}) == 2
    assert all(x.value == 30 for x in multi)
    # per device, the device's allocation is the sum of the containers on it
    for d in range(4):
        uuid = f"GPU-node-a-{d}"
        on_device = sum(x.value for x in s.find("hami_vgpu_memory_allocated_bytes", device_uuid=uuid))
        assert s.value("hami_gpu_memory_allocated_bytes", device_uuid=uuid) == on_device


def test_usage_disappears_with_the_pod(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a", gpus=1))
    harness.add_pod(gpu_pod("p1", mem=4096, cores=50))
    metrics = metrics_for(harness)
    harness.filter("p1")
    harness.flush()
    assert Scrape(metrics).value("hami_gpu_shared_count", device_uuid="GPU-node-a-0") == 1
    harness.cluster.delete("pods", "p1", "default")
    harness.flush()
    s = Scrape(metrics)
    assert s.samples("hami_vgpu_memory_allocated_bytes") == []
    assert s.value("hami_gpu_memory_allocated_bytes", device_uuid="GPU-node-a-0") == 0
    assert s.value("hami_gpu_core_allocated_ratio", device_uuid="GPU-node-a-0") == 0
    assert s.value("hami_gpu_shared_count", device_uuid="GPU-node-a-0") == 0


def test_every_device_kind_is_exported_with_its_model(harness: Harness) -> None:
    dcus = [Device(id=f"DCU-{i}", index=i, count=4, devmem=16368, devcore=100, type="DCU-Z100") for i in range(2)]
    harness.add_node(
        {"metadata": {"name": "dcu-node", "annotations": {"hami.io/node-dcu-register": encode_legacy_register(dcus)}}}
    )
    harness.add_node(gpu_node("gpu-node", gpus=1, memory=8192, model="NVIDIA-Tesla-T4"))
    # a DCU pod placed before the scheduler (re)started: its usage is rebuilt from its annotation
    harness.add_pod(
        {
            "metadata": {
                "name": "dcu-pod",
                "namespace": "ml",
                "annotations": {"hami.io/dcu-devices-allocated": "DCU-1,DCU,2048,50:;"},
            },
            "spec": {"nodeName": "dcu-node", "containers": [{"name": "c"}]},
            "status": {"phase": "Running"},
        }
    )
    metrics = metrics_for(harness)
    s = Scrape(metrics)
    dcu = device_labels("dcu-node", 1, "DCU-Z100", uuid="DCU-1")
    assert s.value("hami_gpu_memory_limit_bytes", **dcu) == 16368 * MIB
    assert s.value("hami_gpu_memory_allocated_bytes", **dcu) == 2048 * MIB
    assert s.value("hami_gpu_core_allocated_ratio", **dcu) == 50
    assert s.value("hami_gpu_memory_allocated_bytes", device_uuid="DCU-0") == 0
    assert s.value("hami_gpu_memory_limit_bytes", **device_labels("gpu-node", 0, "NVIDIA-Tesla-T4")) == 8192 * MIB
    container = {
        "namespace": "ml",
        "node": "dcu-node",
        "pod": "dcu-pod",
        "container_index": "0",
        "device_uuid": "DCU-1",
    }
    assert s.value("hami_vgpu_memory_allocated_bytes", **container) == 2048 * MIB
    assert s.value("hami_vgpu_core_allocated_ratio", **container) == 50
    assert {x.labels["device_type"] for x in s.samples("hami_gpu_memory_limit_bytes")} == {
        "DCU-Z100",
        "NVIDIA-Tesla-T4",
    }


def test_a_device_with_scaled_cores_shows_a_limit_above_100_percent(harness: Harness) -> None:
    scaled = [Device(id="DCU-s", index=0, count=4, devmem=8192, devcore=200, type="DCU-Z100")]
    harness.add_node(
        {"metadata": {"name": "n", "annotations": {"hami.io/node-dcu-register": encode_legacy_register(scaled)}}}
    )
    s = Scrape(metrics_for(harness))
    assert s.value("hami_gpu_core_limit_ratio", device_uuid="DCU-s") == 200
    assert s.find("hami_gpu_memory_allocated_bytes", device_uuid="DCU-s")[0].labels["device_cores"] == "200"


class Client:
    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def post(self, verb: str, body: Any) -> tuple[int, Any]:
        self.conn.request("POST", f"/{verb}", body=json.dumps(body).encode(), headers={"Content-Type": "x"})
        response = self.conn.getresponse()
        return response.status, json.loads(response.read())


def test_verb_histograms_count_requests_through_the_http_server(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a", gpus=2))
    for i in range(3):
        harness.add_pod(gpu_pod(f"p{i}", mem=1000))
    metrics = metrics_for(harness)
    assert harness.service is not None
    server = ExtenderServer(ExtenderApp(harness.service.extender, observe=metrics.observe), ("127.0.0.1", 0)).start()
    try:
        client = Client(server.port)
        for i in range(3):
            pod = harness.cluster.get("pods", f"p{i}", "default")
            status, answer = client.post("filter", {"Pod": pod, "NodeNames": ["node-a"]})
            assert (status, answer["NodeNames"]) == (200, ["node-a"])
        pod = harness.cluster.get("pods", "p0", "default")
        assert client.post("prioritize", {"Pod": pod, "NodeNames": ["node-a"]})[0] == 200
        bind = {"PodName": "p0", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "node-a"}
        assert client.post("bind", bind) == (200, {"Error": ""})
        client.conn.close()
    finally:
        server.stop()
    s = Scrape(metrics)
    for verb, count in (("filter", 3), ("prioritize", 1), ("bind", 1)):
        name = f"hami_scheduler_{verb}_seconds"
        assert s.histogram_count(name) == count
        assert s.value(f"{name}_sum", name) > 0
        buckets = [(float(b.labels["le"]), b.value) for b in s.samples(f"{name}_bucket", name)]
        assert buckets == sorted(buckets)  # cumulative: never decreasing with le
        assert buckets[-1] == (float("inf"), count)
        assert buckets[0][0] <= 0.0001  # sub-millisecond resolution


def test_filter_outcomes_lock_waits_and_leadership(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a", gpus=1, memory=8000))
    harness.add_pod(gpu_pod("fits", mem=1000))
    harness.add_pod(gpu_pod("huge", mem=20000))
    harness.add_pod(gpu_pod("bad", annotations={"hami.io/gpu-scheduler-policy": "tightest"}))
    harness.add_pod({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c"}]}})
    metrics = metrics_for(harness)
    assert harness.service is not None
    extender = harness.service.extender
    outcomes = {}
    for name in ("fits", "huge", "bad", "web"):
        result = extender.filter(harness.cluster.get("pods", name, "default"), ["node-a"])
        outcomes[name] = filter_outcome(result)
        metrics.record_filter(result)
    assert outcomes == {"fits": "placed", "huge": "unschedulable", "bad": "error", "web": "passthrough"}
    metrics.record_filter(FilterResult(node="node-a"))
    metrics.observe_lock_wait(0.002)
    metrics.observe("no-such-verb", 1.0)  # ignored, like any verb that has no histogram
    metrics.set_leader(True)
    s = Scrape(metrics)
    got = {
        x.labels["result"]: x.value
        for x in s.samples("hami_scheduler_filter_outcomes_total", "hami_scheduler_filter_outcomes")
    }
    assert got == {"placed": 2, "unschedulable": 1, "error": 1, "passthrough": 1}
    lock = "hami_scheduler_node_lock_wait_seconds"
    assert s.histogram_count(lock) == 1
    assert s.value(f"{lock}_bucket", lock, le="0.001") == 0
    assert s.value(f"{lock}_bucket", lock, le="0.0025") == 1
    assert s.value("hami_scheduler_leader") == 1
    metrics.set_leader(False)
    assert Scrape(metrics).value("hami_scheduler_leader") == 0
    with pytest.raises(ValueError, match="not one of placed"):
        metrics.count_filter("maybe")


def test_serve_metrics_answers_get_metrics(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a", gpus=1))
    metrics = metrics_for(harness)
    server = metrics.serve_metrics(("127.0.0.1", 0))
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read().decode()
        assert response.status == 200
        assert response.getheader("Content-Type", "").startswith("text/plain; version=0.0.4")
        names = {f.name for f in text_string_to_metric_families(body)}
        assert names >= HAMI_FAMILIES
        conn.request("GET", "/other")
        response = conn.getresponse()
        response.read()
        assert response.status == 404
        conn.close()
    finally:
        server.stop()


def test_a_given_registry_receives_the_metrics(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a", gpus=1))
    harness.start()
    assert harness.service is not None
    registry = CollectorRegistry()
    SchedulerMetrics(harness.service.state, harness.plugins, registry)
    text = generate_latest(registry).decode()
    assert 'hami_gpu_memory_limit_bytes{device_index="0"' in text
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        SchedulerMetrics(harness.service.state, harness.plugins, registry)


def test_every_scrape_is_consistent_while_filters_run(harness: Harness) -> None:
    """A scrape reads the state under its lock: device totals always equal the sum of their containers."""
    harness.add_node(gpu_node("node-a", gpus=4, memory=16000, split=10))
    for i in range(40):
        harness.add_pod(gpu_pod(f"p{i}", mem=300 + 10 * i, cores=i % 5))
    metrics = metrics_for(harness)
    assert harness.service is not None
    extender = harness.service.extender
    pods = [harness.cluster.get("pods", f"p{i}", "default") for i in range(40)]
    done = threading.Event()

    def place() -> None:
        try:
            for pod in pods:
                extender.filter(pod, ["node-a"])
        finally:
            done.set()

    thread = threading.Thread(target=place)
    thread.start()
    scrapes = 0
    while not done.is_set() or scrapes < 3:
        s = Scrape(metrics)
        for d in s.samples("hami_gpu_memory_allocated_bytes"):
            uuid = d.labels["device_uuid"]
            containers = s.find("hami_vgpu_memory_allocated_bytes", device_uuid=uuid)
            assert d.value == sum(c.value for c in containers)
            assert s.value("hami_gpu_shared_count", device_uuid=uuid) == len(containers)
        scrapes += 1
    thread.join()
    final = Scrape(metrics)
    assert len(final.samples("hami_vgpu_memory_allocated_bytes")) == 40


def test_the_direct_exposition_is_byte_for_byte_what_prometheus_client_writes(harness: Harness) -> None:
    """`render()` writes the state's families itself (72,000 series at 1,000 nodes); the text must be exactly
    the client library's, and label values escaped as it escapes them."""
    harness.add_node(gpu_node("node-a", gpus=3, memory=16000, split=10))
    harness.add_node(gpu_node("node-b", gpus=1))
    harness.start()
    node_side = FakeNodeSide(harness.cluster)
    for i in range(7):
        harness.add_pod(gpu_pod(f"p{i}", gpu=1 + i % 2, mem=500 + 100 * i, cores=i % 4 * 5))
        harness.schedule(f"p{i}")
    harness.flush()
    assert harness.service is not None
    metrics = harness.service.metrics
    metrics.filter_outcomes.labels(result="placed").inc()
    assert metrics.render() == generate_latest(metrics.registry)
    for value in ("plain", 'a "quoted" one', "back\\slash", "new\nline", ""):
        assert _escape(value) == openmetrics._escape(value, openmetrics.ALLOWUTF8, lambda c, i: True)
    node_side.stop()
