"""The node's ResourceSlice: built from discovery through the vendor hooks, published and kept current."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
import scripted_vendor
from node_harness import NODE, scripted_devices, write_script

from hami import hookimpl
from hami.cluster import MemoryCluster
from hami.dra.slices import SlicePublisher, build_slice, slice_name
from hami.model import Device, DeviceKind, DraDevice
from hami.plugins import VendorPlugins


@hookimpl
def hami_dra_device(kind: DeviceKind, device: Device) -> DraDevice:
    """What a vendor publishing topology and fixed partition sizes answers."""
    return DraDevice(
        attributes={"pcieRoot": f"pci0000:{device.index:02x}", "uuid": "forged", "bad name!": 1},
        memory_values_mib=(1024, 2048, 4096) if device.index == 1 else (),
        cores_step=5,
    )


def _topology_vendor() -> types.ModuleType:
    """The scripted vendor with `hami_dra_device` added."""
    module = types.ModuleType("topology_vendor")
    module.__dict__.update({k: v for k, v in vars(scripted_vendor).items() if k.startswith("hami_")})
    module.hami_dra_device = hami_dra_device  # type: ignore[attr-defined]
    return module


@pytest.fixture
def script(tmp_path: Path) -> Path:
    return write_script(tmp_path / "script.json", {"Scripted": scripted_devices(2)})


def _host(script: Path, plugin: object = scripted_vendor) -> VendorPlugins:
    return VendorPlugins.from_plugins({"scripted": plugin}, config={"scripted": {"script": str(script)}})


def _inventories(plugins: VendorPlugins) -> dict[str, Any]:
    return {inv.kind: inv for inv in plugins.discover()["scripted"]}


def test_one_entry_per_healthy_device_with_core_attributes_and_share_policies(script: Path) -> None:
    plugins = _host(script)
    obj = build_slice(plugins, NODE, "hami.io", _inventories(plugins))
    spec = obj["spec"]
    assert obj["apiVersion"] == "resource.k8s.io/v1"
    assert obj["metadata"]["name"] == slice_name(NODE, "hami.io")
    assert spec["driver"] == "hami.io"
    assert spec["nodeName"] == NODE
    assert spec["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    first = spec["devices"][0]
    assert [d["name"] for d in spec["devices"]] == ["scripted-0", "scripted-1"]
    assert first["attributes"] == {
        "kind": {"string": "Scripted"}, "vendor": {"string": "scripted"}, "model": {"string": "Scripted"},
        "uuid": {"string": "SCR-0"}, "index": {"int": 0}, "numa": {"int": 0},
    }  # fmt: skip
    assert first["allowMultipleAllocations"] is True
    assert first["capacity"] == {
        "hami.io/memory": {"value": "8192Mi", "requestPolicy": {
            "default": "8192Mi", "validRange": {"min": "1Mi", "max": "8192Mi", "step": "1Mi"}}},
        "hami.io/cores": {"value": "100", "requestPolicy": {
            "default": "0", "validRange": {"min": "0", "max": "100", "step": "1"}}},
        "hami.io/shares": {"value": "4", "requestPolicy": {"default": "1", "validValues": ["1"]}},
    }  # fmt: skip


def test_unhealthy_devices_are_left_out_and_a_single_slot_device_is_not_shared(script: Path) -> None:
    devices = scripted_devices(3)
    devices[1]["health"] = False
    devices[2]["count"] = 1
    write_script(script, {"Scripted": devices})
    plugins = _host(script)
    spec = build_slice(plugins, NODE, "hami.io", _inventories(plugins))["spec"]
    assert [d["name"] for d in spec["devices"]] == ["scripted-0", "scripted-2"]
    whole = spec["devices"][1]
    assert "allowMultipleAllocations" not in whole
    assert whole["capacity"] == {"hami.io/memory": {"value": "8192Mi"}, "hami.io/cores": {"value": "100"}}


def test_a_device_the_vendor_does_not_publish_stays_out_of_the_slice(script: Path) -> None:
    @hookimpl
    def hami_dra_device(device: Device) -> DraDevice | None:
        return DraDevice(published=False) if device.index == 0 else None

    module = types.ModuleType("partitioned_vendor")
    module.__dict__.update({k: v for k, v in vars(scripted_vendor).items() if k.startswith("hami_")})
    module.hami_dra_device = hami_dra_device  # type: ignore[attr-defined]
    plugins = _host(script, module)
    assert [d["name"] for d in build_slice(plugins, NODE, "hami.io", _inventories(plugins))["spec"]["devices"]] == [
        "scripted-1"
    ]


def test_the_memory_unit_of_the_kind_is_the_step(script: Path) -> None:
    write_script(script, {"ScriptedCap": [{"id": "CAP-0", "count": 2, "devmem": 5000}]})
    plugins = _host(script)
    memory = build_slice(plugins, NODE, "hami.io", _inventories(plugins))["spec"]["devices"][0]["capacity"][
        "hami.io/memory"
    ]
    # 1024 MiB units: the whole device is 4 units, and shares are multiples of one.
    assert memory == {
        "value": "4096Mi",
        "requestPolicy": {"default": "4096Mi", "validRange": {"min": "1024Mi", "max": "4096Mi", "step": "1024Mi"}},
    }


def test_the_vendor_hook_adds_attributes_and_partition_sizes_but_cannot_override_core(script: Path) -> None:
    plugins = _host(script, _topology_vendor())
    devices = build_slice(plugins, NODE, "hami.io", _inventories(plugins))["spec"]["devices"]
    assert devices[0]["attributes"]["pcieRoot"] == {"string": "pci0000:00"}
    assert devices[0]["attributes"]["uuid"] == {"string": "SCR-0"}  # core's, not the vendor's "forged"
    assert "bad name!" not in devices[0]["attributes"]
    assert devices[0]["capacity"]["hami.io/cores"]["requestPolicy"]["validRange"]["step"] == "5"
    assert devices[1]["capacity"]["hami.io/memory"]["requestPolicy"] == {
        "default": "4096Mi", "validValues": ["1024Mi", "2048Mi", "4096Mi"],
    }  # fmt: skip


def test_dra_device_facts_are_validated() -> None:
    with pytest.raises(ValueError, match="ascending"):
        DraDevice(memory_values_mib=(2048, 1024))
    with pytest.raises(ValueError, match="at most 10"):
        DraDevice(memory_values_mib=tuple(range(1, 12)))


def test_the_publisher_creates_keeps_and_updates_the_slice_on_health_change(script: Path) -> None:
    plugins = _host(script)
    cluster = MemoryCluster()
    node = cluster.create("nodes", {"metadata": {"name": NODE, "uid": "node-uid-1"}})
    publisher = SlicePublisher(cluster, plugins, NODE)
    assert publisher.sync(_inventories(plugins)) is True
    stored = cluster.get("resourceslices", slice_name(NODE, "hami.io"))
    assert stored["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node["metadata"]["uid"]}
    ]
    assert publisher.sync(_inventories(plugins)) is False  # nothing changed: nothing written
    assert set(publisher.devices) == {"scripted-0", "scripted-1"}

    devices = scripted_devices(2)
    devices[0]["health"] = False
    write_script(script, {"Scripted": devices})
    assert publisher.sync(_inventories(plugins)) is True
    spec = cluster.get("resourceslices", slice_name(NODE, "hami.io"))["spec"]
    assert spec["pool"]["generation"] == 2
    assert [d["name"] for d in spec["devices"]] == ["scripted-1"]
    assert set(publisher.devices) == {"scripted-1"}


def test_a_stored_slice_in_canonical_form_is_not_rewritten(script: Path) -> None:
    plugins = _host(script)
    cluster = MemoryCluster()
    publisher = SlicePublisher(cluster, plugins, NODE)
    publisher.sync(_inventories(plugins))
    stored = cluster.get("resourceslices", publisher.name)
    text = json.dumps(stored).replace('"8192Mi"', '"8Gi"')  # what the API server writes back
    stored = json.loads(text)
    stored["spec"]["perDeviceNodeSelection"] = False  # a field the server defaults
    cluster.replace("resourceslices", stored)
    assert publisher.sync(_inventories(plugins)) is False


def test_an_attribute_the_vendor_no_longer_gives_is_removed_from_the_stored_slice(script: Path) -> None:
    plugins = _host(script)
    cluster = MemoryCluster()
    publisher = SlicePublisher(cluster, plugins, NODE)
    publisher.sync(_inventories(plugins))
    stored = cluster.get("resourceslices", publisher.name)
    stored["spec"]["devices"][0]["attributes"]["pcieRoot"] = {"string": "stale"}  # as an earlier version wrote
    cluster.replace("resourceslices", stored)
    assert publisher.sync(_inventories(plugins)) is True
    assert "pcieRoot" not in cluster.get("resourceslices", publisher.name)["spec"]["devices"][0]["attributes"]
