"""ExampleAccel's tests: hami-core's conformance kit, then discovery, requests, fitting and edits of our own."""

from __future__ import annotations

import json
import logging
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

import hami_vendor_exampleaccel.plugin as plugin
from hami.errors import ConfigError, HamiError, RequestError
from hami.model import (
    Container,
    ContainerDevice,
    ContainerRequest,
    Device,
    DeviceNode,
    DeviceUsage,
    NodeInventory,
    NodeView,
    Pod,
    SchedulingPolicy,
)
from hami.plugins import VendorPlugins
from hami.testing.conformance import EditCase, RequestCase, VendorFixture, applicable, pytest_suite

KIND = "ExampleAccel"
COUNT, MEMORY, CORES = "example.com/accel", "example.com/accel-memory", "example.com/accel-cores"

# --------------------------------------------------------------------------------------------------------
# The conformance kit
# --------------------------------------------------------------------------------------------------------


def _device(serial: str, index: int, *, memory: int = 16384, numa: int = 0, health: bool = True) -> Device:
    return Device(
        id=f"EXA-{serial}-{index}",
        index=index,
        count=4,
        devmem=memory,
        devcore=100,
        type="ExampleAccel-X1",
        numa=numa,
        health=health,
    )


def make_nodes() -> list[NodeView]:
    """Three candidate nodes, each already running pods, so free capacity differs from device to device."""
    return [
        NodeView(
            name="node-a",
            devices=[
                DeviceUsage(device=_device("aaaa0001", 0), used=2, usedmem=8192, usedcores=50),
                DeviceUsage(device=_device("aaaa0001", 1), used=4, usedmem=4096, usedcores=40),  # no free slot
                DeviceUsage(device=_device("aaaa0001", 2, health=False)),
                DeviceUsage(device=_device("aaaa0001", 3, numa=1)),
            ],
        ),
        NodeView(
            name="node-b",
            devices=[
                DeviceUsage(device=_device("bbbb0002", 0, memory=8192), used=1, usedmem=6144, usedcores=100),
                DeviceUsage(device=_device("bbbb0002", 1, memory=8192), used=1, usedmem=1024, usedcores=10),
            ],
        ),
        NodeView(
            name="node-c",
            devices=[DeviceUsage(device=_device("cccc0003", 0, memory=32768), used=1, usedmem=32768)],  # memory full
        ),
    ]


FIT_REQUESTS = [
    ContainerRequest(kind=KIND, count=1, memory=4096, cores=25),
    ContainerRequest(kind=KIND, count=2, memory=2048),
    ContainerRequest(kind=KIND, count=1, memory_percentage=50, cores=50),
    ContainerRequest(kind=KIND, count=1, memory_percentage=100, cores=100),
    ContainerRequest(kind=KIND, count=3, memory=1024, cores=10),
]

REQUESTS = [
    RequestCase(KIND, {COUNT: "1", MEMORY: "3000"}, ContainerRequest(kind=KIND, count=1, memory=3000)),
    RequestCase(
        KIND, {COUNT: "2", MEMORY: "1024", CORES: "30"}, ContainerRequest(kind=KIND, count=2, memory=1024, cores=30)
    ),
    RequestCase(KIND, {COUNT: "1"}, ContainerRequest(kind=KIND, count=1, memory_percentage=100, cores=100)),
    RequestCase(KIND, {MEMORY: "2048"}, ContainerRequest(kind=KIND, count=1, memory=2048)),
    RequestCase(KIND, {CORES: "50"}, ContainerRequest(kind=KIND, count=1, memory_percentage=100, cores=50)),
    RequestCase(KIND, {COUNT: "0"}, None),
    RequestCase(KIND, {COUNT: "1", MEMORY: "3Gi"}, "write 3072"),
    # HAMi clamps cores at 100
    RequestCase(
        KIND, {COUNT: "1", CORES: "150"}, ContainerRequest(kind=KIND, count=1, memory_percentage=100, cores=100)
    ),
    RequestCase(KIND, {COUNT: "two"}, "not a plain non-negative integer"),
]

EDITS = [
    EditCase(KIND, (ContainerDevice(uuid="EXA-aaaa0001-3", type=KIND, usedmem=4096, usedcores=25),)),
    EditCase(
        KIND,
        (
            ContainerDevice(uuid="EXA-aaaa0001-0", type=KIND, usedmem=2048, usedcores=0),
            ContainerDevice(uuid="EXA-aaaa0001-3", type=KIND, usedmem=2048, usedcores=0),
        ),
        container_index=1,
    ),
    EditCase(KIND, ()),
]


def make_fixture() -> VendorFixture:
    return VendorFixture(
        name="exampleaccel",
        plugin=plugin,
        config={"split_count": 4},
        requests=REQUESTS,
        nodes={KIND: make_nodes},
        fit_requests={KIND: FIT_REQUESTS},
        edits=EDITS,
    )


test_conformance = pytest_suite(make_fixture)


def test_every_conformance_check_applies() -> None:
    _, skipped = applicable(make_fixture())
    assert not skipped, [(check.name, why) for check, why in skipped]


# --------------------------------------------------------------------------------------------------------
# Packaging and settings
# --------------------------------------------------------------------------------------------------------


def _host(**config: Any) -> VendorPlugins:
    return VendorPlugins.from_plugins({"exampleaccel": plugin}, config={"exampleaccel": config})


def test_entry_point_is_registered_and_loads() -> None:
    (ep,) = metadata.entry_points(group="hami.vendors", name="exampleaccel")
    assert ep.value == "hami_vendor_exampleaccel.plugin"
    assert ep.dist is not None
    assert ep.dist.metadata["Name"] == "hami-vendor-exampleaccel"
    assert ep.load() is plugin


def test_settings_defaults() -> None:
    settings = _host().vendor("exampleaccel").settings
    assert settings == plugin.ExampleAccelSettings(
        split_count=10, default_memory=0, inventory_file=Path("/etc/exampleaccel/devices.json")
    )


@pytest.mark.parametrize(("config", "named"), [({"splitcount": 4}, "splitcount"), ({"split_count": 0}, "split_count")])
def test_settings_refuse_bad_keys_and_values_by_name(config: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        _host(**config)


# --------------------------------------------------------------------------------------------------------
# Discovery from the inventory file
# --------------------------------------------------------------------------------------------------------


def _discover(**config: Any) -> list[NodeInventory]:
    """Our discovery hook, called as the node daemon calls it: with the settings the host validated."""
    settings = _host(**config).vendor("exampleaccel").settings
    return plugin.hami_discover_devices(settings)


def _write_inventory(tmp_path: Path, content: Any) -> Path:
    path = tmp_path / "devices.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_discovery_reads_the_inventory_file(tmp_path: Path) -> None:
    path = _write_inventory(
        tmp_path,
        {
            "devices": [
                {"uuid": "EXA-0a1b2c3d-0", "memory": 16384, "model": "ExampleAccel-X1", "numa": 0},
                {"uuid": "EXA-0a1b2c3d-1", "memory": 8192, "numa": 1, "healthy": False},
            ]
        },
    )
    assert _discover(inventory_file=str(path), split_count=4) == [
        NodeInventory(
            kind=KIND,
            devices=(
                Device(id="EXA-0a1b2c3d-0", index=0, count=4, devmem=16384, devcore=100, type="ExampleAccel-X1"),
                Device(id="EXA-0a1b2c3d-1", index=1, count=4, devmem=8192, type="ExampleAccel", numa=1, health=False),
            ),
        )
    ]


def test_discovery_through_the_plugins(tmp_path: Path) -> None:
    path = _write_inventory(tmp_path, {"devices": [{"uuid": "EXA-0a1b2c3d-0", "memory": 16384}]})
    found = _host(inventory_file=str(path)).discover()
    assert found == {"exampleaccel": _discover(inventory_file=str(path))}


def test_discovery_without_inventory_file_logs_and_finds_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    missing = tmp_path / "absent.json"
    with caplog.at_level(logging.INFO, logger="hami_vendor_exampleaccel"):
        assert _discover(inventory_file=str(missing)) == []
    assert str(missing) in caplog.text


def test_discovery_of_an_empty_inventory_reports_no_kind(tmp_path: Path) -> None:
    path = _write_inventory(tmp_path, {"devices": []})
    assert _discover(inventory_file=str(path)) == []


@pytest.mark.parametrize(
    ("content", "complaint"),
    [
        ("{not json", "Invalid JSON"),
        ({"devices": [{"uuid": "GPU-1234", "memory": 1024}]}, "EXA-<serial>-<index>"),
        ({"devices": [{"uuid": "EXA-ab-0", "memory": -1}]}, "memory"),
        ({"devices": [{"uuid": "EXA-ab-0", "memory": 1}, {"uuid": "EXA-cd-0", "memory": 1}]}, "share an index"),
        ({"devices": [{"uuid": "EXA-ab-0", "memory": 1, "model": "a,b"}]}, "separator"),
    ],
)
def test_discovery_of_a_malformed_inventory_logs_why_and_finds_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: Any, complaint: str
) -> None:
    path = _write_inventory(tmp_path, content)
    with caplog.at_level(logging.ERROR, logger="hami_vendor_exampleaccel"):
        assert _discover(inventory_file=str(path)) == []
    assert str(path) in caplog.text
    assert complaint in caplog.text


# --------------------------------------------------------------------------------------------------------
# Requests and fitting
# --------------------------------------------------------------------------------------------------------


def test_default_memory_applies_to_a_bare_count() -> None:
    plugins = _host(default_memory=2048)
    container = Container(name="main", limits={COUNT: "2"})
    pod = Pod(name="p", containers=(container,))
    assert plugins.container_request(KIND, container, pod) == ContainerRequest(kind=KIND, count=2, memory=2048)


def test_unreadable_memory_names_the_resource() -> None:
    container = Container(name="main", limits={COUNT: "1", MEMORY: "1.5"})
    with pytest.raises(RequestError, match=MEMORY):
        _host().container_request(KIND, container, Pod(name="p", containers=(container,)))


def _fit(
    plugins: VendorPlugins, request: ContainerRequest, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    pod = Pod(name="p", annotations=annotations or {}, containers=(Container(name="main"),))
    fits = plugins.fit_nodes(KIND, pod, [request], make_nodes(), SchedulingPolicy())
    return {f.node: f.placement[0] if f.placement else f.reason for f in fits}


def test_fitting_uses_free_capacity_and_explains_refusals() -> None:
    got = _fit(_host(), ContainerRequest(kind=KIND, count=2, memory=2048))
    assert {d.uuid for d in got["node-a"]} == {"EXA-aaaa0001-0", "EXA-aaaa0001-3"}
    assert all(d.usedmem == 2048 and d.usedcores == 0 for d in got["node-a"])
    assert got["node-b"] == "pod: needs 2 ExampleAccel devices, 1/2 usable (1 insufficient cores)"
    assert got["node-c"] == "pod: needs 2 ExampleAccel devices, 0/1 usable (1 insufficient memory)"


def test_fitting_honours_the_no_use_selector() -> None:
    request = ContainerRequest(kind=KIND, count=1, memory_percentage=100, cores=100)
    assert [d.uuid for d in _fit(_host(), request)["node-a"]] == ["EXA-aaaa0001-3"]
    refused = _fit(_host(), request, {"example.com/nouse-accel-uuid": "EXA-aaaa0001-3"})["node-a"]
    assert isinstance(refused, str)
    assert "in no-use-uuid list" in refused


# --------------------------------------------------------------------------------------------------------
# Container edits
# --------------------------------------------------------------------------------------------------------


def test_edits_for_two_devices() -> None:
    placement = (
        ContainerDevice(uuid="EXA-0a1b2c3d-0", type=KIND, usedmem=4096, usedcores=25),
        ContainerDevice(uuid="EXA-0a1b2c3d-3", type=KIND, usedmem=4096, usedcores=25),
    )
    edits = _host().container_edits(KIND, Pod(name="p"), 0, placement)
    assert dict(edits.env) == {
        "EXAMPLEACCEL_VISIBLE_DEVICES": "EXA-0a1b2c3d-0,EXA-0a1b2c3d-3",
        "EXAMPLEACCEL_MEMORY_LIMIT_0": "4096m",
        "EXAMPLEACCEL_MEMORY_LIMIT_1": "4096m",
        "EXAMPLEACCEL_CORE_LIMIT": "25",
    }
    assert edits.devices == (
        DeviceNode(container_path="/dev/exampleaccel0", host_path="/dev/exampleaccel0"),
        DeviceNode(container_path="/dev/exampleaccel3", host_path="/dev/exampleaccel3"),
    )
    assert edits.cdi_devices == ("example.com/accel=EXA-0a1b2c3d-0", "example.com/accel=EXA-0a1b2c3d-3")
    assert edits.mounts == ()


def test_edits_for_no_devices_are_empty() -> None:
    edits = _host().container_edits(KIND, Pod(name="p"), 0, ())
    assert not edits.env
    assert not edits.devices
    assert not edits.cdi_devices


def test_edits_refuse_a_uuid_of_another_format() -> None:
    placement = (ContainerDevice(uuid="GPU-1234", type=KIND, usedmem=1024),)
    with pytest.raises(HamiError, match="EXA-<serial>-<index>"):
        _host().container_edits(KIND, Pod(name="p"), 0, placement)


# --------------------------------------------------------------------------------------------------------
# One pod from resources to edits
# --------------------------------------------------------------------------------------------------------


def test_a_pod_from_resources_through_fitting_to_edits() -> None:
    plugins = _host()
    pod = Pod(
        name="train",
        init_containers=(Container(name="setup", limits={"cpu": "1"}),),
        containers=(
            Container(name="worker", limits={COUNT: "1", MEMORY: "7000", CORES: "40"}),
            Container(name="sidecar", limits={MEMORY: "1024", CORES: "10"}),
        ),
    )
    requests = plugins.pod_requests(pod)[KIND]
    assert requests == [
        None,
        ContainerRequest(kind=KIND, count=1, memory=7000, cores=40),
        ContainerRequest(kind=KIND, count=1, memory=1024, cores=10),
    ]
    fits = {f.node: f for f in plugins.fit_nodes(KIND, pod, requests, make_nodes(), SchedulingPolicy())}
    placement = fits["node-a"].placement
    assert placement is not None
    assert placement[0] == ()
    edits = [plugins.container_edits(KIND, pod, index, devices) for index, devices in enumerate(placement)]
    assert edits[0].env == {}
    assert edits[1].env["EXAMPLEACCEL_MEMORY_LIMIT_0"] == "7000m"
    assert edits[1].env["EXAMPLEACCEL_CORE_LIMIT"] == "40"
    assert edits[2].env["EXAMPLEACCEL_MEMORY_LIMIT_0"] == "1024m"
    assert edits[2].env["EXAMPLEACCEL_CORE_LIMIT"] == "10"
    # node-b has room for the worker, but then neither of its devices for the sidecar: the containers of one
    # pod see each other's grants.
    assert (
        fits["node-b"].reason
        == "container sidecar: needs 1 ExampleAccel device, 0/2 usable (1 insufficient cores, 1 insufficient memory)"
    )
    assert fits["node-c"].placement is None
