"""Fitting Ascend requests: template rounding, whole cards, node modes, super-pod modules, NetworkID topology and
selectors; and golden tests: the pod annotations HAMi v2.10 writes for the same placements (the device strings of
``hami.io/<CW>-devices-to-allocate``/``-allocated`` and the runtime annotation ``huawei.com/<CW>``)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from hami.codec import encode_pod_devices
from hami.model import (
    Container,
    ContainerRequest,
    Device,
    DeviceUsage,
    NodeFit,
    NodeView,
    Pod,
    SchedulingPolicy,
)
from hami.plugins import VendorPlugins
from hami_vendor_ascend import plugin

B3, C, P = "Ascend910B3", "Ascend910C", "Ascend310P"
SOFT = {"huawei.com/vnpu-mode": "hami-core"}


def uuid(node: str, i: int) -> str:
    return f"{node.upper()}{i:02X}00-00000011-00000022-00000033-00000044"


def npu(node: str, i: int, *, kind: str = B3, used: int = 0, usedmem: int = 0, usedcores: int = 0,
        network: int | None = -1, devcore: int = 20, devmem: int = 65536, count: int = 4,
        health: bool = True) -> DeviceUsage:  # fmt: skip
    if network == -1:
        network = None if not kind.startswith("Ascend910") else (0 if kind == C else int(i > 3))
    device = Device(
        id=uuid(node, i), index=i, count=count, devmem=devmem, devcore=devcore, type=kind, health=health,
        custom={"NetworkID": network} if network is not None else {},
    )  # fmt: skip
    return DeviceUsage(device=device, used=used, usedmem=usedmem, usedcores=usedcores)


def node(name: str, devices: list[DeviceUsage], soft: bool = False, **annotations: str) -> NodeView:
    annotations = {**annotations, "hami-vnpu-core": "true" if soft else "false"}
    return NodeView(name=name, devices=devices, annotations=annotations)


def server(name: str = "n1", n: int = 8, **kw: Any) -> NodeView:
    return node(name, [npu(name, i) for i in range(n)], **kw)


def req(
    count: int = 1, memory: int = 0, percent: int | None = None, cores: int = 0, kind: str = B3
) -> ContainerRequest:
    return ContainerRequest(kind=kind, count=count, memory=memory, memory_percentage=percent, cores=cores)


def whole(count: int = 1, kind: str = B3) -> ContainerRequest:
    return req(count, percent=100, cores=100, kind=kind)


def fit(
    nodes: Sequence[NodeView],
    *requests: ContainerRequest | None,
    annotations: Mapping[str, str] | None = None,
    policy: SchedulingPolicy | None = None,
    kind: str = B3,
    config: Mapping[str, Any] | None = None,
    init: int = 0,
) -> dict[str, NodeFit]:
    plugins = VendorPlugins.from_plugins({"ascend": plugin}, config={"ascend": dict(config or {})})
    containers = tuple(Container(name=f"c{i}") for i in range(len(requests)))
    pod = Pod(
        name="p", uid="uid-p", annotations=dict(annotations or {}),
        init_containers=containers[:init], containers=containers[init:],
    )  # fmt: skip
    fits = plugins.fit_nodes(kind, pod, list(requests), list(nodes), policy or SchedulingPolicy())
    return {f.node: f for f in fits}


def one(*args: Any, **kwargs: Any) -> NodeFit:
    (result,) = fit(*args, **kwargs).values()
    return result


def runtime(result: NodeFit) -> dict[str, str]:
    """The fit's pod annotations without HAMi's ``predicate-time`` (checked to be the decision's unix seconds)."""
    annotations = dict(result.pod_annotations)
    assert abs(int(annotations.pop("predicate-time")) - time.time()) < 60
    return annotations


def grants(result: NodeFit) -> list[list[tuple[str, int, int]]]:
    assert result.placement is not None, result.reason
    return [[(d.uuid, d.usedmem, d.usedcores) for d in devices] for devices in result.placement]


# --------------------------------------------------------------------------------------------------------
# Golden: what HAMi writes for the same placements
# --------------------------------------------------------------------------------------------------------


def test_golden_template_share_rounded_up_to_the_smallest_template() -> None:
    result = one([node("n1", [npu("n1", 0)])], req(memory=8000))
    u = uuid("n1", 0)
    assert encode_pod_devices(result.placement or ()) == f"{u},Ascend910B3,16384,0:;"
    assert runtime(result) == {"huawei.com/Ascend910B3": f'[{{"UUID":"{u}","temp":"vir05_1c_16g","memory":16384}}]'}


def test_golden_whole_cards_carry_no_template_but_their_memory() -> None:
    result = one([node("n1", [npu("n1", 0), npu("n1", 1)])], whole(2))
    a, b = uuid("n1", 1), uuid("n1", 0)  # equal scores: HAMi's walk, the highest index first
    assert encode_pod_devices(result.placement or ()) == f"{a},Ascend910B3,65536,0:{b},Ascend910B3,65536,0:;"
    runtime_list = f'[{{"UUID":"{a}","memory":65536}},{{"UUID":"{b}","memory":65536}}]'
    assert runtime(result) == {"huawei.com/Ascend910B3": runtime_list}


def test_golden_memory_no_template_holds_is_the_whole_card() -> None:
    result = one([node("n1", [npu("n1", 0)])], req(memory=40000))
    u = uuid("n1", 0)
    assert encode_pod_devices(result.placement or ()) == f"{u},Ascend910B3,65536,0:;"
    assert runtime(result) == {"huawei.com/Ascend910B3": f'[{{"UUID":"{u}","memory":65536}}]'}


def test_golden_soft_split_share_records_memory_and_cores() -> None:
    result = one([node("n1", [npu("n1", 0, devcore=100)], soft=True)], req(memory=28672, cores=40), annotations=SOFT)
    u = uuid("n1", 0)
    assert encode_pod_devices(result.placement or ()) == f"{u},Ascend910B3,28672,40:;"
    assert runtime(result) == {"huawei.com/Ascend910B3": f'[{{"UUID":"{u}","memory":28672,"core":40}}]'}


def test_golden_positional_entries_with_an_init_container_and_two_apps() -> None:
    """An init container without NPUs and two app containers with a vir05 and a vir10 each: HAMi's positional
    string (the empty entry kept) and one runtime entry per device in container order."""
    result = one(
        [node("n1", [npu("n1", 0), npu("n1", 1)])],
        None, req(memory=16384), req(memory=30000),
        init=1,
        policy=SchedulingPolicy(device=("binpack",)),
    )  # fmt: skip
    a = uuid("n1", 1)  # equal scores: the highest index; then binpack: the same, busiest chip
    assert encode_pod_devices(result.placement or ()) == f";{a},Ascend910B3,16384,0:;{a},Ascend910B3,32768,0:;"
    assert runtime(result) == {
        "huawei.com/Ascend910B3": f'[{{"UUID":"{a}","temp":"vir05_1c_16g","memory":16384}},'
        f'{{"UUID":"{a}","temp":"vir10_3c_32g","memory":32768}}]'
    }


def test_golden_310p_templates() -> None:
    device = npu("p1", 0, kind=P, devmem=21527, devcore=8, count=7)
    result = one([node("p1", [device])], req(memory=5000, kind=P), kind=P)
    u = uuid("p1", 0)
    assert encode_pod_devices(result.placement or ()) == f"{u},Ascend310P,6144,0:;"
    assert runtime(result) == {"huawei.com/Ascend310P": f'[{{"UUID":"{u}","temp":"vir02","memory":6144}}]'}


# --------------------------------------------------------------------------------------------------------
# Templates and whole cards
# --------------------------------------------------------------------------------------------------------


def test_template_shares_fill_a_chip_by_memory_and_the_next_is_refused() -> None:
    full = node("n1", [npu("n1", 0, used=3, usedmem=49152)])
    assert grants(one([full], req(memory=16000))) == [[(uuid("n1", 0), 16384, 0)]]
    busy = node("n1", [npu("n1", 0, used=3, usedmem=49152)])
    refused = one([busy], req(memory=20000))  # vir10_3c_32g: 32768 > 16384 free
    assert refused.placement is None
    assert "insufficient memory" in refused.reason


def test_a_whole_card_needs_an_idle_chip() -> None:
    result = one([node("n1", [npu("n1", 0, used=1, usedmem=16384), npu("n1", 1)])], whole(1))
    assert grants(result) == [[(uuid("n1", 1), 65536, 0)]]


def test_a_configured_template_set_is_what_shares_round_to() -> None:
    chip = {
        "chipName": "910B3", "memoryAllocatable": 65536, "memoryCapacity": 65536, "aiCore": 20,
        "templates": [{"name": "vir02_1c_8g", "memory": 8192, "aiCore": 2}],
    }  # fmt: skip
    result = one([node("n1", [npu("n1", 0)])], req(memory=5000), config={"chips": {B3: chip}})
    assert grants(result) == [[(uuid("n1", 0), 8192, 0)]]
    assert "vir02_1c_8g" in result.pod_annotations["huawei.com/Ascend910B3"]


def test_memory_larger_than_the_chip_is_refused_everywhere_with_the_sizes() -> None:
    result = one([server()], req(memory=70000))
    assert result.reason == "pod: asks 70000 MiB per Ascend910B3, more than one has (65536 MiB)"


# --------------------------------------------------------------------------------------------------------
# Node modes
# --------------------------------------------------------------------------------------------------------


def test_soft_split_shares_go_only_to_nodes_that_serve_them() -> None:
    nodes = [server("tmpl"), node("soft", [npu("soft", i, devcore=100) for i in range(2)], soft=True)]
    result = fit(nodes, req(memory=16384, cores=30), annotations=SOFT)
    assert result["tmpl"].placement is None
    assert "hami-vnpu-core: true" in result["tmpl"].reason
    assert grants(result["soft"]) == [[(uuid("soft", 1), 16384, 30)]]


def test_template_shares_do_not_go_to_soft_split_nodes_but_whole_cards_go_anywhere() -> None:
    nodes = [server("tmpl", 2), node("soft", [npu("soft", i, devcore=100) for i in range(2)], soft=True)]
    shares = fit(nodes, req(memory=16384))
    assert shares["soft"].placement is None
    assert "huawei.com/vnpu-mode: hami-core" in shares["soft"].reason
    assert shares["tmpl"].placement is not None
    wholes = fit(nodes, whole(1))
    assert all(f.placement is not None for f in wholes.values())
    soft_whole = fit(nodes, whole(1), annotations=SOFT)
    assert grants(soft_whole["soft"]) == [[(uuid("soft", 1), 65536, 100)]]  # soft split: every core, exclusive


def test_soft_split_shares_share_a_chip_by_cores() -> None:
    busy = node("soft", [npu("soft", 0, devcore=100, used=2, usedmem=16384, usedcores=80)], soft=True)
    ok = one([busy], req(memory=8192, cores=20), annotations=SOFT)
    assert grants(ok) == [[(uuid("soft", 0), 8192, 20)]]
    refused = one([busy], req(memory=8192, cores=30), annotations=SOFT)
    assert "insufficient cores" in refused.reason


def test_an_unreadable_mode_annotation_refuses_every_node_with_the_fix() -> None:
    result = fit([server("a"), server("b")], req(memory=8000), annotations={"huawei.com/vnpu-mode": "soft"})
    assert {f.reason for f in result.values()} == {
        "huawei.com/vnpu-mode: 'soft' is not a vNPU mode: write hami-core (soft split) or template"
    }


# --------------------------------------------------------------------------------------------------------
# Super-pod modules (910C)
# --------------------------------------------------------------------------------------------------------


def c_node(name: str = "c1", busy: Sequence[int] = (), broken: Sequence[int] = (), modules: int = 4) -> NodeView:
    devices = [
        npu(name, i, kind=C, used=1 if i in busy else 0, usedmem=16384 if i in busy else 0, health=i not in broken)
        for i in range(2 * modules)
    ]
    return node(name, devices)


def indexes(result: NodeFit) -> list[list[int]]:
    assert result.placement is not None, result.reason
    return [[int(d.uuid[2:4], 16) for d in devices] for devices in result.placement]


def test_two_910c_cards_are_one_whole_module() -> None:
    result = one([c_node(busy=[0, 3])], whole(2, C), kind=C)
    # modules 0 and 1 each have a busy die; of the whole ones HAMi takes one in map order (random), this project
    # the first its walk reaches (the highest index)
    assert indexes(result) == [[6, 7]]


def test_four_910c_cards_are_two_whole_modules_in_policy_order() -> None:
    result = one([c_node(busy=[2])], whole(4, C), kind=C, policy=SchedulingPolicy(device=("binpack",)))
    assert sorted(indexes(result)[0]) == [4, 5, 6, 7]  # the whole modules HAMi's binpack walk reaches first


def test_a_node_with_free_dies_but_no_free_modules_is_refused_saying_so() -> None:
    result = one([c_node(busy=[0, 2, 4, 6])], whole(2, C), kind=C)
    assert result.placement is None
    assert "module partner not free" in result.reason
    broken = one([c_node(busy=[0], broken=[3], modules=2)], whole(2, C), kind=C)
    assert broken.placement is None


def test_a_910c_share_of_one_die_takes_a_single_die() -> None:
    result = one([c_node(busy=[0])], req(memory=16384, kind=C), kind=C, policy=SchedulingPolicy(device=("binpack",)))
    assert indexes(result) == [[0]]  # binpack: the busy die


# --------------------------------------------------------------------------------------------------------
# NetworkID topology (910-series)
# --------------------------------------------------------------------------------------------------------


def test_several_cards_come_from_one_network_group_when_one_holds_them() -> None:
    # group 0 (NPUs 0-3) has 3 free, group 1 (NPUs 4-7) has 2 free: three cards fit group 0 only
    devices = [npu("n1", i, used=1 if i in (3, 6, 7) else 0, usedmem=16384 if i in (3, 6, 7) else 0) for i in range(8)]
    result = one([node("n1", devices)], whole(3))
    assert sorted(indexes(result)[0]) == [0, 1, 2]


def test_the_tightest_network_group_is_used_so_larger_groups_stay_whole() -> None:
    devices = [npu("n1", i, used=1 if i == 3 else 0, usedmem=16384 if i == 3 else 0) for i in range(8)]
    result = one([node("n1", devices)], whole(3), policy=SchedulingPolicy(device=("spread",)))
    assert sorted(indexes(result)[0]) == [0, 1, 2]


def test_cards_spanning_networks_fill_the_largest_groups_first() -> None:
    devices = [npu("n1", i, used=1 if i in (0, 1, 2) else 0, usedmem=65536 if i in (0, 1, 2) else 0) for i in range(8)]
    result = one([node("n1", devices)], whole(5))
    assert sorted(indexes(result)[0]) == [3, 4, 5, 6, 7]


def test_the_node_score_prefers_cohesive_placements_under_binpack_and_spread() -> None:
    split = [npu("split", i, used=1 if i in (1, 2, 3, 5, 6, 7) else 0,
                 usedmem=65536 if i in (1, 2, 3, 5, 6, 7) else 0) for i in range(8)]  # fmt: skip
    one_group = [npu("group", i, used=1 if i in (2, 3, 4, 5, 6, 7) else 0,
                     usedmem=65536 if i in (2, 3, 4, 5, 6, 7) else 0) for i in range(8)]  # fmt: skip
    nodes = [node("split", split), node("group", one_group)]
    for policy, better in (("binpack", max), ("spread", min)):
        result = fit(nodes, whole(2), policy=SchedulingPolicy(node=policy))
        assert better(result, key=lambda n: result[n].score) == "group", policy
        assert abs(result["group"].score - result["split"].score) == pytest.approx(5.0)  # 10 × (1 − 1/2)


def test_310p_has_no_network_topology() -> None:
    devices = [npu("p1", i, kind=P, devmem=21527, devcore=8, count=7) for i in range(2)]
    result = one([node("p1", devices)], whole(2, P), kind=P)
    assert result.placement is not None
    assert result.score == pytest.approx(10 * (2 / 14 + 0 + 1.0))


# --------------------------------------------------------------------------------------------------------
# Selectors
# --------------------------------------------------------------------------------------------------------


def test_use_and_no_use_uuid_selectors() -> None:
    nodes = [server("n1", 3)]
    use = fit(nodes, req(memory=8000), annotations={"hami.io/use-Ascend910B3-uuid": uuid("n1", 2)})
    assert grants(use["n1"]) == [[(uuid("n1", 2), 16384, 0)]]
    avoid = f"{uuid('n1', 0)},{uuid('n1', 1)}"
    nouse = fit(nodes, whole(1), annotations={"hami.io/no-use-Ascend910B3-uuid": avoid})
    assert grants(nouse["n1"]) == [[(uuid("n1", 2), 65536, 0)]]
    none = fit(nodes, whole(2), annotations={"hami.io/no-use-Ascend910B3-uuid": avoid})
    assert "in no-use-uuid list" in none["n1"].reason


def test_an_init_container_and_an_app_container_share_a_chip_one_after_the_other() -> None:
    """40000 MiB for the init container, then 40000 MiB for the app container: the 64 GiB chip holds the larger
    phase, not the sum (HAMi fits each init container alone and the app containers together)."""
    chip = [npu("n1", 0, devcore=100)]
    result = one([node("n1", chip, soft=True)], req(memory=40000, cores=30), req(memory=40000, cores=30),
                 annotations=SOFT, init=1)  # fmt: skip
    u = uuid("n1", 0)
    assert grants(result) == [[(u, 40000, 30)], [(u, 40000, 30)]]
    # two app containers of the same size run at once, so they do not fit
    refused = one([node("n1", chip, soft=True)], req(memory=40000, cores=30), req(memory=40000, cores=30),
                  annotations=SOFT)  # fmt: skip
    assert refused.placement is None
    assert "insufficient memory" in refused.reason
