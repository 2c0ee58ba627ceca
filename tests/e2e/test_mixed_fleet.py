"""A mixed fleet: a node still running HAMi v2.10's own NVIDIA device plugin under this scheduler.

HAMi's plugin registers the node's GPUs (`hami.io/node-nvidia-register`) and has the kubelet offer
`nvidia.com/gpu`, but never answers the handshake: the question HAMi's scheduler left on the node
(`Requesting_<time>`) stays unanswered. HAMi keeps such a node while its allocatable GPU count is above 0, and
so must this scheduler when it replaces HAMi's: the node is placed on, and never marked `Deleted_`.
(The other half, this project's node daemon under HAMi's scheduler, rests on HAMi asking again after any
answer: `tests/scheduler/test_handshake.py`.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from control_plane import wait_until
from e2e_kubelet import NodeKubelet
from hami_stack import HamiStack
from kube_rest import ApiError

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
