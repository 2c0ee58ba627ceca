"""The AWS Neuron plugin: the conformance kit, HAMi's names and admission checks, devices from capacity, core masks,
device runs, and the pod annotations AWS's device plugin reads, as HAMi v2.10 writes them."""

from __future__ import annotations

import pytest

import hami_vendor_awsneuron.plugin as plugin
from hami.model import Container, ContainerRequest, DeviceUsage, NodeView, Pod, SchedulingPolicy
from hami.plugins import VendorPlugins
from hami.testing.conformance import RequestCase, VendorFixture, pytest_suite
from hami_vendor_awsneuron import neuron

W = "AWSNeuron"
DEVICES, CORES = "aws.amazon.com/neuron", "aws.amazon.com/neuroncore"


def req(count: int = 1, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(kind=W, count=count, cores=cores)


REQUESTS = [
    RequestCase(W, {DEVICES: "2"}, req(2)),
    RequestCase(W, {CORES: "1"}, req(1, 1)),
    RequestCase(W, {CORES: "2"}, req(1, 2)),
    RequestCase(W, {CORES: "4"}, req(2, 2)),
    RequestCase(W, {DEVICES: "1", CORES: "1"}, req(1)),  # devices win, as in HAMi
    RequestCase(W, {CORES: "3"}, "aws.amazon.com/neuroncore must be 1 or a multiple of 2, got 3"),
    RequestCase(W, {DEVICES: "0"}, "aws.amazon.com/neuron must be greater than 0"),
    RequestCase(W, {DEVICES: "1.5"}, "plain non-negative integer"),
    RequestCase(W, {DEVICES: "2147483648"}, "must not exceed 2147483647"),
]


def node(name: str, count: int = 4, cores: int = 8, instance: str = "trn1.32xlarge") -> NodeView:
    capacity = {DEVICES: str(count), CORES: str(cores)}
    labels = {"node.kubernetes.io/instance-type": instance}
    return NodeView(name=name, devices=[DeviceUsage(device=d) for d in neuron.node_devices(capacity, labels, name)])


def busy(view: NodeView, index: int, mask: int) -> NodeView:
    usage = view.devices[index]
    usage.used, usage.usedcores = mask.bit_count(), mask
    return view


def nodes() -> list[NodeView]:
    return [node("idle"), busy(busy(node("busy"), 3, 1), 0, 3)]


def make_fixture() -> VendorFixture:
    return VendorFixture(name="awsneuron", plugin=plugin, requests=REQUESTS, nodes={W: nodes},
                         fit_requests={W: [req(1), req(1, 1), req(1, 2), req(4)]})  # fmt: skip


test_conformance = pytest_suite(make_fixture)


def plugins() -> VendorPlugins:
    return VendorPlugins.from_plugins({"awsneuron": plugin}, config={}, strict=True)


def test_the_kind_carries_hamis_names() -> None:
    keys = plugin.NEURON.annotations
    assert plugin.NEURON.resources.all() == (DEVICES, CORES)
    assert (keys.to_allocate, keys.allocated) == (None, "hami.io/aws-neuron-devices-allocated")
    assert keys.selectors() == ("aws.amazon.com/use-neuron-uuid", "aws.amazon.com/nouse-neuron-uuid")


def test_devices_come_from_the_capacity_as_hami_derives_them() -> None:
    # HAMi's own test: an inf2 node, 2 devices of 2 cores each
    got = plugins().node_devices(W, {}, "n", {DEVICES: "2", CORES: "4"}, {"node.kubernetes.io/instance-type": "inf2"})
    assert got is not None
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, dict(d.custom)) for d in got] == [
        (f"n-{W}-{i}", i, 2, 0, 3, {"AWSNodeType": "inf2"}) for i in range(2)]  # fmt: skip
    assert plugins().node_devices(W, {}, "n", {"cpu": "8"}, {}) == []


def pod(*limits: dict[str, str]) -> Pod:
    return Pod(name="p", containers=tuple(Container(name=f"c{i}", limits=lim) for i, lim in enumerate(limits)))


def fit(the_pod: Pod, view: NodeView, policy: SchedulingPolicy | None = None) -> tuple[object, dict[str, str]]:
    requests = plugins().pod_requests(the_pod).get(W, [])
    (got,) = plugins().fit_nodes(W, the_pod, requests, [view], policy or SchedulingPolicy())
    return got.placement, dict(got.pod_annotations)


def placed(placement: object) -> list[list[tuple[str, int]]]:
    return [[(d.uuid, d.usedcores) for d in c] for c in placement]  # type: ignore[attr-defined]


def test_two_single_cores_of_a_pod_share_the_last_device_one_core_each() -> None:
    placement, annotations = fit(pod({CORES: "1"}, {CORES: "1"}), node("n", 2, 4, "inf2.xlarge"))
    assert placed(placement) == [[("n-AWSNeuron-1", 1)], [("n-AWSNeuron-1", 2)]]
    # HAMi's list of core ids runs on over the containers: device 1's cores are 2 and 3
    assert annotations["AWS_NEURON_IDS"] == "2,3"
    assert annotations["NEURON_RESOURCE_TYPE"] == CORES
    assert (annotations["NEURON_ALLOCATED"], annotations["aws.amazon.com/predicate-node"]) == ("false", "n")
    assert annotations["NEURON_ALLOC_TIME"].isdigit()


def test_whole_devices_are_indices_and_several_are_a_run() -> None:
    placement, annotations = fit(pod({DEVICES: "2"}), node("n", 4, 8, "inf2.24xlarge"))
    assert placed(placement) == [[("n-AWSNeuron-0", 3), ("n-AWSNeuron-1", 3)]]
    assert annotations["AWS_NEURON_IDS"] == "0,1"
    assert "NEURON_RESOURCE_TYPE" not in annotations


def test_a_run_on_trainium_is_aligned_and_of_one_four_eight_or_sixteen_devices() -> None:
    view = busy(node("n", 8, 16), 1, 1)
    placement, _ = fit(pod({DEVICES: "4"}), view)
    assert [d for d, _ in placed(placement)[0]] == [f"n-AWSNeuron-{i}" for i in range(4, 8)]
    (refused,) = plugins().fit_nodes(W, pod({DEVICES: "3"}), [req(3)], [node("n", 8, 16)], SchedulingPolicy())
    assert refused.placement is None
    assert "consecutive indices" in refused.reason
    ring = busy(node("r", 4, 8, "inf2.48xlarge"), 0, 1)
    placement, _ = fit(pod({DEVICES: "3"}), ring)  # inf instances are a ring: any start
    assert [d for d, _ in placed(placement)[0]] == [f"r-AWSNeuron-{i}" for i in range(1, 4)]


def test_a_core_request_takes_the_free_core_and_a_device_request_an_idle_device() -> None:
    view = busy(node("n", 1, 2), 0, 1)
    placement, annotations = fit(pod({CORES: "1"}), view)
    assert placed(placement) == [[("n-AWSNeuron-0", 2)]]
    assert annotations["AWS_NEURON_IDS"] == "1"
    (refused,) = plugins().fit_nodes(
        W, pod({DEVICES: "1"}), [req(1)], [busy(node("n", 1, 2), 0, 1)], SchedulingPolicy()
    )
    assert refused.reason == "pod: needs 1 AWSNeuron device, 0/1 usable (1 insufficient cores)"


@pytest.mark.parametrize(
    ("annotations", "chosen"),
    [({"aws.amazon.com/use-neuron-uuid": "n-AWSNeuron-0"}, "n-AWSNeuron-0"),
     ({"aws.amazon.com/nouse-neuron-uuid": "n-AWSNeuron-1"}, "n-AWSNeuron-0")],
)  # fmt: skip
def test_selectors_use_hamis_keys(annotations: dict[str, str], chosen: str) -> None:
    the_pod = pod({CORES: "2"}).model_copy(update={"annotations": annotations})
    placement, _ = fit(the_pod, node("n", 2, 4))
    assert placed(placement) == [[(chosen, 3)]]


def test_mutex_keeps_a_busy_device_from_a_second_pod() -> None:
    view = busy(node("n", 1, 2), 0, 1)
    (got,) = plugins().fit_nodes(W, pod({CORES: "1"}), [req(1, 1)], [view], SchedulingPolicy(device=("mutex",)))
    assert got.reason == "pod: needs 1 AWSNeuron device, 0/1 usable (1 not idle (mutex))"
