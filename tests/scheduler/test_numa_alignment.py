"""`hami.io/numa-alignment` through the real filter (HTTP, the scheduler service, the vendors' fitters): NVIDIA's
shared GPUs and Hygon's DCUs, each a node of four devices, NUMA nodes 0 (devices 0 and 1) and 1 (2 and 3)."""

from __future__ import annotations

from typing import Any

import pytest
from scheduler_harness import Harness, gpu_pod, running_pod

from hami.codec import decode_pod_devices, encode_legacy_register, encode_node_register
from hami.model import Device

NVIDIA_PLACED = "hami.io/vgpu-devices-to-allocate"
DCU_PLACED = "hami.io/dcu-devices-to-allocate"
ALIGN = "hami.io/numa-alignment"


def placed_numa(h: Harness, pod: str, key: str, numa: dict[str, int]) -> list[set[int]]:
    """The NUMA nodes of each container's devices as the filter wrote them on the pod."""
    annotations = h.cluster.get("pods", pod, "default")["metadata"]["annotations"]
    return [{numa[d.uuid] for d in devices} for devices in decode_pod_devices(annotations[key], key) if devices]


# ---------------------------------------------------------------------------------------------------- NVIDIA


def split_numa(prefix: str) -> dict[str, int]:
    """Device UUID → NUMA node on a four-device node built by `four_devices`."""
    return {f"{prefix}-{i}": i // 2 for i in range(4)}


def four_devices(name: str, prefix: str, model: str, register: str, capacity: str, legacy: bool = False) -> Any:
    """A node of four devices `<prefix>-<i>` (split 4, 64 GiB) on two NUMA nodes (0, 0, 1, 1)."""
    devices = [
        Device(id=f"{prefix}-{i}", index=i, count=4, devmem=65536, devcore=100, type=model, numa=numa)
        for i, numa in enumerate(split_numa(prefix).values())
    ]
    encode = encode_legacy_register if legacy else encode_node_register
    return {
        "metadata": {"name": name, "annotations": {register: encode(devices)}},
        "status": {"capacity": {capacity: "16"}},
    }


def nvidia_numa(node: str) -> dict[str, int]:
    return split_numa(f"GPU-{node}")


def split_node(name: str) -> dict[str, Any]:
    """Four A100s on two NUMA nodes."""
    return dict(four_devices(name, f"GPU-{name}", "NVIDIA-A100", "hami.io/node-nvidia-register", "nvidia.com/gpu"))


@pytest.fixture
def nvidia(harness: Harness) -> Harness:
    """node-a: one GPU free on each NUMA node (GPUs 1 and 3 full); node-b: spread's two emptiest GPUs (0 and 2)
    are on different NUMA nodes."""
    harness.add_node(split_node("node-a"))
    harness.add_pod(running_pod("full", "node-a", {1: 65536, 3: 65536}, 0))
    harness.start()
    return harness


def test_without_the_annotation_a_container_spans_numa_nodes_as_before(nvidia: Harness) -> None:
    nvidia.add_pod(gpu_pod("p", gpu=2, mem=1000))
    assert nvidia.filter("p")["NodeNames"] == ["node-a"]
    assert placed_numa(nvidia, "p", NVIDIA_PLACED, nvidia_numa("node-a")) == [{0, 1}]


def assert_refused_for_want_of_one_numa_node(answer: dict[str, Any], node: str, word: str) -> None:
    assert answer["NodeNames"] == []
    reason = answer["FailedNodes"][node]
    assert f"needs 2 {word} devices, 2/4 usable, but hami.io/numa-alignment: strict asks for all 2 on one " in reason
    assert "(usable: 1 on NUMA node 0, 1 on NUMA node 1)" in reason


def test_strict_refuses_a_node_where_no_numa_node_has_enough_and_says_why(nvidia: Harness) -> None:
    nvidia.add_pod(gpu_pod("p", gpu=2, mem=1000, annotations={ALIGN: "strict"}))
    assert_refused_for_want_of_one_numa_node(nvidia.filter("p"), "node-a", "NVIDIA")


def test_strict_takes_the_node_whose_numa_node_holds_the_container(nvidia: Harness) -> None:
    nvidia.add_node(split_node("node-b"))
    nvidia.flush()
    nvidia.add_pod(gpu_pod("p", gpu=2, mem=1000, annotations={ALIGN: " Strict "}))  # HAMi: trimmed, any case
    answer = nvidia.filter("p")
    assert answer["NodeNames"] == ["node-b"]
    assert "strict asks for all 2 on one NUMA node" in answer["FailedNodes"]["node-a"]
    assert placed_numa(nvidia, "p", NVIDIA_PLACED, nvidia_numa("node-b")) in ([{0}], [{1}])


def test_best_effort_places_across_numa_nodes_when_no_numa_node_has_enough(nvidia: Harness) -> None:
    nvidia.add_pod(gpu_pod("p", gpu=2, mem=1000, annotations={ALIGN: "best-effort"}))
    assert nvidia.filter("p")["NodeNames"] == ["node-a"]
    assert placed_numa(nvidia, "p", NVIDIA_PLACED, nvidia_numa("node-a")) == [{0, 1}]


def test_best_effort_takes_one_numa_node_where_the_policy_alone_would_not(harness: Harness) -> None:
    harness.add_node(split_node("node-b"))
    # GPUs 1 and 3 carry more: spread (the default) takes the emptiest, 0 and 2, one on each NUMA node
    harness.add_pod(running_pod("busy", "node-b", {1: 30000, 3: 30000}, 0))
    harness.start()
    harness.add_pod(gpu_pod("plain", gpu=2, mem=1000))
    harness.filter("plain")
    assert placed_numa(harness, "plain", NVIDIA_PLACED, nvidia_numa("node-b")) == [{0, 1}]
    harness.add_pod(gpu_pod("aligned", gpu=2, mem=1000, annotations={ALIGN: "best-effort"}))
    assert harness.filter("aligned")["NodeNames"] == ["node-b"]
    assert placed_numa(harness, "aligned", NVIDIA_PLACED, nvidia_numa("node-b")) in ([{0}], [{1}])


def test_one_device_containers_are_aligned_whatever_they_get(nvidia: Harness) -> None:
    nvidia.add_pod(
        gpu_pod("p", apps=[{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}] * 2, annotations={ALIGN: "strict"})
    )
    assert nvidia.filter("p")["NodeNames"] == ["node-a"]


def test_a_value_written_past_the_webhook_is_refused_on_every_node_with_what_to_write(nvidia: Harness) -> None:
    nvidia.add_pod(gpu_pod("p", gpu=2, mem=1000, annotations={ALIGN: "strickt"}))
    answer = nvidia.filter("p")
    assert answer["NodeNames"] == []
    reason = answer["FailedNodes"]["node-a"]
    assert "hami.io/numa-alignment is 'strickt' (did you mean \"strict\"?)" in reason
    assert 'write "best-effort"' in reason


# ---------------------------------------------------------------------------------------------------- Hygon


def dcu_node(name: str) -> dict[str, Any]:
    """Four Z100L DCUs on two NUMA nodes, registered as HAMi's DCU plugin writes them."""
    return dict(
        four_devices(name, f"DCU-{name}", "DCU-Z100L", "hami.io/node-dcu-register", "hygon.com/dcunum", legacy=True)
    )


def dcu_pod(name: str, count: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    limits = {"hygon.com/dcunum": str(count), "hygon.com/dcumem": "1000"}
    return {
        "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


def dcu_holder(node: str, full: list[int]) -> dict[str, Any]:
    """A running pod taking all the memory of the DCUs `full`."""
    devices = "".join(f"DCU-{node}-{i},DCU,65536,0:" for i in full)
    return {
        "metadata": {
            "name": f"holder-{node}",
            "namespace": "default",
            "uid": f"uid-holder-{node}",
            "annotations": {"hami.io/dcu-devices-allocated": devices + ";", "hami.io/vgpu-node": node},
        },
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        "status": {"phase": "Running"},
    }


def dcu_numa(node: str) -> dict[str, int]:
    return split_numa(f"DCU-{node}")


@pytest.fixture
def hygon(harness: Harness) -> Harness:
    """dcu-a: one DCU free on each NUMA node; dcu-b: all four free."""
    harness.add_node(dcu_node("dcu-a"))
    harness.add_pod(dcu_holder("dcu-a", [1, 3]))
    harness.start()
    return harness


def test_hygon_strict_refuses_the_split_node_and_says_why(hygon: Harness) -> None:
    hygon.add_pod(dcu_pod("p", 2, {ALIGN: "strict"}))
    assert_refused_for_want_of_one_numa_node(hygon.filter("p"), "dcu-a", "DCU")


def test_hygon_strict_takes_a_node_with_a_whole_numa_node(hygon: Harness) -> None:
    hygon.add_node(dcu_node("dcu-b"))
    hygon.flush()
    hygon.add_pod(dcu_pod("p", 2, {ALIGN: "strict"}))
    assert hygon.filter("p")["NodeNames"] == ["dcu-b"]
    assert placed_numa(hygon, "p", DCU_PLACED, dcu_numa("dcu-b")) in ([{0}], [{1}])


def test_hygon_best_effort_and_absent_still_place_across_numa_nodes(hygon: Harness) -> None:
    hygon.add_pod(dcu_pod("soft", 2, {ALIGN: "best-effort"}))
    assert hygon.filter("soft")["NodeNames"] == ["dcu-a"]
    assert placed_numa(hygon, "soft", DCU_PLACED, dcu_numa("dcu-a")) == [{0, 1}]


def test_best_effort_prefers_a_node_where_the_container_fits_on_one_numa_node(nvidia: Harness) -> None:
    # binpack (the default node policy) takes the fuller node-a, whose free GPUs sit on two NUMA nodes
    nvidia.add_node(split_node("node-b"))
    nvidia.flush()
    nvidia.add_pod(gpu_pod("plain", gpu=2, mem=1000))
    assert nvidia.filter("plain")["NodeNames"] == ["node-a"]
    nvidia.cluster.delete("pods", "plain", "default")
    nvidia.flush()
    nvidia.add_pod(gpu_pod("aligned", gpu=2, mem=1000, annotations={ALIGN: "best-effort"}))
    answer = nvidia.filter("aligned")
    assert answer["NodeNames"] == ["node-b"]
    assert answer["FailedNodes"] == {}  # node-a could take it: it was passed over, not refused
    assert placed_numa(nvidia, "aligned", NVIDIA_PLACED, nvidia_numa("node-b")) in ([{0}], [{1}])
