"""The Enflame plugin: the conformance kit, HAMi's names, requests and admission, and the DRS kind's cards,
profiles, fits and pod annotations as HAMi v2.10 writes them."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hami_vendor_enflame.plugin as plugin
from hami.errors import RequestError
from hami.model import (
    Container,
    ContainerDevice,
    ContainerRequest,
    Device,
    DeviceUsage,
    NodeView,
    Pod,
    RegisterFormat,
    SchedulingPolicy,
)
from hami.plugins import VendorPlugins
from hami.testing.conformance import EditCase, RequestCase, VendorFixture, pytest_suite
from hami_vendor_enflame import drs

GCU, DRS = "GCU", "Enflame"
COUNT = "enflame.com/gcu"
SIZE, MEMORY, CORE = "enflame.com/drs-gcu", "enflame.com/gcu-memory", "enflame.com/gcu-core"
# HAMi's own test annotation (pkg/device/enflame/device_test.go)
CAPACITY = '{"devices":[{"index":"0","minor":"0","capacity":6}],"profiles":{"1g.6gb":"0","3g.20gb":"1","6g.40gb":"2"}}'
TWO_CARDS = json.dumps({"devices": [{"index": "0", "minor": "4", "capacity": 6}, {"index": "1", "minor": "5",
                        "capacity": "6"}], "profiles": {"1g.6gb": "0", "3g.20gb": "1", "6g.40gb": "2"}})  # fmt: skip


def whole(count: int) -> ContainerRequest:
    return ContainerRequest(kind=GCU, count=count, memory_percentage=100, cores=100)


def spec(memory: int = 0, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(kind=DRS, count=1, memory=memory, cores=cores)


REQUESTS = [
    RequestCase(GCU, {COUNT: "2"}, whole(2)),
    RequestCase(GCU, {COUNT: "0"}, None),
    RequestCase(GCU, {COUNT: "two"}, "plain non-negative integer"),
    RequestCase(DRS, {SIZE: "3"}, spec()),
    RequestCase(DRS, {MEMORY: "20480", CORE: "40"}, spec(20480, 40)),
    RequestCase(DRS, {MEMORY: "20"}, spec(20)),
    RequestCase(DRS, {SIZE: "0"}, "enflame.com/drs-gcu must be greater than 0"),
    RequestCase(DRS, {MEMORY: "0", CORE: "10"}, "enflame.com/gcu-memory must be greater than 0"),
    RequestCase(DRS, {CORE: "101"}, "enflame.com/gcu-core must be in range (0,100]"),
    RequestCase(DRS, {MEMORY: "20Gi"}, "plain non-negative integer"),
]


def card(node: str, i: int, used: int = 0) -> DeviceUsage:
    device = Device(id=f"{node}-GCU-{i}", index=i, count=1, devmem=100, devcore=100, type=GCU)
    return DeviceUsage(device=device, used=used, usedmem=100 * used, usedcores=100 * used)


def gcu_nodes() -> list[NodeView]:
    return [NodeView(name="idle", devices=[card("idle", i) for i in range(2)]),
            NodeView(name="busy", devices=[card("busy", 0, 1), card("busy", 1)])]  # fmt: skip


def drs_nodes() -> list[NodeView]:
    idle = [DeviceUsage(device=d) for d in drs.node_devices({drs.CAPACITY_ANNOTATION: TWO_CARDS}, "idle")]
    busy = [DeviceUsage(device=d) for d in drs.node_devices({drs.CAPACITY_ANNOTATION: TWO_CARDS}, "busy")]
    busy[0].used, busy[0].usedmem, busy[0].usedcores = 1, 20480, 50
    busy[1].used, busy[1].usedmem, busy[1].usedcores = 1, 40960, 100
    return [NodeView(name="idle", devices=idle), NodeView(name="busy", devices=busy)]


def make_fixture() -> VendorFixture:
    """The kit's material; container edits run over the fake EFML (built by conftest) with two S60s."""
    machine = Path(tempfile.gettempdir()) / f"hami-enflame-conformance-{os.getpid()}.machine"
    machine.write_text("TR1V57100500 S60 42976 1 0000:b0:00.0 0\nTR1V57100501 S60 42976 1 0000:b1:00.0 0\n")
    os.environ["FAKE_EFML_CONFIG"] = str(machine)
    return VendorFixture(
        name="enflame",
        plugin=plugin,
        config={"efmlLibrary": os.environ["HAMI_TEST_FAKE_EFML"]},
        requests=REQUESTS,
        nodes={GCU: gcu_nodes, DRS: drs_nodes},
        fit_requests={GCU: [whole(1), whole(2)], DRS: [spec(20480, 40), spec(6), spec(40, 100)]},
        edits=[EditCase(GCU, (ContainerDevice(uuid="n-GCU-1", type=GCU, usedmem=100, usedcores=100),)),
               EditCase(GCU, (ContainerDevice(uuid="TR1V57100500", type=GCU, usedmem=100, usedcores=100),))],
    )  # fmt: skip


test_conformance = pytest_suite(make_fixture)


def plugins() -> VendorPlugins:
    return VendorPlugins.from_plugins({"enflame": plugin}, config={"enflame": {}}, strict=True)


def test_kinds_carry_hamis_names_and_keys() -> None:
    gcu, vgcu = plugin.INFO.kind(GCU), plugin.INFO.kind(DRS)
    assert gcu.register_format is RegisterFormat.CAPACITY
    assert gcu.resources.all() == (COUNT,)
    assert (gcu.annotations.to_allocate, gcu.annotations.allocated) == (
        "hami.io/enflame-gcu-devices-to-allocate", "hami.io/enflame-gcu-devices-allocated")  # fmt: skip
    assert vgcu.resources.all() == (SIZE, MEMORY, CORE)
    assert vgcu.annotations.to_allocate is None  # HAMi writes only the allocated key for DRS
    assert vgcu.annotations.allocated == "hami.io/enflame-vgpu-devices-allocated"
    assert vgcu.annotations.selectors() == ("enflame.com/use-gpuuuid", "enflame.com/nouse-gpuuuid")


def admit(limits: Mapping[str, str], requests: Mapping[str, str]) -> dict[str, str]:
    container = Container(name="c", limits=dict(limits), requests=dict(requests))
    edit = plugins().admission_defaults(DRS, container, Pod(name="p", containers=(container,)))
    return dict(edit.limits) if edit is not None else {}


def test_admission_copies_a_drs_ask_named_only_in_requests_to_limits() -> None:
    assert admit({}, {SIZE: "3"}) == {SIZE: "3"}
    assert admit({MEMORY: "20480"}, {MEMORY: "20480", CORE: "40"}) == {CORE: "40"}
    assert admit({SIZE: "1"}, {SIZE: "1"}) == {}


def test_the_drs_capacity_annotation_gives_hamis_cards() -> None:
    (device,) = drs.node_devices({drs.CAPACITY_ANNOTATION: CAPACITY}, "node-a")
    assert (device.id, device.index, device.count, device.devmem, device.devcore, device.type) == (
        "node-a-enflame-drs-0", 0, 6, 40 * 1024, 100, DRS)  # fmt: skip
    assert device.custom == {"minor": "0", "index": "0", "maxSlice": 6,
                             "profiles": {"1g.6gb": "0", "3g.20gb": "1", "6g.40gb": "2"}}  # fmt: skip
    assert plugins().node_devices(DRS, {drs.CAPACITY_ANNOTATION: CAPACITY}, "node-a") == [device]
    assert plugins().node_devices(GCU, {drs.CAPACITY_ANNOTATION: CAPACITY}, "node-a") is None


@pytest.mark.parametrize(
    "raw",
    ["{", "[]", '{"devices":[{"index":"0","capacity":6}],"profiles":{"big":"0"}}',
     '{"devices":[{"index":"0","capacity":0}],"profiles":{"1g.6gb":"0"}}',
     '{"devices":[{"index":0,"capacity":6}],"profiles":{"1g.6gb":"0"}}',
     '{"devices":[{"index":"0","capacity":true}],"profiles":{"1g.6gb":"0"}}',
     '{"devices":[{"index":"0","capacity":6}],"profiles":{"1g.6gb":0}}'],
)  # fmt: skip
def test_a_malformed_drs_annotation_gives_the_node_no_cards_and_says_so(
    raw: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert drs.node_devices({drs.CAPACITY_ANNOTATION: raw}, "node-a") == []
    assert "node node-a: ignoring its Enflame DRS cards: enflame.com/gcu-drs-capacity" in caplog.text


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.sampled_from(["devices", "profiles", "index", "minor", "capacity", "3g.20gb", "x"]),
                        inner, max_size=4), max_leaves=12))  # fmt: skip
def test_no_drs_annotation_breaks_the_reader(value: object) -> None:
    for device in drs.node_devices({drs.CAPACITY_ANNOTATION: json.dumps(value)}, "n"):
        assert device.count > 0
        assert device.devmem > 0


def profile_for(ask: drs.Ask) -> str | None:
    (node,) = [n for n in drs_nodes() if n.name == "idle"]
    chosen = drs.select(drs.profiles_of([u.device for u in node.devices]), ask)
    return None if chosen is None else chosen.name


def test_profiles_are_chosen_as_hami_chooses_them() -> None:
    assert profile_for(drs.Ask(size=3)) == "3g.20gb"
    assert profile_for(drs.Ask(size=2)) is None  # a size no profile has
    assert profile_for(drs.Ask(memory=20480, cores=40)) == "3g.20gb"  # MiB: more than twice the largest GB
    assert profile_for(drs.Ask(memory=20)) == "3g.20gb"  # GB
    assert profile_for(drs.Ask(memory=7)) == "3g.20gb"
    assert profile_for(drs.Ask(cores=51)) == "6g.40gb"  # 3 of 6 slices are 50% of the cores
    assert profile_for(drs.Ask(memory=41)) is None


def drs_pod(*containers: Container, **annotations: str) -> Pod:
    return Pod(name="p", uid="u", containers=containers, annotations=annotations)


def test_a_drs_fit_writes_hamis_annotations_for_enflames_plugin() -> None:
    pod = drs_pod(Container(name="small", limits={SIZE: "1"}), Container(name="sidecar"),
                  Container(name="big", limits={MEMORY: "20480", CORE: "40"}))  # fmt: skip
    requests = plugins().pod_requests(pod)[DRS]
    (idle,) = [n for n in drs_nodes() if n.name == "idle"]
    (fit,) = drs.fit_nodes(plugin.DRS_KIND, pod, requests, [idle], SchedulingPolicy(device=("binpack",)), 42)
    assert fit.placement is not None
    small, none, big = fit.placement
    assert none == ()
    assert [(d.usedmem, d.usedcores) for d in small + big] == [(6144, 17), (20480, 50)]
    assert fit.pod_annotations == {
        "enflame.com/gcu-assigned": "false",
        "enflame.com/gcu-assigned-time": "42",
        "enflame.com/gcu-assigned-index": small[0].uuid[-1],
        "enflame.com/gcu-assigned-id": small[0].uuid[-1],
        "enflame.com/gcu-assigned-minor": {"0": "4", "1": "5"}[small[0].uuid[-1]],
        "enflame.com/gcu-request-size": "1",
        "assigned-containers": '{"big":{"allocated":false,"request":3,"profileID":"1","profileName":"3g.20gb"},'
        '"small":{"allocated":false,"request":1,"profileID":"0","profileName":"1g.6gb"}}',
    }


def test_a_drs_node_without_room_or_profile_says_why() -> None:
    busy = [n for n in drs_nodes() if n.name == "busy"]
    pod = drs_pod(Container(name="c", limits={SIZE: "6"}))
    (fit,) = drs.fit_nodes(plugin.DRS_KIND, pod, [spec()], busy, SchedulingPolicy())
    assert fit.placement is None
    assert "0/2 usable" in fit.reason
    pod = drs_pod(Container(name="c", limits={SIZE: "4"}))
    (fit,) = drs.fit_nodes(plugin.DRS_KIND, pod, [spec()], busy, SchedulingPolicy())
    assert fit.reason == "pod: no DRS profile fits 4 slices (enflame.com/drs-gcu) (profiles: 1g.6gb, 3g.20gb, 6g.40gb)"


def test_drs_selectors_use_hamis_keys() -> None:
    (idle,) = [n for n in drs_nodes() if n.name == "idle"]
    pod = drs_pod(Container(name="c", limits={SIZE: "1"}), **{"enflame.com/use-gpuuuid": "idle-enflame-drs-1"})
    (fit,) = drs.fit_nodes(plugin.DRS_KIND, pod, [spec()], [idle], SchedulingPolicy())
    assert fit.placement is not None
    assert fit.placement[0][0].uuid == "idle-enflame-drs-1"


def test_go_json_escapes_as_go_does() -> None:
    assert drs.go_json({"b": {"x": 1}, "a<&>\u2028": {"z": False, "y": "é"}}) == (
        '{"a\\u003c\\u0026\\u003e\\u2028":{"z":false,"y":"é"},"b":{"x":1}}')  # fmt: skip


def test_a_bad_drs_value_is_a_request_error_naming_the_resource() -> None:
    with pytest.raises(RequestError, match=r"enflame\.com/gcu-core"):
        drs.read_ask(Container(name="c", limits={CORE: "0"}))
