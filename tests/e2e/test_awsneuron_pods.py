"""AWS Neuron pods through the real path, on a node whose Neuron devices AWS's device plugin offers.

As in HAMi, the node side is AWS's Neuron device plugin: here the kubelet offers ``aws.amazon.com/neuron`` and
``aws.amazon.com/neuroncore`` as that plugin lists them (2 devices of 2 cores, an inf2 instance), and starts the pods
without an Allocate of this suite. The scheduler derives the devices from that capacity as HAMi does, and writes
HAMi's ``hami.io/aws-neuron-devices-allocated`` and the annotations AWS's plugin reads (``AWS_NEURON_IDS``, …).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from control_plane import wait_until
from e2e_kubelet import NodeKubelet
from hami_stack import HamiStack
from kube_rest import ApiError

from hami.codec import decode_pod_devices
from hami.plugins import VendorPlugins

pytestmark = pytest.mark.e2e

NODE = "neuron-node-1"


@pytest.fixture(scope="module")
def neuron_node(stack: HamiStack) -> Iterator[NodeKubelet]:
    if "awsneuron" not in {v.name for v in VendorPlugins.load().vendors}:
        pytest.skip("the AWS Neuron vendor plugin (hami-vendor-awsneuron) is not installed")
    kubelet = NodeKubelet(stack.admin, NODE, labels={"gpu": "on", "node.kubernetes.io/instance-type": "inf2.xlarge"})
    kubelet.start()
    kubelet.offer("aws.amazon.com/neuron", 2)
    kubelet.offer("aws.amazon.com/neuroncore", 4)
    wait_until(
        lambda: stack.admin.get("Node", NODE)["status"]["allocatable"].get("aws.amazon.com/neuroncore") == "4",
        30,
        f"{NODE} offers aws.amazon.com/neuroncore",
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


def _run(stack: HamiStack, ns: str, name: str, limits: dict[str, str]) -> dict[str, Any]:
    stack.admin.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"containers": [{"name": "neuron", "image": "neuron-rt", "resources": {"limits": limits}}]},
        }
    )

    def running() -> dict[str, Any] | None:
        got = stack.admin.get("Pod", name, ns)
        return got if got["status"].get("phase") == "Running" else None

    def describe() -> str:
        got = stack.admin.get("Pod", name, ns)
        events = [f"{e['reason']}: {e['message']}" for e in stack.admin.events_about(ns, name)]
        return f"pod: {got['metadata']}\nspec: {got['spec']}\nevents: {events}\n" + stack.diagnose()

    return wait_until(running, 60, f"the Neuron pod {name} Running", describe)


def test_two_one_core_pods_get_the_two_cores_of_one_device(stack: HamiStack, neuron_node: NodeKubelet, ns: str) -> None:
    before = time.time_ns()
    first = _run(stack, ns, "core-a", {"aws.amazon.com/neuroncore": "1"})
    second = _run(stack, ns, "core-b", {"aws.amazon.com/neuroncore": "1"})
    grants = []
    for got in (first, second):
        annotations = got["metadata"]["annotations"]
        assert got["spec"]["nodeName"] == NODE
        assert "hami.io/aws-neuron-devices-to-allocate" not in annotations  # HAMi writes none for Neuron
        ((device,),) = decode_pod_devices(annotations["hami.io/aws-neuron-devices-allocated"])
        grants.append((device.uuid, device.usedcores, annotations["AWS_NEURON_IDS"]))
        assert annotations["NEURON_RESOURCE_TYPE"] == "aws.amazon.com/neuroncore"
        assert (annotations["NEURON_ALLOCATED"], annotations["aws.amazon.com/predicate-node"]) == ("false", NODE)
        assert before <= int(annotations["NEURON_ALLOC_TIME"]) <= time.time_ns()
    # the highest device first, its lower core first; the second pod gets the other core of the same device
    assert grants == [(f"{NODE}-AWSNeuron-1", 1, "2"), (f"{NODE}-AWSNeuron-1", 2, "3")]
    for name in ("core-a", "core-b"):
        stack.admin.delete("Pod", name, ns)
