"""An autoscaler's simulation: a filter in the full-Nodes form naming nodes the cluster does not have (a template
node) is answered as HAMi v2.10's `filterSimulation` answers it: the devices read from the Node objects given,
none in use, the best node chosen, nothing counted and nothing written."""

from __future__ import annotations

import copy
from typing import Any

from scheduler_harness import Harness, gpu_node, gpu_pod

from hami.cluster import meta


def world(h: Harness) -> tuple[Any, Any, int]:
    nodes, _ = h.cluster.list("nodes")
    pods, _ = h.cluster.list("pods")
    assert h.service is not None
    return nodes, pods, len(h.service.state.pods)


def template_of(node: dict[str, Any], name: str) -> dict[str, Any]:
    """What a cluster autoscaler builds from a node group's node: the same Node under a name no node has."""
    template = copy.deepcopy(node)
    template["metadata"]["name"] = name
    template["metadata"].setdefault("labels", {})["kubernetes.io/hostname"] = name
    return template


def test_a_template_node_is_fitted_from_the_object_given_and_nothing_is_written(harness: Harness) -> None:
    real = gpu_node("node-a", gpus=1, memory=8000)
    harness.add_node(real)
    harness.add_pod(gpu_pod("big", mem=6000))
    harness.add_pod(gpu_pod("pending", mem=6000))
    harness.start()
    assert harness.filter("big")["NodeNames"] == ["node-a"]  # node-a is full now
    harness.flush()
    assert harness.filter("pending")["FailedNodes"] == {
        "node-a": "needs 1 NVIDIA device with 6000 MiB free, 0/1 of its devices have it"
    }
    before = world(harness)
    pod = harness.cluster.get("pods", "pending", "default")
    template = template_of(real, "template-node-a-upcoming-0")
    status, answer = harness.post("filter", {"Pod": pod, "Nodes": {"items": [template]}})
    assert status == 200
    assert answer["Error"] == ""
    assert answer["FailedNodes"] == {}
    assert answer["NodeNames"] is None
    assert answer["Nodes"]["items"] == [template]  # the Node chosen, as given (HAMi answers a copy of it)
    harness.flush()
    assert world(harness) == before  # no placement, no assumption, no node written or created
    assert "hami.io/vgpu-node" not in (meta(harness.cluster.get("pods", "pending", "default")).get("annotations") or {})


def test_a_simulation_counts_no_pod_and_chooses_the_best_given_node(harness: Harness) -> None:
    """HAMi's simulation reads devices only (`buildTransientNodeInfo`): a real node named beside a template is
    fitted empty too; a node the pod cannot fit on, or one with no device, is refused with its reason."""
    real = gpu_node("node-a", gpus=1, memory=8000)
    harness.add_node(real)
    harness.add_pod(gpu_pod("big", mem=6000))
    harness.add_pod(gpu_pod("pending", mem=6000))
    harness.start()
    assert harness.filter("big")["NodeNames"] == ["node-a"]
    harness.flush()
    before = world(harness)
    pod = harness.cluster.get("pods", "pending", "default")
    small = template_of(gpu_node("small", gpus=1, memory=4000), "template-small")
    cpu_only = {"metadata": {"name": "template-cpu"}, "status": {"allocatable": {"cpu": "8"}}}
    items = [real, small, cpu_only]
    status, answer = harness.post("filter", {"Pod": pod, "Nodes": {"items": items}})
    assert status == 200
    assert [meta(n)["name"] for n in answer["Nodes"]["items"]] == ["node-a"]
    assert answer["FailedNodes"] == {
        "template-small": "needs 1 NVIDIA device with 6000 MiB free, 0/1 of its devices have it",
        "template-cpu": "no NVIDIA devices registered",
    }
    harness.flush()
    assert world(harness) == before


def test_a_template_node_is_read_without_its_handshake(harness: Harness) -> None:
    """A template copied from a node whose question expired still has devices to simulate (HAMi reads none)."""
    real = gpu_node("node-a", gpus=1)
    real["metadata"]["annotations"]["hami.io/node-handshake"] = "Deleted_2020-01-01 00:00:00"
    harness.add_node(gpu_node("node-b", gpus=1))
    harness.add_pod(gpu_pod("p"))
    harness.start()
    pod = harness.cluster.get("pods", "p", "default")
    status, answer = harness.post("filter", {"Pod": pod, "Nodes": {"items": [template_of(real, "template-a")]}})
    assert status == 200
    assert [meta(n)["name"] for n in answer["Nodes"]["items"]] == ["template-a"]


def test_a_malformed_template_node_is_a_400_naming_the_field(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a"))
    harness.add_pod(gpu_pod("p"))
    harness.start()
    pod = harness.cluster.get("pods", "p", "default")
    bad = template_of(gpu_node("node-a"), "template-a")
    bad["metadata"]["annotations"] = ["not", "a", "map"]
    status, answer = harness.post("filter", {"Pod": pod, "Nodes": {"items": [bad]}})
    assert status == 400
    assert "Nodes.items.0.metadata.annotations" in answer["Error"]


def test_a_full_node_list_of_known_nodes_is_an_ordinary_filter(harness: Harness) -> None:
    """kube-scheduler with `nodeCacheCapable: false` sends the full form for the cluster's own nodes: decided and
    written as any filter."""
    real = gpu_node("node-a")
    harness.add_node(real)
    harness.add_pod(gpu_pod("p"))
    harness.start()
    pod = harness.cluster.get("pods", "p", "default")
    status, answer = harness.post("filter", {"Pod": pod, "Nodes": {"items": [real]}})
    assert status == 200
    assert [meta(n)["name"] for n in answer["Nodes"]["items"]] == ["node-a"]
    harness.flush()
    assert meta(harness.cluster.get("pods", "p", "default"))["annotations"]["hami.io/vgpu-node"] == "node-a"
