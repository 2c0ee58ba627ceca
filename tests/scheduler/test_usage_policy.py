"""The opt-in `usage` policy: the scheduler prefers the node and the device its node daemon measured least busy
(`hami.io/node-device-busy`), among those that fit by grant; a device without a measurement is neither preferred
over an idle one nor ruled out; a bad annotation costs the preference, never a placement."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scheduler_harness import Harness, gpu_node, gpu_pod

from hami.cluster import MemoryCluster
from hami.codec import decode_pod_devices
from hami.measured import BUSY_ANNOTATION, decode_busy, encode_busy
from hami.model import Device, DeviceReading, NodeInventory, SchedulingPolicy
from hami.node.busy import BusyPublisher, measure_busy
from hami.node.monitor import ContainerUsage
from hami.scheduler.policy import PolicyError, policy_for

ALLOCATED = "hami.io/vgpu-devices-allocated"


def busy_node(name: str, busy: dict[int, float] | str, gpus: int = 4) -> dict[str, Any]:
    node = gpu_node(name, gpus=gpus)
    value = busy if isinstance(busy, str) else encode_busy({f"GPU-{name}-{i}": b for i, b in busy.items()})
    node["metadata"]["annotations"][BUSY_ANNOTATION] = value
    return node


def placed(h: Harness, pod: str) -> list[str]:
    obj = h.cluster.get("pods", pod, "default")
    return [d.uuid for c in decode_pod_devices(obj["metadata"]["annotations"][ALLOCATED]) for d in c]


def usage_pod(name: str, **kwargs: Any) -> dict[str, Any]:
    return gpu_pod(name, annotations={"hami.io/node-scheduler-policy": "usage"}, **kwargs)


def test_the_annotation_round_trips_and_bad_entries_are_skipped() -> None:
    assert encode_busy({"GPU-b": 7.4, "GPU-a": 120}) == "GPU-a:100,GPU-b:7"
    assert decode_busy("GPU-a:100,GPU-b:7") == {"GPU-a": 100, "GPU-b": 7}
    assert decode_busy("GPU-a:x,:5,GPU-b,GPU-c:-3,GPU-d:nan, GPU-e:12.5") == {"GPU-c": 0, "GPU-e": 12.5}
    assert decode_busy(None) == {}


@given(st.text(max_size=200))
def test_any_annotation_decodes_to_shares_within_0_and_100(value: str) -> None:
    assert all(0 <= v <= 100 for v in decode_busy(value).values())


def test_a_usage_pod_goes_to_the_least_busy_device_of_the_least_busy_node(harness: Harness) -> None:
    harness.add_node(busy_node("hot", {0: 95, 1: 90, 2: 97, 3: 99}))
    harness.add_node(busy_node("calm", {0: 80, 1: 3, 2: 60, 3: 40}))
    harness.add_pod(usage_pod("latency"))
    harness.start()
    assert harness.schedule("latency") == "calm"
    assert placed(harness, "latency") == ["GPU-calm-1"]


def test_the_usage_device_policy_alone_picks_the_idle_device_on_the_node_chosen(harness: Harness) -> None:
    harness.add_node(busy_node("only", {0: 100, 1: 100, 2: 0, 3: 100}))
    harness.add_pod(gpu_pod("p", annotations={"hami.io/gpu-scheduler-policy": "usage"}))
    harness.start()
    assert harness.schedule("p") == "only"
    assert placed(harness, "p") == ["GPU-only-2"]


def test_grants_still_decide_what_fits(harness: Harness) -> None:
    harness.add_node(busy_node("idle-but-full", {0: 0, 1: 0}, gpus=2))
    harness.add_node(busy_node("busy", {0: 70, 1: 70}, gpus=2))
    harness.add_pod(gpu_pod("filler", mem=16000, apps=[{"nvidia.com/gpu": "2", "nvidia.com/gpumem": "16000"}]))
    harness.add_pod(usage_pod("p"))
    harness.start()
    assert harness.filter("filler", nodes=["idle-but-full"])["NodeNames"] == ["idle-but-full"]
    assert harness.bind("filler", "idle-but-full")["Error"] == ""
    assert harness.schedule("p") == "busy"  # the idle devices have no memory left


def test_an_unmeasured_device_comes_after_an_idle_one_and_before_a_saturated_one(harness: Harness) -> None:
    harness.add_node(busy_node("n", {0: 100, 2: 2}))  # devices 1 and 3 are not measured
    harness.add_pod(usage_pod("a"))
    harness.add_pod(usage_pod("b", apps=[{"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1000"}]))
    harness.start()
    assert harness.filter("a")["NodeNames"] == ["n"]
    assert placed(harness, "a") == ["GPU-n-2"]
    assert harness.filter("b")["NodeNames"] == ["n"]
    assert sorted(placed(harness, "b")) == ["GPU-n-1", "GPU-n-2"]  # the measured idle one, then unknown before 100 %


def test_a_garbled_annotation_still_places_the_pod(harness: Harness) -> None:
    harness.add_node(busy_node("n", "GPU-n-0:@@@,,,:"))
    harness.add_pod(usage_pod("p"))
    harness.start()
    assert harness.schedule("p") == "n"


def test_usage_is_a_policy_the_annotations_name() -> None:
    policy = policy_for({"hami.io/node-scheduler-policy": "usage"}, SchedulingPolicy())
    assert (policy.node, policy.device) == ("usage", ("usage",))
    with pytest.raises(PolicyError, match="usage"):
        policy_for({"hami.io/gpu-scheduler-policy": "usagee"}, SchedulingPolicy())


# --------------------------------------------------------------------------------------------------------
# The node daemon's side
# --------------------------------------------------------------------------------------------------------

INVENTORY = {
    "NVIDIA": NodeInventory(
        kind="NVIDIA", devices=tuple(Device(id=f"GPU-{i}", index=i, devmem=1000, type="A100") for i in range(3))
    )
}


def test_busy_comes_from_the_reading_else_the_containers_accounting() -> None:
    readings = [
        DeviceReading(device_uuid="GPU-0", utilization_percent=40),
        DeviceReading(device_uuid="GPU-1", utilization_percent=400),
    ]
    containers = [
        ContainerUsage("uid", "c", "GPU-1", utilization_ratio=0.25),
        ContainerUsage("u2", "c", "GPU-1", utilization_ratio=0.5),
    ]
    assert measure_busy(INVENTORY, readings, containers) == {"GPU-0": 40, "GPU-1": 75}  # GPU-1's reading is nonsense


def test_the_publisher_writes_only_when_the_shares_moved() -> None:
    cluster = MemoryCluster()
    cluster.create("nodes", {"metadata": {"name": "n"}})
    shares = {"GPU-0": 10.0}
    clock = [0.0]
    publisher = BusyPublisher(cluster, "n", lambda: dict(shares), clock=lambda: clock[0])
    assert publisher.publish()
    assert cluster.get("nodes", "n")["metadata"]["annotations"][BUSY_ANNOTATION] == "GPU-0:10"
    shares["GPU-0"] = 13
    assert not publisher.publish()  # under 5 points
    shares["GPU-0"] = 16
    assert publisher.publish()
    clock[0] = 301
    assert publisher.publish()  # refreshed after 5 minutes
    shares.clear()
    assert publisher.publish()
    assert BUSY_ANNOTATION not in (cluster.get("nodes", "n")["metadata"].get("annotations") or {})
    assert publisher.writes == 4
