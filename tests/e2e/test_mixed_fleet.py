"""A mixed fleet: a node still running HAMi v2.10's own NVIDIA device plugin under this scheduler.

HAMi's plugin registers the node's GPUs (`hami.io/node-nvidia-register`) and has the kubelet offer
`nvidia.com/gpu`, but never answers the handshake: the question HAMi's scheduler left on the node
(`Requesting_<time>`) stays unanswered. HAMi keeps such a node while its allocatable GPU count is above 0, and
so must this scheduler when it replaces HAMi's: the node is placed on, and never marked `Deleted_`; a `Deleted_`
found on such a node (left by HAMi's scheduler before the kubelet offered the GPUs again) is asked again, as
HAMi's `CheckHealth` asks after anything but `Requesting`, and the node serves meanwhile. A cluster autoscaler's
template of the node (a full-Nodes filter naming a node the cluster does not have) is simulated, nothing written.

The other half: this project's node daemon under HAMi's scheduler. HAMi v2.10's scheduler is not built here (its
module is not served by the Go proxy these machines reach), so
`test_this_projects_daemon_serves_a_pod_placed_by_hamis_scheduler`
plays its part on the wire, with the strings protocol.md gives for HAMi's writes: the handshake question, the
placement annotations, `bind-phase: allocating`, the node lock in HAMi's `<RFC3339>,<namespace>,<name>` form and
the Binding. The daemon must serve that pod, say `success` and free the lock, exactly as HAMi's device plugin does.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from control_plane import wait_until
from e2e_kubelet import NodeKubelet
from hami_stack import GpuNode, HamiStack, build_fake_nvml, gpu_box
from kube_rest import ApiError, path_of

from hami.codec import HANDSHAKE_TIME_FORMAT, decode_pod_devices, encode_node_register
from hami.model import Device

pytestmark = pytest.mark.e2e

NODE = "hami-plugin-node"
HANDSHAKE = "hami.io/node-handshake"
REGISTER = "hami.io/node-nvidia-register"


@pytest.fixture
def hami_plugin_node(stack: HamiStack) -> Iterator[NodeKubelet]:
    kubelet = NodeKubelet(stack.admin, NODE, labels={"hami-plugin": "on"}).start()
    kubelet.offer("nvidia.com/gpu", 20)
    gpus = [
        Device(id=f"GPU-hami-plugin-{i}", index=i, count=10, devmem=16384, devcore=100, type="NVIDIA-Tesla T4")
        for i in range(2)
    ]
    # what HAMi's scheduler left behind: a question asked long ago, never answered by HAMi's plugin
    asked = (datetime.now() - timedelta(minutes=10)).strftime(HANDSHAKE_TIME_FORMAT)
    annotations = {REGISTER: encode_node_register(gpus), HANDSHAKE: f"Requesting_{asked}"}
    stack.admin.merge_patch("Node", NODE, {"metadata": {"annotations": annotations}})
    wait_until(
        lambda: stack.admin.get("Node", NODE)["status"]["allocatable"].get("nvidia.com/gpu") == "20",
        30,
        f"{NODE} offers nvidia.com/gpu",
        stack.diagnose,
    )
    try:
        yield kubelet
    finally:
        kubelet.stop()
        try:
            stack.admin.delete("Node", NODE)
        except ApiError as exc:
            if exc.status != 404:
                raise


def gpu_pod(name: str, namespace: str) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"hami-plugin": "on"},
            "containers": [{"name": "cuda", "image": "nvidia/cuda:12.4.1-base", "resources": {"limits": limits}}],
            "terminationGracePeriodSeconds": 1,
        },
    }


def test_a_node_running_hamis_device_plugin_keeps_its_gpus(
    stack: HamiStack, ns: str, hami_plugin_node: NodeKubelet
) -> None:
    interval = float(stack.hami_config()["scheduler"].get("handshakeIntervalSeconds", 30))
    # let at least one handshake round see the expired, unanswered question
    time.sleep(interval + 2)
    annotations = stack.admin.get("Node", NODE)["metadata"]["annotations"]
    assert annotations[HANDSHAKE].startswith("Requesting_"), annotations[HANDSHAKE]
    stack.admin.create(gpu_pod("on-hami-plugin", ns))

    def bound() -> dict[str, Any] | None:
        got = stack.admin.get("Pod", "on-hami-plugin", ns)
        return got if got["spec"].get("nodeName") else None

    placed = wait_until(bound, 60, "the pod bound to the HAMi-plugin node", stack.diagnose)
    assert placed["spec"]["nodeName"] == NODE
    (devices,) = decode_pod_devices(placed["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"])
    assert devices[0].uuid.startswith("GPU-hami-plugin-")
    assert devices[0].usedmem == 3000
    assert not stack.admin.get("Node", NODE)["metadata"]["annotations"][HANDSHAKE].startswith("Deleted_")


def test_a_deleted_handshake_on_a_node_offering_gpus_is_asked_again_and_the_node_serves(
    stack: HamiStack, ns: str, hami_plugin_node: NodeKubelet
) -> None:
    """HAMi v2.10's `CheckHealth` looks only for `Requesting`: a `Deleted_` left on a node whose kubelet offers
    GPUs (HAMi's plugin came back after HAMi's scheduler dropped it) is asked again and the node keeps serving."""
    deleted = (datetime.now() - timedelta(minutes=5)).strftime(HANDSHAKE_TIME_FORMAT)
    stack.admin.merge_patch("Node", NODE, {"metadata": {"annotations": {HANDSHAKE: f"Deleted_{deleted}"}}})
    stack.admin.create(gpu_pod("after-deleted", ns))

    def bound() -> dict[str, Any] | None:
        got = stack.admin.get("Pod", "after-deleted", ns)
        return got if got["spec"].get("nodeName") else None

    assert wait_until(bound, 60, "the pod bound to the node", stack.diagnose)["spec"]["nodeName"] == NODE
    interval = float(stack.hami_config()["scheduler"].get("handshakeIntervalSeconds", 30))

    def asked() -> str | None:
        value = str(stack.admin.get("Node", NODE)["metadata"]["annotations"][HANDSHAKE])
        return value if value.startswith("Requesting_") else None

    wait_until(asked, interval + 15, "a new question on the node", stack.diagnose)


def test_an_autoscalers_template_node_is_simulated_and_nothing_is_written(
    stack: HamiStack, ns: str, hami_plugin_node: NodeKubelet
) -> None:
    """A filter in the full-Nodes form naming a node the cluster does not have (a cluster autoscaler's template of
    this node group) is answered as HAMi v2.10's `filterSimulation`: fitted from the Node object given, nothing
    written, no Node created."""
    pod = stack.admin.create({**gpu_pod("pending-scale-up", ns), "spec": {**gpu_pod("x", ns)["spec"],
                              "nodeSelector": {"hami-plugin": "template"}}})  # fmt: skip
    template = stack.admin.get("Node", NODE)
    template["metadata"] = {
        "name": "template-hami-plugin-node-0",
        "labels": {**template["metadata"].get("labels", {}), "hami-plugin": "template"},
        "annotations": template["metadata"]["annotations"],
    }
    body = json.dumps({"Pod": pod, "Nodes": {"items": [template]}}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{stack.extender_port}/filter", body, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
    assert answer["Error"] == ""
    assert [n["metadata"]["name"] for n in answer["Nodes"]["items"]] == ["template-hami-plugin-node-0"]
    with pytest.raises(ApiError) as missing:
        stack.admin.get("Node", "template-hami-plugin-node-0")
    assert missing.value.status == 404
    annotations = stack.admin.get("Pod", "pending-scale-up", ns)["metadata"].get("annotations") or {}
    assert "hami.io/vgpu-devices-allocated" not in annotations


HAMI_PLACED_NODE = "hami-placed-node"


@pytest.fixture
def our_node_under_hamis_scheduler(stack: HamiStack) -> Iterator[GpuNode]:
    node = GpuNode(stack, HAMI_PLACED_NODE, gpu_box("e1", 2), build_fake_nvml(stack.dir / "fake-nvml-hami"), {})
    node.kubelet.labels = {"hami-placed": "on"}  # none of this stack's pods select it
    stack.add_node(node)
    try:
        yield node
    finally:
        node.stop()
        stack.nodes.pop(node.name, None)
        with contextlib.suppress(ApiError):
            stack.admin.delete("Node", HAMI_PLACED_NODE)


def test_this_projects_daemon_serves_a_pod_placed_by_hamis_scheduler(
    stack: HamiStack, ns: str, our_node_under_hamis_scheduler: GpuNode
) -> None:
    api = stack.admin
    node = our_node_under_hamis_scheduler
    uuid = node.uuids[1]
    # HAMi's scheduler asks the node (a fresh question: it asks again after any answer)
    asked = datetime.now().strftime(HANDSHAKE_TIME_FORMAT)
    api.merge_patch("Node", HAMI_PLACED_NODE, {"metadata": {"annotations": {HANDSHAKE: f"Requesting_{asked}"}}})
    # ... finds the node's GPUs in the register annotation this project's daemon publishes ...
    registered = api.get("Node", HAMI_PLACED_NODE)
    assert uuid in registered["metadata"]["annotations"][REGISTER]
    assert registered["status"]["allocatable"].get("nvidia.com/gpu", "0") != "0", "HAMi keeps a node offering GPUs"
    # ... takes a pod no scheduler of this stack schedules (HAMi's runs under its own name) ...
    pod = gpu_pod("placed-by-hami", ns)
    pod["spec"]["schedulerName"] = "hami-scheduler-v2-10"
    pod["spec"]["nodeSelector"] = {"hami-placed": "on"}
    pod["metadata"]["labels"] = {"hami.io/webhook": "ignore"}  # HAMi's own webhook mutated it already
    created = api.create(pod)
    # ... its filter writes the placement, its bind the phase, the node lock, and the Binding
    placement = f"{uuid},NVIDIA,3000,0:;"
    now = int(time.time())
    api.merge_patch("Pod", "placed-by-hami", {"metadata": {"annotations": {
        "hami.io/vgpu-devices-to-allocate": placement,
        "hami.io/vgpu-devices-allocated": placement,
        "hami.io/vgpu-node": HAMI_PLACED_NODE,
        "hami.io/vgpu-time": str(now),
        "hami.io/bind-phase": "allocating",
        "hami.io/bind-time": str(now),
    }, "labels": {"hami.io/vgpu-node": HAMI_PLACED_NODE}}}, namespace=ns)  # fmt: skip
    lock = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") + f",{ns},placed-by-hami"
    api.merge_patch("Node", HAMI_PLACED_NODE, {"metadata": {"annotations": {"hami.io/mutex.lock": lock}}})
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "placed-by-hami", "namespace": ns, "uid": created["metadata"]["uid"]},
        "target": {"apiVersion": "v1", "kind": "Node", "name": HAMI_PLACED_NODE},
    }
    api.request("POST", path_of("Pod", "placed-by-hami", ns, sub="binding"), binding)

    def running() -> dict[str, Any] | None:
        got = api.get("Pod", "placed-by-hami", ns)
        return got if got["status"].get("phase") == "Running" else None

    served = wait_until(running, 60, "the HAMi-placed pod running", stack.diagnose)
    annotations = served["metadata"]["annotations"]
    assert annotations["hami.io/bind-phase"] == "success"
    assert annotations["hami.io/vgpu-devices-to-allocate"] == ";", "the served entry is emptied, as HAMi's plugin does"
    assert "hami.io/mutex.lock" not in (api.get("Node", HAMI_PLACED_NODE)["metadata"].get("annotations") or {})
    started = node.kubelet.started[served["metadata"]["uid"]]
    (edits,) = started.edits["cuda"].values()
    assert edits.env["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert edits.env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
