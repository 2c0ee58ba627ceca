"""The AWS Neuron vendor plugin: HAMi v2.10's ``AWSNeuron`` kind, Trainium and Inferentia devices and NeuronCores.

Every hook of the vendor, each a thin call into `hami_vendor_awsneuron.neuron`, which owns the rules:

* metadata here: one kind, ``AWSNeuron`` (``aws.amazon.com/neuron`` devices, ``aws.amazon.com/neuroncore`` cores),
  its devices derived from the node's capacity as HAMi derives them (`hami_node_devices`: the cores per device and
  the instance type need the capacity and labels), placements in ``hami.io/aws-neuron-devices-allocated`` only
  (HAMi writes no to-allocate key: AWS's Neuron device plugin serves the node, not this daemon), selectors
  ``aws.amazon.com/use-neuron-uuid``/``nouse-neuron-uuid``;
* requests and HAMi's admission checks (`read_request`), fitting (`fit_node`) and the pod annotations AWS's plugin
  reads (`pod_annotations`).

No discovery, container edits or isolation library: the split into NeuronCores is the hardware's, and the node side
is AWS's, as in HAMi.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from hami import hookimpl
from hami.model import (
    AnnotationKeys,
    Container,
    ContainerRequest,
    Device,
    DeviceKind,
    NodeFit,
    NodeView,
    Pod,
    RegisterFormat,
    ResourceNames,
    SchedulingPolicy,
    VendorInfo,
)
from hami_vendor_awsneuron import neuron

__all__ = ["INFO", "NEURON"]

NEURON = DeviceKind(
    common_word=neuron.WORD,
    resources=ResourceNames(count=neuron.DEVICES, cores=neuron.CORES),
    annotations=AnnotationKeys(
        to_allocate=None,
        allocated="hami.io/aws-neuron-devices-allocated",
        use_uuid="aws.amazon.com/use-neuron-uuid",
        nouse_uuid="aws.amazon.com/nouse-neuron-uuid",
    ),
    register_format=RegisterFormat.CAPACITY,
)

INFO = VendorInfo(name="awsneuron", display_name="AWS Neuron", kinds=(NEURON,))


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_node_devices(node: str, capacity: Mapping[str, str], labels: Mapping[str, str]) -> list[Device]:
    return neuron.node_devices(capacity, labels, node)


@hookimpl
def hami_container_request(container: Container) -> ContainerRequest | None:
    return neuron.read_request(container)


@hookimpl
def hami_fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
) -> list[NodeFit]:
    now = time.time_ns()
    out = []
    for node in nodes:
        fit = neuron.fit_node(kind, pod, requests, node, policy)
        if fit.placement is not None:
            annotations = neuron.pod_annotations(pod, node, fit.placement, now)
            fit = fit.model_copy(update={"pod_annotations": annotations})
        out.append(fit)
    return out
