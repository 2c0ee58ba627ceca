"""Native sidecars on the real path (Kubernetes 1.29+, GA in 1.33; the pinned kube-apiserver is 1.35): an init
container with `restartPolicy: Always` that asks for a GPU runs beside the app container for the pod's whole life,
so the webhook's quota, the extender's fit and the node daemon's Allocate count it with the app container
(HAMi PR #2723). Two nodes of 2 × 16 GiB fake GPUs (split 10), as the session's cluster has them.
"""

from __future__ import annotations

from typing import Any

import pytest
from control_plane import wait_until
from hami_stack import GpuNode, HamiStack
from kube_rest import ApiError

from hami.codec import decode_pod_devices

pytestmark = pytest.mark.e2e

ALLOCATED = "hami.io/vgpu-devices-allocated"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"


def gpu(mem: int) -> dict[str, Any]:
    return {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem)}}


def sidecar_pod(name: str, namespace: str, sidecar: int, app: int, native: bool = True) -> dict[str, Any]:
    """A GPU proxy declared as an init container (a native sidecar unless `native` is False) and a GPU app."""
    proxy: dict[str, Any] = {"name": "proxy", "image": "envoyproxy/envoy:v1.31", "resources": gpu(sidecar)}
    if native:
        proxy["restartPolicy"] = "Always"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "initContainers": [proxy],
            "containers": [{"name": "main", "image": "nvidia/cuda:12.4.1-base", "resources": gpu(app)}],
            "terminationGracePeriodSeconds": 1,
        },
    }


def running(stack: HamiStack, namespace: str, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        got = stack.admin.get("Pod", name, namespace)
        return got if got.get("status", {}).get("phase") == "Running" else None

    found: dict[str, Any] = wait_until(check, 60, f"pod {namespace}/{name} Running", stack.diagnose)
    return found


def test_a_pod_with_a_gpu_sidecar_and_a_gpu_app_container_gets_a_share_for_each(stack: HamiStack, ns: str) -> None:
    api = stack.admin
    created = api.create(sidecar_pod("proxied", ns, sidecar=10000, app=10000))
    assert created["spec"]["initContainers"][0]["restartPolicy"] == "Always", "the API server keeps the sidecar"
    assert created["spec"]["schedulerName"] == "hami-scheduler"
    got = running(stack, ns, "proxied")
    annotations = got["metadata"]["annotations"]
    assert annotations["hami.io/bind-phase"] == "success"
    # the sidecar's entry at its place among the init containers, the app container's after it; 10000 + 10000 MiB
    # do not fit one 16 GiB GPU at once, so each has its own GPU of the node
    (proxy,), (main,) = decode_pod_devices(annotations[ALLOCATED])
    assert (proxy.usedmem, main.usedmem) == (10000, 10000)
    node = stack.nodes[got["spec"]["nodeName"]]
    assert isinstance(node, GpuNode)
    assert {proxy.uuid, main.uuid} == set(node.uuids), "both GPUs of the node, one each"
    assert decode_pod_devices(annotations[TO_ALLOCATE]) == ((), ()), "the node daemon served both entries"
    # the kubelet's Allocate for each container got that container's own share
    served = wait_until(lambda: node.kubelet.started.get(got["metadata"]["uid"]), 10, "kubelet record")
    for container, device in (("proxy", proxy), ("main", main)):
        env = served.edits[container]["nvidia.com/gpu"].env
        assert (env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_DEVICE_MEMORY_LIMIT_0"]) == (device.uuid, "10000m")


def test_a_namespace_quota_counts_a_gpu_sidecar_with_the_app_container(stack: HamiStack, ns: str) -> None:
    api = stack.admin
    api.create(
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu-memory", "namespace": ns},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "16000"}},
        }
    )
    # admission learns the quota through its watch: probe with dry runs until it refuses
    wait_until(lambda: api.refuses_for_quota(sidecar_pod("probe", ns, 10000, 10000)), 30, "the webhook knows the quota")
    with pytest.raises(ApiError) as refused:
        api.create(sidecar_pod("proxied", ns, sidecar=10000, app=10000))
    assert "this pod asks 20000 MiB (proxy: 1 × 10000 MiB (sidecar); main: 1 × 10000 MiB)" in refused.value.message
    # the same proxy as a plain init container has finished before the app container starts: 10000 MiB at a time
    api.create(sidecar_pod("plain", ns, sidecar=10000, app=10000, native=False))
    got = running(stack, ns, "plain")
    (init,), (main,) = decode_pod_devices(got["metadata"]["annotations"][ALLOCATED])
    assert (init.usedmem, main.usedmem) == (10000, 10000)
