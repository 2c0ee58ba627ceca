"""Fitting and scoring NVIDIA pods onto the nodes discovery reported: selectors, device policies, NUMA binding,
GPU modes, topology-aware choices on the H100 box's NVLink table, and MIG profile and placement choices."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

import hami_vendor_nvidia.plugin as plugin
from hami.codec import (
    MigReservation,
    decode_mig_allocations,
    decode_node_register,
    encode_mig_allocations,
    encode_node_register,
)
from hami.model import (
    Container,
    ContainerRequest,
    DeviceUsage,
    NodeFit,
    NodeInventory,
    NodeView,
    PlacedPod,
    Pod,
    SchedulingPolicy,
)
from hami.plugins import VendorPlugins
from hami.topology import best_connected, least_connected
from hami_vendor_nvidia.fit import NvidiaFitter
from hami_vendor_nvidia.mig import MIG_ALLOCATIONS_ANNOTATION, MIG_INSTANCES_ANNOTATION, Placement

NodeFactory = Callable[..., Any]
Usage = Mapping[int, tuple[int, int, int]]
"""GPU index → (containers, MiB, cores) already used."""


def discovered(gpu_node: NodeFactory, box: dict[str, Any]) -> NodeInventory:
    (found,) = gpu_node(box).plugins().discover()["nvidia"]
    return found


def view(inventory: NodeInventory, usage: Usage | None = None, name: str = "node", **annotations: str) -> NodeView:
    """The node as the scheduler sees it: the devices as the register annotation carries them, with usage."""
    devices = decode_node_register(encode_node_register(inventory.devices))
    used = usage or {}
    return NodeView(
        name=name,
        devices=[
            DeviceUsage(
                device=d,
                used=used.get(d.index, (0, 0, 0))[0],
                usedmem=used.get(d.index, (0, 0, 0))[1],
                usedcores=used.get(d.index, (0, 0, 0))[2],
            )
            for d in devices
        ],
        annotations={**inventory.annotations, **annotations},
    )


def want(count: int, memory: int = 0, cores: int = 0, percentage: int | None = None) -> ContainerRequest:
    return ContainerRequest(kind="NVIDIA", count=count, memory=memory, cores=cores, memory_percentage=percentage)


def fit(
    node: NodeView,
    *requests: ContainerRequest | None,
    annotations: Mapping[str, str] | None = None,
    device: Sequence[str] = ("spread",),
) -> NodeFit:
    plugins = VendorPlugins.from_plugins({"nvidia": plugin})
    containers = tuple(Container(name=f"c{i}") for i in range(len(requests)))
    pod = Pod(name="p", uid="uid-p", annotations=dict(annotations or {}), containers=containers)
    (result,) = plugins.fit_nodes("NVIDIA", pod, list(requests), [node], SchedulingPolicy(device=tuple(device)))
    return result


def indexes(result: NodeFit, node: NodeView, container: int = 0) -> list[int]:
    assert result.placement is not None, result.reason
    by_id = {u.device.id: u.device.index for u in node.devices}
    return [by_id[d.uuid] for d in result.placement[container]]


@pytest.fixture
def mixed(gpu_node: NodeFactory, boxes: Any) -> NodeInventory:
    return discovered(gpu_node, boxes.mixed())


@pytest.fixture
def h100(gpu_node: NodeFactory, boxes: Any) -> NodeInventory:
    return discovered(gpu_node, boxes.h100())


@pytest.fixture
def a100(gpu_node: NodeFactory, boxes: Any) -> NodeInventory:
    return discovered(gpu_node, boxes.a100_mig())


# --------------------------------------------------------------------------------------------------------
# Selectors
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({"nvidia.com/use-gputype": "V100"}, [3]),  # equal scores: HAMi's highest index
        ({"nvidia.com/use-gputype": "a100,t4"}, [1]),  # case-insensitive substrings, any of a list
        ({"nvidia.com/nouse-gputype": "V100"}, [1]),
        ({"nvidia.com/nouse-gputype": "tesla"}, None),
    ],
)
def test_type_selectors_pick_by_model_substring(
    mixed: NodeInventory, annotations: dict[str, str], expected: list[int] | None
) -> None:
    node = view(mixed)
    result = fit(node, want(1, 1000), annotations=annotations, device=("binpack",))
    if expected is None:
        assert not result.fits
        assert "type excluded" in result.reason
    else:
        assert indexes(result, node) == expected


def test_uuid_selectors_pick_exact_gpus(mixed: NodeInventory) -> None:
    node = view(mixed)
    uuids = [d.id for d in mixed.devices]
    chosen = fit(node, want(1, 1000), annotations={"nvidia.com/use-gpuuuid": f"{uuids[3]},GPU-elsewhere"})
    assert indexes(chosen, node) == [3]
    avoided = fit(node, want(1, 1000), annotations={"nvidia.com/nouse-gpuuuid": ",".join(uuids[1:])})
    assert indexes(avoided, node) == [0]
    none = fit(node, want(1, 1000), annotations={"nvidia.com/use-gpuuuid": "GPU-elsewhere"})
    assert not none.fits
    assert "4 not in use-uuid list" in none.reason


def test_cordoned_gpus_are_skipped(mixed: NodeInventory) -> None:
    node = view(mixed, **{"hami.io/device-cordon": mixed.devices[2].id})
    assert indexes(fit(node, want(1, 20000)), node) == [3]


# --------------------------------------------------------------------------------------------------------
# Device policies
# --------------------------------------------------------------------------------------------------------


def test_binpack_fills_the_busiest_gpu_and_spread_the_emptiest(mixed: NodeInventory) -> None:
    node = view(mixed, {0: (2, 8000, 40), 3: (1, 2000, 10)})
    assert indexes(fit(node, want(1, 3000, 20), device=("binpack",)), node) == [0]
    assert indexes(fit(node, want(1, 3000, 20), device=("spread",)), node) == [2]


def test_mutex_and_exclusive_requests_take_only_idle_gpus(mixed: NodeInventory) -> None:
    node = view(mixed, {0: (1, 1000, 10), 1: (1, 1000, 10), 2: (1, 1000, 10)})
    assert indexes(fit(node, want(1, 1000), device=("binpack", "mutex")), node) == [3]
    assert indexes(fit(node, want(1, percentage=100, cores=100), device=("binpack",)), node) == [3]
    refused = fit(node, want(2, percentage=100, cores=100))
    assert not refused.fits
    assert "3 not idle (exclusive use asked)" in refused.reason


def test_containers_of_one_pod_see_each_others_grants(mixed: NodeInventory) -> None:
    node = view(mixed)
    result = fit(node, want(1, 30000), want(1, 30000), annotations={"nvidia.com/use-gputype": "V100"})
    assert indexes(result, node, 0) != indexes(result, node, 1)


# --------------------------------------------------------------------------------------------------------
# NUMA binding
# --------------------------------------------------------------------------------------------------------

NUMA_BIND = {"nvidia.com/numa-bind": "true"}


def test_numa_bind_keeps_a_containers_gpus_on_one_numa_node(mixed: NodeInventory) -> None:
    node = view(mixed, {0: (10, 1000, 10)})  # T4 #0 has no free slot: NUMA node 0 has one usable GPU
    assert indexes(fit(node, want(2, 1000), annotations=NUMA_BIND), node) == [3, 2]  # HAMi's walk: index down


def test_numa_bind_refuses_a_node_where_no_numa_node_has_enough(mixed: NodeInventory) -> None:
    node = view(mixed, {0: (10, 1000, 10), 3: (10, 1000, 10)})
    assert fit(node, want(2, 1000)).fits  # without binding, one T4 and one V100 do
    refused = fit(node, want(2, 1000), annotations=NUMA_BIND)
    assert not refused.fits
    assert "nvidia.com/numa-bind asks for 2 GPUs on one NUMA node" in refused.reason


def test_numa_bind_false_does_not_bind(mixed: NodeInventory) -> None:
    node = view(mixed, {0: (10, 1000, 10), 3: (10, 1000, 10)})
    assert fit(node, want(2, 1000), annotations={"nvidia.com/numa-bind": "false"}).fits


# --------------------------------------------------------------------------------------------------------
# GPU modes
# --------------------------------------------------------------------------------------------------------


def test_vgpu_mode_limits_the_gpus_a_pod_may_use(mixed: NodeInventory, a100: NodeInventory) -> None:
    shared, mig = view(mixed), view(a100)
    assert fit(shared, want(1, 1000), annotations={"nvidia.com/vgpu-mode": "hami-core"}).fits
    refused = fit(shared, want(1, 1000), annotations={"nvidia.com/vgpu-mode": "mig"})
    assert refused.reason == "no GPU in mig mode"
    refused = fit(mig, want(1, 1000), annotations={"nvidia.com/vgpu-mode": "hami-core"})
    assert refused.reason == "no GPU in hami-core mode"
    assert fit(mig, want(1, 1000)).fits  # no mode asked: MIG instances serve it


# --------------------------------------------------------------------------------------------------------
# Topology-aware choices (the H100 box: bridges 0-1 and 4-5 of 12 links, 2-3 of 6, 6-7 of 4)
# --------------------------------------------------------------------------------------------------------

TOPOLOGY = ("spread", "topology-aware")


def test_one_gpu_takes_the_card_whose_removal_keeps_the_best_links_free(h100: NodeInventory) -> None:
    node = view(h100)
    assert indexes(fit(node, want(1, 1000), device=TOPOLOGY), node) == [7]  # the 4-link pair is the weakest; 7 first
    assert indexes(fit(node, want(1, 1000)), node) == [7]  # spread alone: HAMi's highest NUMA node and index


def test_several_gpus_take_the_best_connected_set(h100: NodeInventory) -> None:
    node = view(h100)
    assert sorted(indexes(fit(node, want(2, 1000), device=TOPOLOGY), node)) in ([0, 1], [4, 5])  # 12 links
    assert sorted(indexes(fit(node, want(4, 1000), device=TOPOLOGY), node)) == [0, 1, 4, 5]


def test_topology_choice_works_among_usable_gpus_only(h100: NodeInventory) -> None:
    busy = view(h100, {0: (10, 1000, 10)})  # GPU 0 full: its bridge partner is no use to a pair
    assert sorted(indexes(fit(busy, want(2, 1000), device=TOPOLOGY), busy)) == [4, 5]
    partly = view(h100, {5: (1, 4000, 20)})
    assert indexes(fit(partly, want(2, 1000)), partly) == [7, 6]  # spread alone: the idle GPUs, index down
    partly = view(h100, {7: (1, 4000, 20)})
    assert indexes(fit(partly, want(2, 1000)), partly) == [6, 5]  # spread alone splits two bridged pairs
    assert sorted(indexes(fit(partly, want(2, 1000), device=TOPOLOGY), partly)) in ([0, 1], [4, 5])


def test_topology_with_numa_binding_takes_the_best_set_within_one_numa_node(h100: NodeInventory) -> None:
    node = view(h100)
    result = fit(node, want(4, 1000), annotations=NUMA_BIND, device=TOPOLOGY)
    assert sorted(indexes(result, node)) == [0, 1, 2, 3]


def test_a_node_without_link_scores_is_served_by_the_device_policy(h100: NodeInventory) -> None:
    bare = h100.model_copy(update={"annotations": {}, "link_scores": {}})
    node = view(bare)
    assert indexes(fit(node, want(1, 1000), device=TOPOLOGY), node) == [7]  # spread: HAMi's order


def test_topology_building_blocks_on_a_pair_table() -> None:
    scores = {
        "a": {"b": 100, "c": 10, "d": 10},
        "b": {"a": 100, "c": 10, "d": 10},
        "c": {"a": 10, "b": 10, "d": 40},
        "d": {"a": 10, "b": 10, "c": 40},
    }
    assert least_connected(["a", "b", "c", "d"], scores) == "c"
    assert best_connected(["a", "b", "c", "d"], 2, scores) == ("a", "b")
    assert best_connected(["c", "d", "a"], 2, scores) == ("c", "d")
    assert best_connected(["a", "b", "c", "d"], 3, scores) == ("a", "b", "c")


# --------------------------------------------------------------------------------------------------------
# MIG profiles and placements (two A100-40GB; GPU 1 holds a 1g.5gb instance at slice 6)
# --------------------------------------------------------------------------------------------------------

MIG = {"nvidia.com/vgpu-mode": "mig"}


def granted(result: NodeFit, container: int = 0) -> list[tuple[int, int]]:
    assert result.placement is not None, result.reason
    return [(d.usedmem, d.usedcores) for d in result.placement[container]]


@pytest.mark.parametrize(
    ("memory", "profile"),
    [(4000, (4864, 14)), (8000, (9856, 14)), (19000, (19968, 42)), (20000, (40192, 100))],
)
def test_mig_takes_the_smallest_profile_whose_memory_covers_the_request(
    a100: NodeInventory, memory: int, profile: tuple[int, int]
) -> None:
    assert granted(fit(view(a100), want(1, memory), annotations=MIG)) == [profile]


def test_mig_reserves_a_placement_that_keeps_a_half_of_the_card_free(a100: NodeInventory) -> None:
    node = view(a100)
    pod = Pod(name="p", annotations=MIG, containers=(Container(name="a"), Container(name="b")))
    fitter = NvidiaFitter(plugin.KIND, pod, SchedulingPolicy(device=("spread",)))
    result = fitter.fit_node([want(1, 8000), want(1, 8000)], node)
    assert result.fits
    choices = [(c.gpu_uuid, c.profile.name, c.placement.start, c.placement.size) for c in fitter.mig_choices["node"]]
    gpu0, gpu1 = a100.devices[0].id, a100.devices[1].id
    assert choices == [(gpu0, "1g.10gb", 0, 2), (gpu1, "1g.10gb", 4, 2)]  # GPU 1: next to its instance at 6


def test_mig_instances_of_one_pod_do_not_overlap(a100: NodeInventory) -> None:
    node = view(a100)
    pod = Pod(name="p", annotations=MIG, containers=tuple(Container(name=f"c{i}") for i in range(3)))
    fitter = NvidiaFitter(plugin.KIND, pod, SchedulingPolicy(device=("binpack",)))
    assert fitter.fit_node([want(1, 8000)] * 3, node).fits
    on_gpu0 = [c.placement for c in fitter.mig_choices["node"] if c.gpu_uuid == a100.devices[0].id]
    assert len(on_gpu0) == 3
    assert all(not a.overlaps(b) for i, a in enumerate(on_gpu0) for b in on_gpu0[i + 1 :])


def test_a_whole_gpu_in_mig_mode_is_the_largest_profile_on_an_idle_gpu(a100: NodeInventory) -> None:
    node = view(a100)
    result = fit(node, want(1, percentage=100, cores=100), annotations=MIG)
    assert indexes(result, node) == [0]  # GPU 1's instance at slice 6 leaves no room for 7g.40gb
    assert granted(result) == [(40192, 100)]


def test_mig_placements_taken_on_the_hardware_are_respected(a100: NodeInventory) -> None:
    gpu0, gpu1 = a100.devices[0].id, a100.devices[1].id
    full = (
        f'[{{"gpuUUID":"{gpu0}","profile":"3g.20gb","placement":{{"start":0,"size":4}}}},'
        f'{{"gpuUUID":"{gpu0}","profile":"3g.20gb","placement":{{"start":4,"size":4}}}},'
        f'{{"gpuUUID":"{gpu1}","profile":"7g.40gb","placement":{{"start":0,"size":8}}}}]'
    )
    node = view(a100, **{MIG_INSTANCES_ANNOTATION: full})
    refused = fit(node, want(1, 1000), annotations=MIG)
    assert not refused.fits
    assert "2 no free MIG placement large enough" in refused.reason


def test_a_gpu_with_reservations_the_node_has_not_reported_takes_no_new_instance(a100: NodeInventory) -> None:
    node = view(a100, {0: (1, 9856, 14)})  # a pod was placed on GPU 0; its instance is not reported yet
    result = fit(node, want(1, 4000), annotations=MIG)
    assert indexes(result, node) == [1]
    both = view(a100, {0: (1, 9856, 14), 1: (2, 9856, 14)})
    refused = fit(both, want(1, 4000), annotations=MIG)
    assert not refused.fits
    assert "MIG reservations not yet reported by the node" in refused.reason


def test_pod_reservations_count_as_occupied_when_the_scheduler_passes_them(a100: NodeInventory) -> None:
    gpu0 = a100.devices[0].id
    node = view(a100, {0: (1, 19968, 42)})
    reserved = encode_mig_allocations([MigReservation(0, 0, gpu0, "3g.20gb", 4, 4)])
    pod = Pod(name="p", annotations={**MIG, "nvidia.com/use-gpuuuid": gpu0}, containers=(Container(name="a"),))
    fitter = NvidiaFitter(plugin.KIND, pod, SchedulingPolicy())
    result = fitter.fit_mig([want(1, 19000)], node, pods=[{MIG_ALLOCATIONS_ANNOTATION: reserved}])
    assert result.fits
    (choice,) = fitter.mig_choices["node"]
    assert (choice.gpu_uuid, choice.profile.name, choice.placement.start) == (gpu0, "3g.20gb", 0)


def test_mig_refusals_name_the_reason(a100: NodeInventory) -> None:
    refused = fit(view(a100), want(1, 50000), annotations=MIG)
    assert refused.reason == (
        "pod: needs 1 MIG instance on distinct GPUs, 0/2 MIG GPUs usable (2 no free MIG placement large enough)"
    )
    refused = fit(view(a100), want(3, 1000), annotations=MIG)
    assert "needs 3 MIG instances on distinct GPUs, 2/2 MIG GPUs usable" in refused.reason


def test_on_a_node_with_both_kinds_shared_gpus_come_first_then_mig(mixed: NodeInventory, a100: NodeInventory) -> None:
    both = NodeInventory(kind="NVIDIA", devices=mixed.devices + a100.devices, annotations=a100.annotations)
    node = view(both)
    shared = fit(node, want(1, 20000))
    assert indexes(shared, node) == [3]  # a V100 (equal scores: the highest index)
    assert granted(shared) == [(20000, 0)]
    mig = fit(node, want(1, 40000))  # more than any shared GPU has: the whole idle A100 as 7g.40gb
    assert mig.placement is not None
    assert mig.placement[0][0].uuid == a100.devices[0].id
    assert granted(mig) == [(40192, 100)]
    refused = fit(node, want(1, 50000))
    assert refused.reason == (
        "pod: needs 1 NVIDIA device, 0/4 usable (4 insufficient memory); "
        "MIG: pod: needs 1 MIG instance on distinct GPUs, 0/2 MIG GPUs usable (2 no free MIG placement large enough)"
    )


def test_a_mig_fit_carries_its_reservations_as_the_pod_annotation(a100: NodeInventory) -> None:
    node = view(a100)
    result = fit(node, want(1, 8000), want(1, 19000), annotations=MIG, device=("binpack",))
    assert result.placement is not None
    reserved = decode_mig_allocations(result.pod_annotations[MIG_ALLOCATIONS_ANNOTATION])
    gpu0 = a100.devices[0].id
    assert [(r.container_index, r.device_index, r.gpu_uuid, r.profile) for r in reserved] == [
        (0, 0, gpu0, "1g.10gb"),
        (1, 0, gpu0, "3g.20gb"),
    ]
    assert [(d.uuid, d.usedmem) for devices in result.placement for d in devices] == [(gpu0, 9856), (gpu0, 19968)]
    first, second = (Placement(r.start, r.size) for r in reserved)
    assert not first.overlaps(second)


def placed_pod(name: str, reservations: list[MigReservation]) -> PlacedPod:
    return PlacedPod(
        namespace="default", name=name, annotations={MIG_ALLOCATIONS_ANNOTATION: encode_mig_allocations(reservations)}
    )


def test_reservations_of_the_pods_on_the_node_are_occupied(a100: NodeInventory) -> None:
    gpu0 = a100.devices[0].id
    node = view(a100, {0: (2, 9856 + 19968, 28 + 42)})  # two containers counted on GPU 0, no instance reported yet
    node.pods["default/a"] = placed_pod("a", [MigReservation(0, 0, gpu0, "3g.20gb", 0, 4)])
    node.pods["default/b"] = placed_pod("b", [MigReservation(0, 0, gpu0, "2g.10gb", 4, 2)])
    result = fit(node, want(1, 8000), annotations={**MIG, "nvidia.com/use-gpuuuid": gpu0})
    assert result.fits, result.reason  # the counted containers are located: GPU 0 takes a new instance
    (reserved,) = decode_mig_allocations(result.pod_annotations[MIG_ALLOCATIONS_ANNOTATION])
    taken = [Placement(0, 4), Placement(4, 2)]
    assert not any(Placement(reserved.start, reserved.size).overlaps(t) for t in taken)
    assert (reserved.profile, reserved.start) == ("1g.10gb", 6)


def test_a_pod_placed_on_shared_gpus_has_an_earlier_mig_reservation_emptied(mixed: NodeInventory) -> None:
    earlier = encode_mig_allocations([MigReservation(0, 0, "GPU-elsewhere", "1g.5gb", 0, 1)])
    moved = fit(view(mixed), want(1, 1000), annotations={MIG_ALLOCATIONS_ANNOTATION: earlier})
    assert moved.fits
    assert dict(moved.pod_annotations) == {MIG_ALLOCATIONS_ANNOTATION: ""}
    assert dict(fit(view(mixed), want(1, 1000)).pod_annotations) == {}  # nothing to empty, nothing written


def test_an_init_container_is_fitted_apart_from_the_app_containers(gpu_node: NodeFactory, boxes: Any) -> None:
    """Init containers run before the app containers: a GPU holds the larger phase, not the sum (HAMi)."""
    inventory = discovered(gpu_node, boxes.h100())
    size = inventory.devices[0].devmem
    # only GPU 0 has room left: 5000 MiB of it are taken, the others are full
    node = view(inventory, {i: (1, 5000 if i == 0 else size, 0) for i in range(len(inventory.devices))})
    free = size - 5000
    plugins = VendorPlugins.from_plugins({"nvidia": plugin})
    pod = Pod(name="p", uid="uid-p", init_containers=(Container(name="setup"),), containers=(Container(name="main"),))
    requests: list[ContainerRequest | None] = [want(1, free), want(1, free)]
    (result,) = plugins.fit_nodes("NVIDIA", pod, requests, [node], SchedulingPolicy())
    assert result.placement is not None, result.reason
    assert [(d.uuid, d.usedmem) for c in result.placement for d in c] == [(inventory.devices[0].id, free)] * 2
    # as two app containers they run at once, and the second does not fit
    apps = Pod(name="q", uid="uid-q", containers=(Container(name="a"), Container(name="b")))
    (crowded,) = plugins.fit_nodes("NVIDIA", apps, requests, [node], SchedulingPolicy())
    assert crowded.reason.startswith("container b: "), crowded.reason


# hami.io/numa-alignment on MIG GPUs (shared GPUs go through core's `ShareFitter`: tests/scheduler)

ALIGN = "hami.io/numa-alignment"


def on_numa_nodes(node: NodeView, *numa: int) -> NodeView:
    devices = [
        u.model_copy(update={"device": u.device.model_copy(update={"numa": n})})
        for u, n in zip(node.devices, numa, strict=True)
    ]
    return node.model_copy(update={"devices": devices})


def test_mig_strict_alignment_refuses_instances_on_two_numa_nodes(a100: NodeInventory) -> None:
    split = on_numa_nodes(view(a100), 0, 1)
    refused = fit(split, want(2, 1000), annotations={**MIG, ALIGN: "strict"})
    assert "hami.io/numa-alignment: strict asks for 2 MIG GPUs on one NUMA node" in refused.reason
    assert fit(on_numa_nodes(view(a100), 1, 1), want(2, 1000), annotations={**MIG, ALIGN: "strict"}).fits


def test_mig_best_effort_alignment_places_across_numa_nodes_when_it_must(a100: NodeInventory) -> None:
    split = on_numa_nodes(view(a100), 0, 1)
    assert fit(split, want(2, 1000), annotations={**MIG, ALIGN: "best-effort"}).fits


def test_mig_refuses_an_alignment_value_it_cannot_read(a100: NodeInventory) -> None:
    refused = fit(view(a100), want(1, 1000), annotations={**MIG, ALIGN: "yes"})
    assert "hami.io/numa-alignment is 'yes'" in refused.reason
    assert 'write "best-effort"' in refused.reason
