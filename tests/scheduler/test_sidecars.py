"""Native sidecars (init containers with `restartPolicy: Always`) through the real extender: its filter places a
sidecar's devices beside the app containers', its bind writes them where the node daemon looks for them, and its
bookkeeping keeps counting them for the pod's whole life (HAMi PR #2723; `hami.model.RunOrder`)."""

from __future__ import annotations

from typing import Any

from scheduler_harness import Harness, gpu_node
from vendor_nodes import ascend_node, vendor_node

from hami.cluster import meta
from hami.codec import decode_pod_devices

GPU = "nvidia.com/gpu"
GPUMEM = "nvidia.com/gpumem"


def pod(name: str, init: list[dict[str, Any]], apps: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "hami-scheduler", "initContainers": init, "containers": apps},
        "status": {"phase": "Pending"},
    }


def container(name: str, limits: dict[str, str], sidecar: bool = False) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "resources": {"limits": limits}}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def gpu(mem: int) -> dict[str, str]:
    return {GPU: "1", GPUMEM: str(mem)}


def entries(harness: Harness, name: str, key: str) -> list[list[tuple[str, int]]]:
    value = (meta(harness.cluster.get("pods", name, "default")).get("annotations") or {})[key]
    return [[(d.uuid, d.usedmem) for d in c] for c in decode_pod_devices(value)]


def test_a_gpu_sidecar_and_a_gpu_app_container_are_placed_side_by_side(harness: Harness) -> None:
    harness.add_node(gpu_node("n1", gpus=2, memory=16384))
    harness.add_pod(pod("sidecar", [container("proxy", gpu(10000), sidecar=True)], [container("main", gpu(10000))]))
    harness.start()
    assert harness.schedule("sidecar") == "n1"
    placed = entries(harness, "sidecar", "hami.io/vgpu-devices-to-allocate")
    # the sidecar's entry at its own position (init containers first), the app container's after it, and they
    # cannot share a 16384 MiB GPU
    assert [len(c) for c in placed] == [1, 1]
    assert {placed[0][0][0], placed[1][0][0]} == {"GPU-n1-0", "GPU-n1-1"}
    assert entries(harness, "sidecar", "hami.io/vgpu-devices-allocated") == placed
    usage = harness.service.state.usage_snapshot()["n1"]["NVIDIA"]  # type: ignore[union-attr]
    assert usage == {"GPU-n1-0": (1, 10000, 0), "GPU-n1-1": (1, 10000, 0)}


def test_a_sidecar_pod_that_only_fits_one_phase_at_a_time_is_refused(harness: Harness) -> None:
    harness.add_node(gpu_node("n1", gpus=1, memory=16384))
    harness.add_pod(pod("sidecar", [container("proxy", gpu(10000), sidecar=True)], [container("main", gpu(10000))]))
    harness.add_pod(pod("plain", [container("proxy", gpu(10000))], [container("main", gpu(10000))]))
    harness.start()
    answer = harness.filter("sidecar")
    assert answer["NodeNames"] == []
    assert answer["FailedNodes"]["n1"] == "container main: needs 1 NVIDIA device, 0/1 usable (1 insufficient memory)"
    # the same containers with a plain init container hold 10000 MiB at a time: one GPU serves both
    assert harness.schedule("plain") == "n1"
    assert harness.service.state.usage_snapshot()["n1"]["NVIDIA"] == {"GPU-n1-0": (1, 10000, 0)}  # type: ignore[union-attr]


def test_after_a_restart_the_scheduler_still_counts_the_sidecar(harness: Harness) -> None:
    harness.add_node(gpu_node("n1", gpus=1, memory=16384))
    harness.add_pod(pod("sidecar", [container("proxy", gpu(6000), sidecar=True)], [container("main", gpu(6000))]))
    harness.add_pod(pod("next", [], [container("main", gpu(6000))]))
    harness.start()
    assert harness.schedule("sidecar") == "n1"
    harness.restart()  # usage rebuilt from the pod's annotations and spec alone
    assert harness.service.state.usage_snapshot()["n1"]["NVIDIA"] == {"GPU-n1-0": (2, 12000, 0)}  # type: ignore[union-attr]
    answer = harness.filter("next")  # 12000 + 6000 > 16384
    assert answer["NodeNames"] == [], answer


def test_an_ascend_sidecar_takes_its_own_share_of_the_npu(harness: Harness) -> None:
    # one 910B3 of 64 GiB: two 32 GiB templates fit side by side, a third does not
    harness.add_node(ascend_node("npu-a", count=1))
    share = {"huawei.com/Ascend910B3": "1", "huawei.com/Ascend910B3-memory": "32768"}
    two = [container("a", share), container("b", share)]
    harness.add_pod(pod("trio", [container("proxy", share, sidecar=True)], two))
    harness.add_pod(pod("plain", [container("proxy", share)], two))
    harness.add_pod(pod("pair", [container("proxy", share, sidecar=True)], [container("main", share)]))
    harness.start()
    assert harness.filter("trio")["NodeNames"] == []  # three 32 GiB shares at once
    assert harness.schedule("plain") == "npu-a"  # the init container's share is free again when a and b start
    placed = entries(harness, "plain", "hami.io/Ascend910B3-devices-to-allocate")
    assert placed == [[("npu-a-npu-0", 32768)]] * 3
    assert harness.service.state.usage_snapshot()["npu-a"]["Ascend910B3"] == {  # type: ignore[union-attr]
        "npu-a-npu-0": (2, 65536, 0)
    }
    harness.cluster.delete("pods", "plain", "default")
    harness.flush()
    assert harness.schedule("pair") == "npu-a"
    assert entries(harness, "pair", "hami.io/Ascend910B3-devices-to-allocate") == [[("npu-a-npu-0", 32768)]] * 2
    assert harness.service.state.usage_snapshot()["npu-a"]["Ascend910B3"] == {  # type: ignore[union-attr]
        "npu-a-npu-0": (2, 65536, 0)
    }


def test_a_hygon_sidecar_is_counted_with_the_app_container(harness: Harness) -> None:
    harness.add_node(
        vendor_node(
            "dcu-a", "hami.io/node-dcu-register", "hygon.com/dcunum", "DCU", count=1, prefix="DCU-", legacy=True
        )
    )
    share = {"hygon.com/dcunum": "1", "hygon.com/dcumem": "9000"}
    harness.add_pod(pod("sidecar", [container("proxy", share, sidecar=True)], [container("main", share)]))
    harness.add_pod(pod("plain", [container("proxy", share)], [container("main", share)]))
    harness.start()
    answer = harness.filter("sidecar")
    assert answer["NodeNames"] == [], answer  # 9000 + 9000 > 16384
    assert harness.schedule("plain") == "dcu-a"
    assert entries(harness, "plain", "hami.io/dcu-devices-to-allocate") == [[("DCU-dcu-a-0", 9000)]] * 2


def test_a_moore_threads_sidecar_shares_the_pods_one_gpu_with_the_app_container(harness: Harness) -> None:
    # HAMi puts every Moore Threads container of a pod on one GPU (16 GiB here): a 16 GiB sidecar leaves no room for
    # the app container, a 16 GiB init container does
    harness.add_node(vendor_node("mt-a", "hami.io/node-mthreads-register", "mthreads.com/vgpu", "MTT S4000"))
    whole, small = (
        {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": units} for units in ("32", "2")
    )  # 512 MiB units
    harness.add_pod(pod("sidecar", [container("proxy", whole, sidecar=True)], [container("main", small)]))
    harness.add_pod(pod("plain", [container("proxy", whole)], [container("main", small)]))
    harness.start()
    answer = harness.filter("sidecar")
    assert answer["NodeNames"] == [], answer
    assert harness.schedule("plain") == "mt-a"
    placed = entries(harness, "plain", "hami.io/mthreads-vgpu-devices-to-allocate")
    assert [[mib for _, mib in c] for c in placed] == [[16384], [1024]]
