"""The Kunlunxin plugin: the conformance kit, HAMi's vXPU requests and admission, and its choice of XPUs.

Cases from HAMi v2.10's ``pkg/device/kunlun`` tests (``vdevice_test.go``: trimMemory, GenerateResourceRequests,
MutateAdmission; ``topo_test.go``: devicepick, graghSelect, interconnect) and the rules of ``FitVXPU``.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.model import (
    Container,
    ContainerRequest,
    Device,
    DeviceUsage,
    NodeView,
    Pod,
    RegisterFormat,
    SchedulingPolicy,
)
from hami.plugins import VendorPlugins
from hami.testing.conformance import RequestCase, VendorFixture, pytest_suite
from hami_vendor_kunlun import plugin
from hami_vendor_kunlun.topology import CROSS_PAIRS, CROSS_QUADS, bonus, select

COUNT, MEMORY, WHOLE = "kunlunxin.com/vxpu", "kunlunxin.com/vxpu-memory", "kunlunxin.com/xpu"


def req(count: int = 1, memory: int = 98304) -> ContainerRequest:
    return ContainerRequest(kind="XPU", count=count, memory=memory, cores=memory * 100 // 98304)


REQUESTS = [
    RequestCase("XPU", {COUNT: "1"}, req()),  # no memory: the whole XPU
    RequestCase("XPU", {COUNT: "1", MEMORY: "24576"}, req(memory=24576)),
    RequestCase("XPU", {COUNT: "2", MEMORY: "3000"}, req(count=2, memory=24576)),  # rounded up to a quarter
    RequestCase("XPU", {COUNT: "1", MEMORY: "24577"}, req(memory=49152)),
    RequestCase("XPU", {COUNT: "1", MEMORY: "0"}, req(memory=24576)),  # HAMi's trimMemory(0): a quarter
    RequestCase("XPU", {COUNT: "1", MEMORY: "200000"}, req()),
    RequestCase("XPU", {COUNT: "0", MEMORY: "24576"}, None),
    RequestCase("XPU", {MEMORY: "24576"}, None),  # HAMi asks for XPUs only with kunlunxin.com/vxpu
    RequestCase("XPU", {COUNT: "1", MEMORY: "24Gi"}, "write 24576"),
    RequestCase("XPU", {COUNT: "one"}, "plain non-negative integer"),
    RequestCase("kunlun", {WHOLE: "2"}, ContainerRequest(kind="kunlun", count=2, memory_percentage=100, cores=100)),
    RequestCase("kunlun", {WHOLE: "0"}, None),
    RequestCase("kunlun", {COUNT: "1"}, None),
]


def xpu(node: str, i: int, used: int = 0, usedmem: int = 0, health: bool = True) -> DeviceUsage:
    device = Device(id=f"{node}-xpu-{i}", index=i, count=4, devmem=98304, devcore=100, type="XPU", health=health)
    return DeviceUsage(device=device, used=used, usedmem=usedmem, usedcores=usedmem * 100 // 98304)


def p800_nodes() -> list[NodeView]:
    """An idle 8-XPU P800 node and a busy one (quarters on 0 and 1, a half on 4, a whole XPU on 7)."""
    busy = [xpu("busy", i) for i in range(8)]
    busy[0] = xpu("busy", 0, 2, 49152)
    busy[1] = xpu("busy", 1, 1, 24576)
    busy[4] = xpu("busy", 4, 1, 49152)
    busy[7] = xpu("busy", 7, 1, 98304)
    return [NodeView(name="idle", devices=[xpu("idle", i) for i in range(8)]), NodeView(name="busy", devices=busy)]


def whole_nodes() -> list[NodeView]:
    """Whole XPUs as HAMi derives them from capacity: an idle node of 8, and one with XPUs 0 and 5 busy."""
    devices = plugin.capacity_devices("b", {WHOLE: "8"})
    busy = [DeviceUsage(device=d, used=1 if d.index in (0, 5) else 0) for d in devices]
    idle = [DeviceUsage(device=d) for d in plugin.capacity_devices("i", {WHOLE: "8"})]
    return [NodeView(name="i", devices=idle), NodeView(name="b", devices=busy)]


def whole(count: int) -> ContainerRequest:
    return ContainerRequest(kind="kunlun", count=count, memory_percentage=100, cores=100)


def make_fixture() -> VendorFixture:
    return VendorFixture(
        name="kunlun",
        plugin=plugin,
        requests=REQUESTS,
        nodes={"XPU": p800_nodes, "kunlun": whole_nodes},
        fit_requests={
            "XPU": [req(memory=24576), req(memory=49152), req(), req(count=2, memory=24576), req(count=4)],
            "kunlun": [whole(1), whole(2), whole(4), whole(8)],
        },
    )


test_conformance = pytest_suite(make_fixture)


def plugins() -> VendorPlugins:
    return VendorPlugins.from_plugins({"kunlun": plugin}, config={"kunlun": {}})


def fit(request: ContainerRequest, devices: list[DeviceUsage], policy: str = "binpack", **annotations: str):  # type: ignore[no-untyped-def]
    pod = Pod(name="p", annotations=annotations, containers=(Container(name="c"),))
    (got,) = plugins().fit_nodes("XPU", pod, [request], [NodeView(name="n", devices=devices)],
                              SchedulingPolicy(device=(policy,)))  # fmt: skip
    return got


def test_hamis_names():
    keys = plugin.XPU.annotations
    assert plugin.XPU.register_format is RegisterFormat.JSON
    assert plugin.XPU.resources.all() == (COUNT, MEMORY)
    assert (keys.node_register, keys.node_handshake) == ("hami.io/node-register-xpu", "hami.io/node-handshake-xpu")
    assert (keys.to_allocate, keys.allocated) == ("hami.io/xpu-devices-to-allocate", "hami.io/xpu-devices-allocated")
    assert keys.selectors() == ("hami.io/use-xpu-uuid", "hami.io/no-use-xpu-uuid")


@pytest.mark.parametrize(
    ("asked", "size"), [(0, 24576), (24576, 24576), (24577, 49152), (49152, 49152), (49153, 98304), (200000, 98304)]
)
def test_memory_is_rounded_up_to_the_p800s_partitions(asked, size):
    assert plugin.partition_of(asked) == size


@pytest.mark.parametrize(("asked", "written"), [("3000", "24576"), ("49152", "49152"), ("60000", "98304")])
def test_admission_writes_the_partition_size_into_the_memory_limit(asked, written):
    container = Container(name="c", limits={COUNT: "1", MEMORY: asked})
    edit = plugins().admission_defaults("XPU", container, Pod(name="p", containers=(container,)))
    assert edit is not None
    assert dict(edit.limits) == {MEMORY: written}


def test_admission_leaves_a_container_without_vxpu_or_memory_alone():
    for limits in ({MEMORY: "3000"}, {COUNT: "1"}):
        container = Container(name="c", limits=limits)
        assert plugins().admission_defaults("XPU", container, Pod(name="p", containers=(container,))) is None


def test_an_xpu_is_shared_only_by_vxpus_of_one_size():
    devices = [xpu("n", 0, 1, 24576)] + [xpu("n", i, 1, 98304) for i in range(1, 8)]
    got = fit(req(memory=24576), devices)
    assert got.placement is not None
    assert [(d.uuid, d.usedmem, d.usedcores) for d in got.placement[0]] == [("n-xpu-0", 24576, 25)]
    refused = fit(req(memory=49152), devices)
    assert refused.placement is None
    assert "topology allows no set" in refused.reason


def test_kunlunxins_own_uuid_selectors_apply_beside_hamis():
    devices = [xpu("n", i) for i in range(8)]
    got = fit(req(memory=24576), devices, **{"baidu.com/use-gpuuuid": "n-xpu-6"})
    assert got.placement is not None
    assert [d.uuid for d in got.placement[0]] == ["n-xpu-6"]
    got = fit(req(memory=24576), devices, **{"hami.io/use-xpu-uuid": "n-xpu-5"})
    assert got.placement is not None
    assert [d.uuid for d in got.placement[0]] == ["n-xpu-5"]
    assert fit(req(memory=24576), devices, **{"baidu.com/nouse-gpuuuid": ",".join(f"n-xpu-{i}" for i in range(8))}
               ).placement is None  # fmt: skip


def test_a_pair_across_the_wings_is_a_linked_pair():
    # left wing: only 1 free, right wing: only 5 free, so neither wing has two: HAMi's cross-wing pair 1-5
    devices = [xpu("n", i, 1, 98304) for i in range(8)]
    devices[1], devices[5] = xpu("n", 1), xpu("n", 5)
    got = fit(req(count=2), devices)
    assert got.placement is not None
    assert sorted(d.uuid for d in got.placement[0]) == ["n-xpu-1", "n-xpu-5"]


# HAMi's topo_test.go cases, on the list in index order (what HAMi's sort gives idle devices under a stable order)
def free_only(*keep: int) -> list[bool]:
    return [i in keep for i in range(8)]


@pytest.mark.parametrize(
    ("fits", "count", "chosen"),
    [
        ([True] * 8, 8, list(range(8))),
        (free_only(1, 2, 3, 4, 5, 6, 7), 8, []),
        ([True] * 8, 1, [0]),
        (free_only(0, 1, 2, 3), 4, [0, 1, 2, 3]),
        (free_only(2, 6), 2, [2, 6]),
        (free_only(1, 3, 5, 7), 4, [1, 3, 5, 7]),
        ([True] * 8, 3, []),  # an unsupported count
        (free_only(0, 4, 5), 1, [0]),  # the wing with exactly one free first
        (free_only(0, 1, 4, 5, 6), 2, [0, 1]),  # the wing with exactly two
        (free_only(0, 1, 2, 4, 5, 6), 4, [0, 1, 4, 5]),  # six fit: a cross group whose other two are linked
    ],
)
def test_hamis_choice_on_an_eight_xpu_node(fits, count, chosen):
    assert select(list(range(8)), fits, count) == chosen


@given(st.lists(st.booleans(), min_size=8, max_size=8), st.sampled_from([1, 2, 4, 8]))
def test_a_choice_is_always_fitting_devices_of_the_asked_number_or_none(fits, count):
    chosen = select(list(range(8)), fits, count)
    assert chosen == [] or (len(set(chosen)) == count and all(fits[i] for i in chosen))
    if count == 2 and chosen and (chosen[0] < 4) != (chosen[1] < 4):
        assert tuple(sorted(chosen)) in CROSS_PAIRS
    if count == 4 and chosen and not (all(i < 4 for i in chosen) or all(i >= 4 for i in chosen)):
        assert tuple(sorted(chosen)) in CROSS_QUADS


def test_whole_xpus_are_the_nodes_capacity_as_hami_names_them():
    devices = plugin.capacity_devices("n", {WHOLE: "8"})
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.numa) for d in devices[3:5]] == [
        ("n-kunlun-3", 3, 100, 98304, 100, 0), ("n-kunlun-4", 4, 100, 98304, 100, 1)]  # fmt: skip
    assert plugin.capacity_devices("n", {WHOLE: "x"}) == []
    assert plugin.capacity_devices("n", {}) == []


def test_whole_xpus_are_idle_ones_and_the_pod_says_which_indices_for_kunlunxins_plugin():
    pod = Pod(name="p", containers=(Container(name="a"), Container(name="b"), Container(name="sidecar")))
    requests = [whole(1), whole(2), None]
    nodes = whole_nodes()
    fits = {
        f.node: f for f in plugins().fit_nodes("kunlun", pod, requests, nodes, SchedulingPolicy(device=("binpack",)))
    }
    busy = fits["b"]
    assert busy.placement is not None
    taken = [d.uuid for container in busy.placement for d in container]
    assert not {"b-kunlun-0", "b-kunlun-5"} & set(taken)
    assert len(set(taken)) == 3
    last = [int(u.rsplit("-", 1)[1]) for u in (d.uuid for d in busy.placement[1])]
    assert busy.pod_annotations == {"BAIDU_COM_DEVICE_IDX": ",".join(map(str, last))}


@pytest.mark.parametrize(
    ("busy", "taken", "score"),
    # HAMi's TestCalcscore, then: nothing busy, one XPU taken (1 -> 3 bubbles); a whole idle wing taken (1 -> 1)
    [([0], [0, 1], 3000.0), ([0], [4], 2000.0), ([0, 1], [0], 1000.0), ([0, 1, 2, 3], [0], 0.0), ([], [0], 0.0),
     ([], [4, 5, 6, 7], 2000.0)],
)  # fmt: skip
def test_hamis_topology_bonus(busy, taken, score):
    assert bonus(busy, taken) == score


def test_the_node_score_adds_the_bonus_of_the_pods_xpus():
    pod = Pod(name="p", containers=(Container(name="a"),))
    nodes = whole_nodes()
    fits = plugins().fit_nodes("kunlun", pod, [whole(1)], nodes, SchedulingPolicy())
    scores = plugins().score_nodes("kunlun", pod, fits, {n.name: n for n in nodes}, SchedulingPolicy())
    assert scores is not None
    for fit in fits:
        assert fit.placement is not None
        assert scores[fit.node] - fit.score in (0.0, 1000.0, 2000.0, 3000.0)
