"""The Cambricon node side and scheduler rules over a fake CNDev: discovery, the per-card register and HAMi's
capacity form, the dynamic-sMLU profile rules, allocation of HAMi-named and real cards, and the container edits."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.errors import HamiError
from hami.model import (
    ContainerDevice,
    ContainerRequest,
    DeviceKind,
    DeviceNode,
    DeviceUsage,
    NodeView,
    Pod,
    SchedulingPolicy,
)
from hami.node.devices import ResourceRole, advertised_devices, resources_of
from hami.plugins import VendorPlugins
from hami.scheduler.nodes import _devices_from_capacity
from hami.testing.hami_rules import counted_by_hami
from hami_vendor_cambricon import plugin
from hami_vendor_cambricon.cndev import Cndev, MluCard
from hami_vendor_cambricon.discovery import NodeRuntime, inventory
from hami_vendor_cambricon.fit import fit_nodes
from hami_vendor_cambricon.settings import CambriconSettings

KIND: DeviceKind = plugin.KIND
MachineHost = Callable[..., VendorPlugins]


def card(uuid: str, name: str = "MLU370-X8", memory: int = 24576, cores: int = 8, health: int = 1) -> tuple:
    return (uuid, name, memory, cores, health)


def four_mlu370() -> list[tuple]:
    return [card(f"a1b2c3d4-0000-0000-0000-00000000000{i}") for i in range(4)]


UUID0 = "MLU-a1b2c3d4-0000-0000-0000-000000000000"


def test_cards_are_read_through_cndev(mlu_node: MachineHost) -> None:
    plugins = mlu_node([card("u-0", "MLU370-X8", 24576, 8), card("u-1", "MLU590-H8", 65536, 12, health=0)])
    (inventory,) = plugins.discover()["cambricon"]
    assert inventory.kind == "MLU"
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.type, d.health) for d in inventory.devices] == [
        ("MLU-u-0", 0, 100, 24576, 100, "MLU370-X8", True),
        ("MLU-u-1", 1, 100, 65536, 100, "MLU590-H8", False),
    ]
    # HAMi v2.10 reads MLUs from the node's capacity, typed `MLU`; this project's scheduler reads the register,
    # and its types pass HAMi's getNodeResources rule too
    assert counted_by_hami((d.type for d in inventory.devices), "MLU")


def test_each_card_has_its_numa_node_and_older_drivers_say_0(mlu_node: MachineHost) -> None:
    cards = [("u-0", "MLU370-X8", 24576, 8, 1, 1, "-", 0), ("u-1", "MLU370-X8", 24576, 8, 1, 1, "-", 1)]
    (found,) = mlu_node(cards).discover()["cambricon"]
    assert [d.numa for d in found.devices] == [0, 1]
    (old,) = mlu_node(cards, variant="old").discover()["cambricon"]
    assert [d.numa for d in old.devices] == [0, 0]


def test_older_drivers_without_memory_v2_give_the_same_cards(mlu_node: MachineHost) -> None:
    current = mlu_node().discover()["cambricon"]
    old = mlu_node(variant="old").discover()["cambricon"]
    assert old == current
    assert current[0].devices[0].devmem == 24576


def test_a_failing_cndev_call_reports_nothing_and_says_which(
    mlu_node: MachineHost, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    plugins = mlu_node()
    monkeypatch.setenv("FAKE_CNDEV_FAIL", "cndevGetCardHealthState")
    with caplog.at_level(logging.WARNING, "hami_vendor_cambricon"):
        assert plugins.discover()["cambricon"] == []
    assert "cndevGetCardHealthState failed with code 7 (unknown)" in caplog.text
    monkeypatch.delenv("FAKE_CNDEV_FAIL")
    (inventory,) = plugins.discover()["cambricon"]  # the session is reopened and the cards are back
    assert len(inventory.devices) == 4


def test_no_driver_reports_nothing(
    mlu_node: MachineHost, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("FAKE_CNDEV_NO_INIT", "1")
    with caplog.at_level(logging.WARNING, "hami_vendor_cambricon"):
        assert mlu_node().discover()["cambricon"] == []
        assert mlu_node(cndevLibrary="/nonexistent/libcndev.so").discover()["cambricon"] == []
    assert "cndevInit failed with code 1 (no driver)" in caplog.text


def test_a_card_without_uuid_is_left_out() -> None:
    # the fake's machine file cannot hold an empty UUID, so the rule is checked on the inventory directly
    cards = [MluCard(0, "", "MLU370-X8", 1024, 8, True), MluCard(1, "MLU-x", "MLU370-X8", 1024, 8, True)]
    assert [d.id for d in inventory(cards).devices] == ["MLU-x"]


def test_capacity_is_served_and_read_as_hami_reads_it(mlu_node: MachineHost) -> None:
    (found,) = mlu_node().discover()["cambricon"]
    served = {r.name: r.role for r in resources_of(KIND)}
    assert served == {
        "cambricon.com/vmlu": ResourceRole.COUNT,
        "cambricon.com/mlu.smlu.vmemory": ResourceRole.MEMORY,
        "cambricon.com/mlu.smlu.vcore": ResourceRole.CORES,
    }
    capacity = {name: str(len(advertised_devices(KIND, role, found.devices))) for name, role in served.items()}
    assert capacity == {"cambricon.com/vmlu": "4", "cambricon.com/mlu.smlu.vmemory": "384",
                        "cambricon.com/mlu.smlu.vcore": "400"}  # fmt: skip
    node = {"metadata": {"name": "mlu-1"}, "status": {"capacity": capacity}}
    devices = _devices_from_capacity(node, KIND)  # what HAMi v2.10's GetNodeDevices makes of it
    assert [(d.id, d.index, d.count, d.devmem, d.devcore) for d in devices] == [
        (f"mlu-1-cambricon-mlu-{i}", i, 100, 24576, 100) for i in range(4)
    ]


def node_view(used: dict[int, tuple[int, int]] | None = None, name: str = "mlu-1") -> NodeView:
    devices = [
        DeviceUsage.model_validate(
            {"device": {"id": f"MLU-u-{i}", "index": i, "count": 100, "devmem": 24576, "type": "MLU370-X8"}}
        )
        for i in range(4)
    ]
    for i, (mem, cores) in (used or {}).items():
        u = devices[i]
        u.used, u.usedmem, u.usedcores = 1, mem, cores
    return NodeView(name=name, devices=devices)


def req(count: int = 1, memory: int = 0, cores: int = 100) -> ContainerRequest:
    return ContainerRequest(kind="MLU", count=count, memory=memory, memory_percentage=None if memory else 100,
                            cores=cores)  # fmt: skip


UID = "0a1b2c3d-0000-4000-8000-000000000001"


def pod(n: int = 1, annotations: dict[str, str] | None = None, uid: str = UID) -> Pod:
    containers = [{"name": f"c{i}"} for i in range(n)]
    return Pod.model_validate({"name": "p", "uid": uid, "annotations": annotations or {}, "containers": containers})


def fit(requests: list[ContainerRequest | None], node: NodeView, p: Pod | None = None) -> tuple[str, object, dict]:
    (result,) = fit_nodes(KIND, p or pod(len(requests)), requests, [node], SchedulingPolicy(device=("binpack",)))
    return result.reason, result.placement, dict(result.pod_annotations)


def test_a_share_gets_its_profile_and_the_assigned_flag_in_both_spellings() -> None:
    reason, placement, annotations = fit([req(memory=1024, cores=25)], node_view({2: (4096, 50)}))
    assert reason == ""
    assert placement == ((ContainerDevice(uuid="MLU-u-2", type="MLU", usedmem=1024, usedcores=25),),)  # binpack
    assert annotations == {
        "CAMBRICON_DSMLU_PROFILE": "2_25_4",
        "CAMBRICON_DSMLU_ASSIGNED": "false",
        "CAMBRICON_DSMLU_ASSIGHED": "false",
    }


def test_whole_cards_may_be_several_and_the_profile_names_the_first() -> None:
    reason, placement, annotations = fit([req(count=2)], node_view())
    assert reason == ""
    assert placement is not None
    assert annotations["CAMBRICON_DSMLU_PROFILE"] == "3_100_96"  # equal scores: HAMi's walk, card 3 first


@pytest.mark.parametrize(
    ("requests", "says"),
    [
        ([req(count=2, memory=1024, cores=20)], "covers one card (2 asked"),
        ([req(memory=1024, cores=20), req()], "only MLU request (2 containers"),
        ([req(count=2, cores=50)], "covers one card"),
    ],
)
def test_shares_one_profile_cannot_describe_are_refused(requests: list[ContainerRequest | None], says: str) -> None:
    reason, placement, annotations = fit(requests, node_view())
    assert placement is None
    assert says in reason
    assert annotations == {}


def test_core_rules_still_apply_exclusive_memory_and_selectors() -> None:
    full = node_view(dict.fromkeys(range(4), (0, 10)))
    assert "not idle" in fit([req()], full)[0]
    assert "insufficient memory" in fit([req(memory=30000, cores=10)], node_view())[0]
    chosen = pod(annotations={"cambricon.com/use-gpuuuid": "MLU-u-3"})
    assert fit([req(memory=256, cores=10)], node_view(), chosen)[1][0][0].uuid == "MLU-u-3"  # type: ignore[index]
    other = pod(annotations={"cambricon.com/use-mlutype": "MLU590"})
    assert fit([req(memory=256, cores=10)], node_view(), other)[1] is None


def test_allocation_resolves_hami_capacity_names_and_marks_the_pod_assigned(mlu_node: MachineHost) -> None:
    plugins = mlu_node()
    placed = (ContainerDevice(uuid="mlu-1-cambricon-mlu-2", type="MLU", usedmem=1024, usedcores=25),)
    allocation = plugins.allocate("MLU", pod(), 0, placed)
    assert [d.uuid for d in allocation.devices] == ["MLU-a1b2c3d4-0000-0000-0000-000000000002"]
    assert allocation.devices[0].usedmem == 1024
    assert allocation.pod_annotations == {
        "CAMBRICON_DSMLU_ASSIGNED": "true",
        "CAMBRICON_DSMLU_ASSIGHED": "true",
        "CAMBRICON_DSMLU_PROFILE_INSTANCE": "1_258_2_1",  # profile 1, handle 1<<8|2, card 2, instance 1
    }
    assert allocation.node_annotations == {"cambricon.com/dsmlu.lock": None}  # HAMi's MLU node lock, released
    real = (ContainerDevice(uuid=UUID0, type="MLU"),)
    assert plugins.allocate("MLU", pod(), 0, real).devices == real


def test_a_card_not_on_the_node_is_refused_with_what_it_has(mlu_node: MachineHost) -> None:
    plugins = mlu_node(four_mlu370()[:1])
    with pytest.raises(HamiError, match=r"MLU-gone is not on this node .*MLU-a1b2"):
        plugins.allocate("MLU", pod(), 0, (ContainerDevice(uuid="MLU-gone", type="MLU"),))
    with pytest.raises(HamiError, match="mlu-1-cambricon-mlu-3 is not on this node"):
        plugins.container_edits("MLU", pod(), 0, (ContainerDevice(uuid="mlu-1-cambricon-mlu-3", type="MLU"),), None)


def test_container_edits_are_cambricons_device_plugin_answer(mlu_node: MachineHost) -> None:
    plugins = mlu_node(cnmonPath="/usr/bin/cnmon")
    placed = (ContainerDevice(uuid="MLU-a1b2c3d4-0000-0000-0000-000000000001", type="MLU"),
              ContainerDevice(uuid="MLU-a1b2c3d4-0000-0000-0000-000000000003", type="MLU"))  # fmt: skip
    edits = plugins.container_edits("MLU", pod(), 0, placed, None)
    assert edits.env == {"CAMBRICON_VISIBLE_DEVICES": "1,3"}
    assert edits.devices == (
        DeviceNode(container_path="/dev/cambricon_dev1", host_path="/dev/cambricon_dev1"),
        DeviceNode(container_path="/dev/cambricon_dev3", host_path="/dev/cambricon_dev3"),
        DeviceNode(container_path="/dev/cambricon_ctl", host_path="/dev/cambricon_ctl"),
    )
    assert [(m.container_path, m.read_only) for m in edits.mounts] == [("/usr/bin/cnmon", True)]
    assert mlu_node().container_edits("MLU", pod(), 0, placed, None).mounts == ()


def test_a_tenants_own_profile_annotation_changes_nothing_the_container_gets(mlu_node: MachineHost) -> None:
    # The tenant patches its pod's profile to claim a whole other card; the node serves the placement only.
    plugins = mlu_node()
    tenant = pod(annotations={"CAMBRICON_DSMLU_PROFILE": "3_100_96", "CAMBRICON_DSMLU_ASSIGNED": "true"})
    placed = (ContainerDevice(uuid="MLU-a1b2c3d4-0000-0000-0000-000000000001", type="MLU", usedmem=256, usedcores=10),)
    plugins.allocate("MLU", tenant, 0, placed)
    edits = plugins.container_edits("MLU", tenant, 0, placed, None)
    assert edits.env == {"VIRTUAL_DEVICES": "/dev/cambricon_dev1,/dev/cambricon_ipcm1,/dev/cambricon-caps/cap_dev1_mi1"}
    assert "/dev/cambricon_dev3" not in {d.host_path for d in edits.devices}
    (made,) = Cndev.open(plugins.vendor("cambricon").settings.cndev_library).instances(1)
    assert (made.quota, made.memory_bytes) == (10, 256 * 1024 * 1024)  # the placement's share, not the profile's


@settings(max_examples=200, deadline=None)
@given(name=st.text(max_size=60) | st.from_regex(r".{0,8}-cambricon-mlu-[0-9]{1,3}\n?", fullmatch=True))
def test_any_placed_name_is_a_card_or_a_clear_refusal(name: str) -> None:
    runtime = NodeRuntime(CambriconSettings.model_validate({"cndevLibrary": "/nonexistent/libcndev.so"}))
    runtime.cndev = Cndev.__new__(Cndev)  # a driver is present: only its cards are served
    runtime.read_cards = lambda: runtime.cards  # type: ignore[method-assign]
    runtime.cards = [MluCard(0, "MLU-u-0", "MLU370-X8", 24576, 8, True)]
    if name == "MLU-u-0" or re.fullmatch(r".+-cambricon-mlu-0+", name, flags=re.DOTALL):
        assert runtime.card_of(name).uuid == "MLU-u-0"
    else:
        with pytest.raises(HamiError, match="is not on this node"):
            runtime.card_of(name)


@settings(max_examples=100, deadline=None)
@given(
    requests=st.lists(
        st.one_of(
            st.none(),
            st.builds(
                req,
                count=st.integers(1, 6),
                memory=st.integers(0, 40000),
                cores=st.integers(0, 100),
            ),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_fitting_answers_every_request_with_a_placement_or_a_reason(requests: list[ContainerRequest | None]) -> None:
    reason, placement, annotations = fit(requests, node_view({1: (8192, 30)}))
    if placement is None:
        assert reason
        assert annotations == {}
    elif any(placement):  # type: ignore[arg-type]
        index, cores, units = annotations["CAMBRICON_DSMLU_PROFILE"].split("_")
        assert 0 <= int(index) < 4
        assert 0 <= int(cores) <= 100
        assert 0 <= int(units) <= 96
