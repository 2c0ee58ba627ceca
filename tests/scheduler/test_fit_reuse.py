"""A vendor's fits reused for later pods alike (`DeviceKind.reusable_fits`), and only while they still hold."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from scheduler_harness import Harness, gpu_node, gpu_pod

from hami.cluster import meta
from hami.fitting import CORDON_ANNOTATION
from hami.model import ContainerRequest, DeviceKind, NodeFit, NodeView, Pod

NODES = [f"node-{i:02d}" for i in range(20)]


def fitted_nodes(harness: Harness) -> list[list[str]]:
    """The node names of every hook call the scheduler makes to fit a pod, in order."""
    calls: list[list[str]] = []
    real = harness.plugins.fit_nodes

    def fit_nodes(
        kind: str, pod: Pod, requests: Sequence[ContainerRequest | None], nodes: Sequence[NodeView], policy: Any
    ) -> list[NodeFit]:
        calls.append([n.name for n in nodes])
        return real(kind, pod, requests, nodes, policy)

    harness.plugins.fit_nodes = fit_nodes  # type: ignore[method-assign]
    return calls


def not_reusable(harness: Harness) -> None:
    """NVIDIA as a vendor that does not declare its fits reusable."""
    real = harness.plugins.kind

    def kind(word: str) -> DeviceKind:
        return real(word).model_copy(update={"reusable_fits": False})

    harness.plugins.kind = kind  # type: ignore[method-assign]


@pytest.fixture
def cluster(harness: Harness) -> Harness:
    for name in NODES:
        harness.add_node(gpu_node(name, gpus=2))
    return harness.start()


def test_a_pod_alike_is_fitted_only_on_the_node_the_previous_one_changed(cluster: Harness) -> None:
    calls = fitted_nodes(cluster)
    cluster.add_pod(gpu_pod("first", mem=1000))
    first = cluster.filter("first")["NodeNames"][0]
    assert len(calls[-1]) == 16  # binpack compares a batch
    cluster.flush()
    cluster.add_pod(gpu_pod("second", mem=1000))  # another name, the same spec
    assert cluster.filter("second")["NodeNames"] == [first]  # binpack: the node the first pod made fullest
    assert calls[-1] == [first]  # the other 15 fits still hold


def test_a_pod_that_differs_in_anything_but_its_name_is_fitted_afresh(cluster: Harness) -> None:
    calls = fitted_nodes(cluster)
    cluster.add_pod(gpu_pod("first", mem=1000))
    cluster.filter("first")
    cluster.flush()
    cluster.add_pod(gpu_pod("other", mem=1000, annotations={"example.com/team": "a"}))
    cluster.filter("other")
    assert len(calls[-1]) == 16
    cluster.add_pod(gpu_pod("bigger", mem=2000))
    cluster.filter("bigger")
    assert len(calls[-1]) == 16


def test_a_node_whose_devices_change_is_fitted_afresh_and_its_new_state_holds(cluster: Harness) -> None:
    calls = fitted_nodes(cluster)
    cluster.add_pod(gpu_pod("first", mem=1000))
    first = cluster.filter("first")["NodeNames"][0]
    cluster.flush()
    # a cordon on both GPUs of the node binpack would take next: its fit must be redone, and it must refuse
    cordon = f"GPU-{first}-0,GPU-{first}-1"
    cluster.cluster.patch_metadata("nodes", first, annotations={CORDON_ANNOTATION: cordon})
    cluster.flush()
    cluster.add_pod(gpu_pod("second", mem=1000))
    answer = cluster.filter("second")
    assert first in calls[-1]
    assert answer["NodeNames"]
    assert answer["NodeNames"] != [first]


def test_a_vendor_that_does_not_declare_reusable_fits_is_asked_every_time(harness: Harness) -> None:
    for name in NODES:
        harness.add_node(gpu_node(name, gpus=2))
    not_reusable(harness)
    harness.start()
    calls = fitted_nodes(harness)
    for name in ("first", "second", "third"):
        harness.add_pod(gpu_pod(name, mem=1000))
        harness.filter(name)
        harness.flush()
    assert [len(c) for c in calls] == [16, 16, 16]


def decisions(harness: Harness, reusable: bool) -> tuple[list[tuple[str, str]], int]:
    """Where 40 pods of four shapes go, one after another, and the devices each gets; and how many node fits
    the vendor was asked for."""
    for name in NODES[:6]:
        harness.add_node(gpu_node(name, gpus=2, memory=4000))
    if not reusable:
        not_reusable(harness)
    harness.start()
    calls = fitted_nodes(harness)
    shapes: list[dict[str, Any]] = [
        {"mem": 1000},
        {"mem": 3000, "cores": 30},
        {"gpu": 2, "mem": 500},
        {"mem": 1000, "annotations": {"hami.io/gpu-scheduler-policy": "binpack"}},
    ]
    out = []
    for i in range(40):
        name = f"p{i}"
        harness.add_pod(gpu_pod(name, **shapes[i % len(shapes)]))
        nodes = harness.filter(name)["NodeNames"]
        harness.flush()
        allocated = (meta(harness.cluster.get("pods", name, "default")).get("annotations") or {}).get(
            "hami.io/vgpu-devices-allocated", ""
        )
        out.append((nodes[0] if nodes else "", allocated))
    return out, sum(len(c) for c in calls)


def test_reused_fits_decide_exactly_as_fresh_ones() -> None:
    with_reuse, without = Harness(), Harness()
    try:
        got, asked = decisions(with_reuse, reusable=True)
        want, asked_without = decisions(without, reusable=False)
    finally:
        with_reuse.stop()
        without.stop()
    assert got == want
    assert sum(1 for node, _ in got if node) > 20  # most placed, some refused once the cards fill
    assert any(not node for node, _ in got)
    assert asked < asked_without * 0.75, (asked, asked_without)
