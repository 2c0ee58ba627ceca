"""Discovery through AMD SMI and sysfs: what an AMD node registers, in HAMi's JSON form.

Every test points the plugin at a fake AMD SMI (conftest.py: ``libamd_smi.so`` built from amdsmi.h, reading a machine
file) and a sysfs tree written as the amdgpu driver shows it, so the binding loads and calls it exactly as ROCm's.
"""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.codec import decode_node_register, encode_node_register
from hami.errors import HamiError
from hami.model import Container, ContainerDevice, Pod
from hami_vendor_amd.amdsmi import bdf_text
from hami_vendor_amd.node import rocr_uuids


def test_an_mi300x_node_registers_as_hamis_amd_plugin_does(amd, machine):
    a, b = amd.gpu(0), amd.gpu(1, numa=1, socket=1)
    node = machine(a, b)
    (inventory,) = amd.plugins(node.config()).discover()["amd"]
    assert inventory.kind == "AMD"
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.type, d.numa, d.health, d.vendor, dict(d.custom))
            for d in inventory.devices] == [
        (a.uuid, 1, 10, 196608, 304, "AMD Instinct MI300X", 0, True, "amd", {"pciBDF": "0000:0c:00.0"}),
        (b.uuid, 2, 10, 196608, 304, "AMD Instinct MI300X", 1, True, "amd", {"pciBDF": "0000:1c:00.0"}),
    ]  # fmt: skip
    text = encode_node_register(inventory.devices)
    first = json.loads(text)[0]
    assert first == {"id": a.uuid, "count": 10, "devmem": 196608, "devcore": 304, "type": "AMD Instinct MI300X",
                     "numa": 0, "health": True, "index": 1, "devicevendor": "amd",
                     "custominfo": {"pciBDF": "0000:0c:00.0"}}  # fmt: skip
    assert [d.id for d in decode_node_register(text)] == [a.uuid, b.uuid]


def test_split_count_is_a_setting_and_a_model_less_gpu_is_amd_gpu(amd, machine):
    node = machine(amd.gpu(0, name=""))
    (inventory,) = amd.plugins(node.config(splitCount=4)).discover()["amd"]
    assert [(d.count, d.type) for d in inventory.devices] == [(4, "amd-gpu")]


def test_rocr_uuids_come_from_the_kfd_topology_by_render_node(amd, machine):
    node = machine(amd.gpu(0, unique_id=0x0123456789ABCDEF), amd.gpu(1, unique_id=7))
    assert rocr_uuids(node.root / "sys") == {129: "GPU-0123456789abcdef", 130: "GPU-0000000000000007"}


def test_a_gpu_without_drm_or_kfd_node_is_not_registered_and_the_others_are(amd, machine, caplog):
    good, no_drm, no_kfd = amd.gpu(0), amd.gpu(1, drm=False), amd.gpu(2, kfd=False)
    node = machine(good, no_drm, no_kfd)
    with caplog.at_level(logging.WARNING, logger="hami_vendor_amd"):
        (inventory,) = amd.plugins(node.config()).discover()["amd"]
    assert [d.id for d in inventory.devices] == [good.uuid]
    assert "no DRM card and render node for 0000:1c:00.0" in caplog.text
    assert "no KFD topology node has render minor 131" in caplog.text


def test_a_gpu_whose_amd_smi_calls_fail_is_left_out_with_the_call_named(amd, machine, monkeypatch, caplog):
    bad = amd.gpu(1)
    node = machine(amd.gpu(0), bad)
    monkeypatch.setenv("FAKE_AMDSMI_FAIL_UUID", bad.uuid)
    with caplog.at_level(logging.ERROR, logger="hami_vendor_amd"):
        (inventory,) = amd.plugins(node.config()).discover()["amd"]
    assert [d.id for d in inventory.devices] == [amd.gpu(0).uuid]
    assert "AMD GPU 1 is not reported: AMD SMI amdsmi_get_gpu_device_uuid failed with status 2" in caplog.text


def test_numa_is_zero_when_amd_smi_cannot_say(amd, machine, monkeypatch):
    node = machine(amd.gpu(0, numa=3))
    monkeypatch.setenv("FAKE_AMDSMI_FAIL", "amdsmi_topo_get_numa_node_number")
    (inventory,) = amd.plugins(node.config()).discover()["amd"]
    assert inventory.devices[0].numa == 0


def test_without_amd_smi_the_node_reports_no_gpu_and_says_so_once(amd, machine, tmp_path, caplog):
    plugins = amd.plugins({"amdSmiLibrary": str(tmp_path / "missing" / "libamd_smi.so"), "sysfsRoot": str(tmp_path)})
    with caplog.at_level(logging.WARNING, logger="hami_vendor_amd"):
        assert plugins.discover() == {"amd": []}
        assert plugins.discover() == {"amd": []}
    assert caplog.text.count("this node reports no AMD GPU") == 1


def test_amd_smi_that_does_not_initialize_reports_no_gpu(amd, machine, monkeypatch, caplog):
    node = machine(amd.gpu(0))
    monkeypatch.setenv("FAKE_AMDSMI_FAIL", "amdsmi_init")
    with caplog.at_level(logging.WARNING, logger="hami_vendor_amd"):
        assert amd.plugins(node.config()).discover() == {"amd": []}
    assert "amdsmi_init failed with status 18" in caplog.text


def test_a_failing_listing_reports_none_until_amd_smi_answers(amd, machine, monkeypatch):
    node = machine(amd.gpu(0))
    plugins = amd.plugins(node.config())
    monkeypatch.setenv("FAKE_AMDSMI_FAIL", "amdsmi_get_processor_handles")
    assert plugins.discover() == {"amd": []}
    monkeypatch.delenv("FAKE_AMDSMI_FAIL")
    assert [d.id for d in plugins.discover()["amd"][0].devices] == [amd.gpu(0).uuid]


def test_a_placement_naming_another_nodes_gpu_is_refused_with_both_named(amd, machine):
    node = machine(amd.gpu(0))
    plugins = amd.plugins(node.config())
    plugins.discover()
    pod = Pod(name="p", uid="u1", containers=(Container(name="c"),))
    placed = (ContainerDevice(uuid="elsewhere", type="AMD", usedmem=1000, usedcores=10),)
    with pytest.raises(HamiError, match=f"AMD GPU elsewhere is not on this node \\(it has {amd.gpu(0).uuid}\\)"):
        plugins.container_edits("AMD", pod, 0, placed)


@given(st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F), st.integers(0, 7))
def test_the_bdf_bit_fields_read_as_amdsmi_h_lays_them_out(domain, bus, device, function):
    packed = function | device << 3 | bus << 8 | domain << 16
    assert bdf_text(packed) == f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"
