"""Discovery through the fake ROCm SMI and DMI libraries, and through a fake hy-smi without them; registration in
HAMi's legacy string form."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.codec import decode_legacy_register, encode_legacy_register
from hami.testing.hami_rules import counted_by_hami
from hami_vendor_hygon import hysmi
from hami_vendor_hygon.dtk import bdf_of
from hami_vendor_hygon.node import runtime_for

MakeNode = Callable[[list[Any]], Any]
F = Any


def inventory(node: Any, source: str = "rsmi", **extra: object) -> list:  # type: ignore[type-arg]
    found = node.plugins(source, **extra).discover()["hygon"]
    return list(found[0].devices) if found else []


def test_rsmi_discovery_is_hamis_register(fakes: F, hygon_node: MakeNode) -> None:
    dcus = [*fakes.z100l_server(2), fakes.Dcu(bus=48, serial="PK1000", device_id=25271, cus=120, card=3)]
    devices = inventory(hygon_node(dcus))
    assert [d.id for d in devices] == ["DCU-PD23010000", "DCU-PD23010001", "DCU-PK1000"]
    assert [d.type for d in devices] == ["DCU-Z100L", "DCU-Z100L", "DCU-K100"]  # HAMi's DCU plugin's form
    assert [(d.index, d.count, d.devmem, d.devcore, d.numa, d.health) for d in devices] == [
        (0, 4, 65536, 100, 0, True),
        (1, 4, 65536, 100, 0, True),
        (2, 4, 65536, 100, 0, True),
    ]
    # HAMi's scheduler decodes what this daemon registers, in the legacy string form
    text = encode_legacy_register(devices)
    assert text.startswith("DCU-PD23010000,4,65536,100,DCU-Z100L,0,true,0,:")
    assert [d.id for d in decode_legacy_register(text)] == [d.id for d in devices]


def test_numa_and_compute_units_come_from_the_driver(fakes: F, hygon_node: MakeNode) -> None:
    node = hygon_node([fakes.Dcu(bus=0x10, serial="A", numa=1, cus=56, card=1)])
    plugins = node.plugins()
    (device,) = plugins.discover()["hygon"][0].devices
    assert device.numa == 1
    settings_obj = plugins.vendors[0].settings
    (dcu,) = runtime_for(settings_obj).devices
    assert dcu.compute_units == 56  # DMI's figure, not the Z100L table's 60
    assert dcu.bdf == "0000:10:00.0"


def test_without_dmi_compute_units_come_from_the_model(fakes: F, hygon_node: MakeNode) -> None:
    node = hygon_node([fakes.Dcu(bus=0x10, serial="A", cus=56, card=1)])
    plugins = node.plugins("hy-smi")
    plugins.discover()
    (dcu,) = runtime_for(plugins.vendors[0].settings).devices
    assert dcu.compute_units == 60


def test_hy_smi_is_read_where_rocm_smi_is_absent(fakes: F, hygon_node: MakeNode) -> None:
    dcus = fakes.z100l_server(3)
    node = hygon_node(dcus)
    rsmi = inventory(node)
    smi = inventory(node, "hy-smi")
    assert [(d.id, d.devmem, d.type, d.index) for d in smi] == [(d.id, d.devmem, d.type, d.index) for d in rsmi]
    plugins = node.plugins("hy-smi")
    plugins.discover()
    assert runtime_for(plugins.vendors[0].settings).source == "hy-smi"


def test_newer_dtk_hcu_lines_are_read(fakes: F) -> None:
    report = hysmi.parse(fakes.hy_smi_output(fakes.z100l_server(2), prefix="HCU"))
    assert [d.uuid for d in report.devices] == ["DCU-PD23010000", "DCU-PD23010001"]
    assert report.problems == []


def test_malformed_hy_smi_line_names_tool_and_line_and_keeps_the_others(fakes: F) -> None:
    text = fakes.hy_smi_output(fakes.z100l_server(2)).replace(
        "VRAM Total Memory (B): 68719476736", "VRAM Total Memory (B): lots", 1
    )
    report = hysmi.parse(text)
    assert [d.uuid for d in report.devices] == ["DCU-PD23010001"]
    (problem,) = report.problems
    assert problem.startswith("hy-smi line ")
    assert "'lots' is not a number" in problem
    assert "device 0" in problem


def test_malformed_hy_smi_keeps_node_serving(fakes: F, hygon_node: MakeNode) -> None:
    node = hygon_node(fakes.z100l_server(2))
    text = fakes.hy_smi_output(node.dcus).replace("Serial Number: PD23010001", "Serial Number:", 1)
    fakes.write_hy_smi(node.directory / "bin", text)
    assert [d.id for d in inventory(node, "hy-smi")] == ["DCU-PD23010000"]
    (problem,) = hysmi.parse(text, "hy-smi").problems
    assert problem.startswith(r"hy-smi line 7: cannot read 'DCU[1]\t\t: Serial Number:'"), problem


def test_failing_hy_smi_reports_no_devices(fakes: F, hygon_node: MakeNode) -> None:
    node = hygon_node(fakes.z100l_server(1))
    fakes.write_hy_smi(node.directory / "bin", "", exit_code=3)
    assert inventory(node, "hy-smi") == []


def test_failing_rsmi_call_falls_back_to_hy_smi(
    fakes: F, hygon_node: MakeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = hygon_node(fakes.z100l_server(2))
    monkeypatch.setenv("FAKE_DTK_FAIL", "rsmi_dev_serial_number_get")
    plugins = node.plugins()
    assert [d.id for d in plugins.discover()["hygon"][0].devices] == ["DCU-PD23010000", "DCU-PD23010001"]
    assert runtime_for(plugins.vendors[0].settings).source == "hy-smi"


def test_device_without_vram_is_not_registered(fakes: F, hygon_node: MakeNode) -> None:
    dcus = fakes.z100l_server(2)
    dcus[1] = replace(dcus[1], total=0)
    assert [d.id for d in inventory(hygon_node(dcus))] == ["DCU-PD23010000"]


def test_unknown_device_id_gets_a_selectable_name(fakes: F, hygon_node: MakeNode) -> None:
    (device,) = inventory(hygon_node([fakes.Dcu(bus=0x10, serial="X", device_id=0x7777, card=1)]))
    assert device.type == "DCU_7777"
    assert counted_by_hami([device.type], "DCU")


def test_the_registration_passes_hamis_get_node_resources_rule(fakes: F, hygon_node: MakeNode) -> None:
    """HAMi v2.10's scheduler counts a DCU only when its registered type contains `DCU`: the bare model (`Z100L`)
    this daemon registered before left every DCU pod `NodeInsufficientDevice` under HAMi's scheduler."""
    dcus = [*fakes.z100l_server(2), fakes.Dcu(bus=48, serial="PK1000", device_id=25271, cus=120, card=3)]
    text = encode_legacy_register(inventory(hygon_node(dcus)))
    assert counted_by_hami((d.type for d in decode_legacy_register(text)), "DCU")
    assert not counted_by_hami(["Z100L"], "DCU")  # the old form fails the rule


def test_no_driver_no_devices(fakes: F, hygon_node: MakeNode) -> None:
    node = hygon_node(fakes.z100l_server(1))
    (node.directory / "bin" / "hy-smi").unlink()
    assert node.plugins("hy-smi").discover().get("hygon", []) == []


def test_mode_is_published(fakes: F, hygon_node: MakeNode) -> None:
    node = hygon_node(fakes.z100l_server(1))
    (found,) = node.plugins(dcuMode="hami-core").discover()["hygon"]
    assert found.annotations == {"hami.io/dcu-mode": "hami-core"}


def test_bdf_unpacking_is_rocm_smis() -> None:
    assert bdf_of((0x1 << 32) | (0x3D << 8) | (0x2 << 3) | 1) == "0001:3d:02.1"
    assert bdf_of((0xABCD << 32) | (0xFF << 8) | (0x1F << 3) | 7) == "abcd:ff:1f.7"  # every bit of each field


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("DCU[]0123: \tabcPCIBusSerialNumberVRAM()x=\n")), max_size=300))
def test_hy_smi_parser_never_crashes(text: str) -> None:
    try:
        report = hysmi.parse(text)
    except hysmi.HySmiError:
        return
    for d in report.devices:
        assert d.memory_total >= 0


def test_memory_figures_from_rsmi(fakes: F, hygon_node: MakeNode) -> None:
    (device,) = inventory(hygon_node([fakes.Dcu(bus=0x10, serial="A", total=32 * fakes.GIB, used=fakes.GIB, card=1)]))
    assert device.devmem == 32768
