"""GetPreferredAllocation under `hami.io/numa-alignment`, as the kubelet calls it: the daemon in a thread, the fake
kubelet over its unix socket offering every device or (its Topology Manager, `single-numa-node`) only those of one
NUMA node. Four scripted devices, each split in four: SCR-0 and SCR-2 on NUMA node 0, SCR-1 and SCR-3 on node 1."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from node_harness import NODE, DaemonThread, dev, place_pod, pod_annotations, scripted_devices, write_script

from hami.cluster import MemoryCluster
from hami.model import Pod
from hami.node.preferred import MisalignedError, aligned_preference
from hami.scheduler.extender import BIND_PHASE
from hami.testing.kubelet import FakeKubelet, PluginCallError

RESOURCE = "scripted.example/accel"
ALIGN = "hami.io/numa-alignment"
NUMA_0 = [dev("SCR-0"), dev("SCR-2")]


@pytest.fixture
def ready(start_daemon: Callable[..., DaemonThread], kubelet: FakeKubelet, script: Path) -> DaemonThread:
    write_script(script, {"Scripted": scripted_devices(4)})
    daemon = start_daemon()
    kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 16)
    return daemon


def placed_on_numa_0(cluster: MemoryCluster, alignment: str | None) -> None:
    place_pod(cluster, NODE, "p", {"Scripted": [NUMA_0]})
    if alignment is not None:
        cluster.patch_metadata("pods", "p", "default", annotations={ALIGN: alignment})


def offered(kubelet: FakeKubelet, numa_node: int | None = None) -> list[str]:
    return [d.id for d in kubelet.devices(RESOURCE) or [] if numa_node is None or numa_node in d.numa]


def cards(ids: list[str]) -> list[str]:
    return sorted(i.rsplit("-", 1)[0] for i in ids)


def test_without_the_annotation_the_answer_is_todays_distinct_cards_first(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    placed_on_numa_0(cluster, None)
    assert cards(kubelet.client(RESOURCE).preferred_allocation(offered(kubelet), [], 2)) == ["SCR-0", "SCR-1"]


@pytest.mark.parametrize("alignment", ["best-effort", "strict"])
def test_an_aligned_pod_is_answered_with_the_devices_the_scheduler_placed(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster, alignment: str
) -> None:
    placed_on_numa_0(cluster, alignment)
    assert cards(kubelet.client(RESOURCE).preferred_allocation(offered(kubelet), [], 2)) == ["SCR-0", "SCR-2"]


def test_strict_fails_the_admission_when_the_topology_manager_offers_another_numa_node(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    placed_on_numa_0(cluster, "strict")
    with pytest.raises(PluginCallError) as refused:
        kubelet.start_container(RESOURCE, 2, numa_node=1)
    assert refused.value.method == "GetPreferredAllocation"
    assert refused.value.code == "FAILED_PRECONDITION"
    assert refused.value.details == (
        "pod default/p container c0 asks hami.io/numa-alignment: strict, and the kubelet offers only devices on "
        "NUMA node 1 (where its Topology Manager put the container's CPUs), none on SCR-0, SCR-2, which the "
        "scheduler placed it on: not starting it misaligned. Create the pod again so the scheduler places it anew "
        "(with best-effort it would start misaligned)"
    )
    assert pod_annotations(cluster, "p")[BIND_PHASE] == "allocating"  # never allocated: nothing to undo


def test_strict_starts_the_container_on_its_numa_node(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    placed_on_numa_0(cluster, "strict")
    edits = kubelet.start_container(RESOURCE, 2, numa_node=0)
    assert edits.env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-0,SCR-2"
    assert pod_annotations(cluster, "p")[BIND_PHASE] == "success"


@pytest.mark.parametrize("alignment", ["best-effort", "sideways"])
def test_best_effort_or_an_unreadable_value_keeps_the_kubelets_choice_and_serves_the_placement(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster, alignment: str
) -> None:
    placed_on_numa_0(cluster, alignment)
    assert cards(kubelet.client(RESOURCE).preferred_allocation(offered(kubelet, 1), [], 2)) == ["SCR-1", "SCR-3"]
    edits = kubelet.start_container(RESOURCE, 2, numa_node=1)
    assert edits.env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-0,SCR-2"  # Allocate serves what the scheduler placed
    assert pod_annotations(cluster, "p")[BIND_PHASE] == "success"


# ---------------------------------------------------------------------------------- the rule alone

PHYSICAL = {f"SCR-{d}-{i}": f"SCR-{d}" for d in range(4) for i in range(4)}
NUMA = {advertised: int(device[-1]) % 2 for advertised, device in PHYSICAL.items()}
STRICT = Pod(name="p", uid="u", annotations={ALIGN: "strict"})


def test_the_ids_the_kubelet_must_include_come_first_and_count_for_their_device() -> None:
    available = sorted(PHYSICAL)
    got = aligned_preference(STRICT, "c", tuple(NUMA_0), available, ["SCR-2-3"], 2, PHYSICAL, NUMA)
    assert got == ["SCR-2-3", "SCR-0-0"]


def test_must_include_off_the_placement_leaves_the_answer_to_the_daemon() -> None:
    available = sorted(PHYSICAL)
    assert aligned_preference(STRICT, "c", tuple(NUMA_0), available, ["SCR-1-0"], 2, PHYSICAL, NUMA) is None


def test_a_placement_of_another_size_than_asked_leaves_the_answer_to_allocate() -> None:
    assert aligned_preference(STRICT, "c", tuple(NUMA_0), sorted(PHYSICAL), [], 3, PHYSICAL, NUMA) is None


def test_strict_names_each_placed_device_the_kubelet_does_not_offer() -> None:
    available = [i for i in PHYSICAL if PHYSICAL[i] in ("SCR-0", "SCR-1")]  # node 0's SCR-0, node 1's SCR-1
    with pytest.raises(MisalignedError, match=r"offers only devices on NUMA nodes 0, 1 .* none on SCR-2, which"):
        aligned_preference(STRICT, "c", tuple(NUMA_0), available, [], 2, PHYSICAL, NUMA)
