"""Preemption by device share on the real control plane (docs/preemption.md): kube-apiserver with PriorityClasses
and the Eviction API, the chart's kube-scheduler (preemptVerb answered by HAMi) and `hami scheduler` with
`scheduler.preemption.enabled` as the chart sets it, one node of 8 × 40 GiB fake GPUs added for this module.

The time from the preemptor's creation to its Running is printed (`-s` shows it) as a measured figure, never
asserted against a bound.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from control_plane import wait_until
from hami_stack import GpuNode, HamiStack, build_fake_nvml, gpu_box
from kube_rest import ApiError, KubeApi

from hami.codec import decode_pod_devices

pytestmark = pytest.mark.e2e

GIB = 1024
ALLOCATED = "hami.io/vgpu-devices-allocated"
HOLD = "hami.io/preemption-hold"
NODE = "gpu-node-8"


@pytest.fixture(scope="module")
def big_node(stack: HamiStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuNode]:
    """Eight 40 GiB GPUs (the session's nodes have 16 GiB cards: a 20 or 30 GiB pod fits only here)."""
    library = build_fake_nvml(tmp_path_factory.mktemp("nvml8"))
    node = stack.add_gpu_node(NODE, gpu_box("p8", 8, name="NVIDIA A100-SXM4-40GB", memory_mib=40 * GIB), library)
    assert isinstance(node, GpuNode)
    for name, value, policy in (
        ("e2e-low", 100, None),
        ("e2e-high", 100000, None),
        ("e2e-high-never", 100000, "Never"),
    ):
        body: dict[str, Any] = {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value,
        }  # fmt: skip
        if policy:
            body["preemptionPolicy"] = policy
        try:
            stack.admin.create(body)
        except ApiError as exc:
            if exc.status != 409:
                raise
    yield node
    node.stop()
    stack.nodes.pop(NODE, None)
    stack.admin.delete("Node", NODE)


def pod(name: str, namespace: str, mem: int, priority: str, card: str | None = None, **labels: str) -> dict[str, Any]:
    annotations = {"nvidia.com/use-gpuuuid": card} if card else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations, "labels": labels},
        "spec": {
            "priorityClassName": priority,
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvidia/cuda:12.4.1-base",
                    "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem)}},
                }
            ],
            "terminationGracePeriodSeconds": 1,
        },
    }


def fill(stack: HamiStack, node: GpuNode, ns: str, sizes: list[list[int]], **labels: str) -> dict[str, str]:
    """Low-priority pods pinned card by card (`sizes[i]`: the GiB of each pod on card i); name → card UUID."""
    cards: dict[str, str] = {}
    for i, card_sizes in enumerate(sizes):
        for j, gib in enumerate(card_sizes):
            name = f"low-{i}-{j}-{gib}g"
            stack.admin.create(pod(name, ns, gib * GIB, "e2e-low", node.uuids[i], **labels))
            cards[name] = node.uuids[i]
    for name in cards:
        stack.wait_running(ns, name, 90)
    return cards


def names(api: KubeApi, ns: str) -> set[str]:
    return {p["metadata"]["name"] for p in api.list("Pod", ns)["items"] if not p["metadata"].get("deletionTimestamp")}


def card_of(api: KubeApi, ns: str, name: str) -> str:
    value = api.get("Pod", name, ns)["metadata"]["annotations"][ALLOCATED]
    return decode_pod_devices(value)[0][0].uuid


def test_a_high_priority_pod_evicts_exactly_the_minimal_set_on_one_card_and_runs_there(
    stack: HamiStack, big_node: GpuNode, ns: str
) -> None:
    # every card full (40 GiB); freeing 30 GiB takes two pods anywhere but card 3, where its 32 GiB pod alone does
    sizes = [[20, 12, 8], [20, 12, 8], [24, 8, 8], [32, 4, 4], [16, 16, 8], [20, 12, 8], [24, 8, 8], [20, 20]]
    cards = fill(stack, big_node, ns, sizes)
    created = time.monotonic()
    stack.admin.create(pod("urgent", ns, 30 * GIB, "e2e-high"))
    wait_until(lambda: HOLD in (stack.admin.get("Pod", "urgent", ns)["metadata"].get("annotations") or {}), 60,
               "the preemptor's hold", lambda: stack.describe_pod(ns, "urgent"))  # fmt: skip
    # a low-priority pod arriving while the victim leaves: 20 GiB fits nowhere but in the room being freed
    stack.admin.create(pod("sneaky", ns, 20 * GIB, "e2e-low"))
    stack.wait_running(ns, "urgent", 120)
    took = time.monotonic() - created
    print(f"\npreemptor created -> Running: {took:.2f} s")
    assert names(stack.admin, ns) == (set(cards) - {"low-3-0-32g"}) | {"urgent", "sneaky"}
    assert card_of(stack.admin, ns, "urgent") == big_node.uuids[3]
    preempted = [e["message"] for e in stack.admin.events_about(ns, "low-3-0-32g") if e["reason"] == "Preempted"]
    assert preempted
    assert f"{ns}/urgent" in preempted[0]
    preempting = [e["message"] for e in stack.admin.events_about(ns, "urgent") if e["reason"] == "Preempting"]
    assert preempting
    assert f"{ns}/low-3-0-32g" in preempting[0]
    time.sleep(2)
    sneaky = stack.admin.get("Pod", "sneaky", ns)
    assert sneaky["status"].get("phase") == "Pending", sneaky["status"]
    assert not sneaky["spec"].get("nodeName")
    assert "hami_scheduler_preemption_victims_total 1.0" in stack.scheduler_metrics()


def test_preemption_policy_never_evicts_nobody(stack: HamiStack, big_node: GpuNode, ns: str) -> None:
    cards = fill(stack, big_node, ns, [[40]] * 8)
    stack.admin.create(pod("patient", ns, 30 * GIB, "e2e-high-never"))
    time.sleep(6)
    assert names(stack.admin, ns) == set(cards) | {"patient"}
    assert stack.admin.get("Pod", "patient", ns)["status"].get("phase") == "Pending"


def test_a_budget_that_forbids_the_eviction_is_honoured(stack: HamiStack, big_node: GpuNode, ns: str) -> None:
    cards = fill(stack, big_node, ns, [[40]] * 8, app="batch")
    stack.admin.create({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "batch", "namespace": ns},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "batch"}}},
    })  # fmt: skip
    stack.admin.create(pod("blocked", ns, 30 * GIB, "e2e-high"))
    time.sleep(6)
    assert names(stack.admin, ns) == set(cards) | {"blocked"}
    blocked = stack.admin.get("Pod", "blocked", ns)
    assert blocked["status"].get("phase") == "Pending"
    assert HOLD not in (blocked["metadata"].get("annotations") or {})
