"""Enflame discovery through the fake EFML and the fake ``efsmi``, and the container edits that use it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hami_vendor_enflame.plugin as plugin
from hami.errors import HamiError
from hami.model import ContainerDevice, Device, NodeInventory, Pod
from hami.plugins import VendorPlugins
from hami.vendortool import ToolError
from hami_vendor_enflame.efml import parse_efsmi

S60 = ("TR1V57100501", "S60", 42976, "1", "0000:b1:00.0", 0)
S60_B = ("TPUH74190604", "S60", 42976, "1", "0000:b2:00.0", 1)

OLD_DRIVER = """\
DEV ID 0
    Driver Info
        Ver                     : 1.2.4.12
    Device Info
        Dev Name                : S60
        Dev UUID                : TR1V57100501
        Dev SN                  : C0AAD40510049
        Health                  : True
    PCIe Info
        Vendor ID               : 1e36
        Domain                  : 0000
        Bus                     : b1
        Dev                     : 00
        Func                    : 0
    Device Mem Info
        Mem Size                : 42976 MiB
        Mem Usage               : 1129 MiB
"""
NEW_DRIVER = """\
DEV ID 1
    Device Info
        Dev Name                : S60
        Dev UUID                : TPUH74190604
        Health                  : False
    PCIe Info
        Domain                  : 0000
        Bus                     : 00
        Dev                     : 0c
        Func                    : 0
    Device Mem Info
        Total Size              : 42976 MiB
        Reserved Size           : 1129 MiB
        Used Size               : 0 MiB
"""


def plugins(config: dict[str, object]) -> VendorPlugins:
    return VendorPlugins.from_plugins({"enflame": plugin}, config={"enflame": config}, strict=True)


def discovered(config: dict[str, object]) -> list[NodeInventory]:
    return plugins(config).discover()["enflame"]


def test_efml_reports_every_gcu_as_a_whole_card(fake_efml: Path, machine: Callable[..., Path]) -> None:
    machine(S60, S60_B)
    (inventory,) = discovered({"efmlLibrary": str(fake_efml)})
    assert inventory.kind == "GCU"
    assert inventory.devices == (
        Device(id="TR1V57100501", index=0, count=1, devmem=42976, devcore=100, type="S60", numa=0, vendor="Enflame"),
        Device(id="TPUH74190604", index=1, count=1, devmem=42976, devcore=100, type="S60", numa=1, vendor="Enflame"),
    )


def test_a_gcu_without_uuid_is_left_out_and_an_unreadable_health_is_unhealthy(
    fake_efml: Path, machine: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    machine(("-", "S60", 42976, "1", "0000:b0:00.0", 0), S60, (*S60_B[:3], "x", *S60_B[4:]))
    (inventory,) = discovered({"efmlLibrary": str(fake_efml)})
    assert [(d.id, d.index, d.health) for d in inventory.devices] == [("TR1V57100501", 1, True),
                                                                       ("TPUH74190604", 2, False)]  # fmt: skip
    assert (
        "Enflame GCU 0 is not reported: EFML EfmlGetDevUuid failed with status 254: Error, operate fail" in caplog.text
    )


def test_without_efml_the_gcus_are_read_from_efsmi_old_and_new_drivers(
    fake_efml: Path, machine: Callable[..., Path], efsmi: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    machine(S60)
    monkeypatch.setenv("FAKE_EFML_NO_DRIVER", "1")
    tool = efsmi(OLD_DRIVER + NEW_DRIVER)
    (inventory,) = discovered({"efmlLibrary": str(fake_efml), "efsmi": str(tool), "sysfsRoot": "/nonexistent"})
    assert [(d.id, d.index, d.devmem, d.type, d.health) for d in inventory.devices] == [
        ("TR1V57100501", 0, 42976, "S60", True), ("TPUH74190604", 1, 42976, "S60", False)]  # fmt: skip
    assert (
        "no EFML (EFML EfmlInit failed with status 6: Error, driver not loaded): Enflame GCUs are read from efsmi"
        in caplog.text
    )


def test_neither_efml_nor_efsmi_reports_no_gcu_and_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert discovered({"efmlLibrary": str(tmp_path / "absent.so"), "efsmi": str(tmp_path / "no-efsmi")}) == []
    assert "cannot be loaded" in caplog.text
    assert "this node reports no Enflame GCU" in caplog.text


def test_a_malformed_efsmi_block_names_the_tool_and_line_and_the_others_are_reported() -> None:
    report = parse_efsmi(OLD_DRIVER.replace("42976 MiB", "lots") + NEW_DRIVER)
    assert [g.uuid for g in report.gcus] == ["TPUH74190604"]
    assert report.problems == ["efsmi -q: GCU 0 is not reported: line 16: memory 'lots' is not '<n> MiB'"]
    with pytest.raises(ToolError, match="efsmi -q reports no GCU"):
        parse_efsmi("Enflame System Management Interface\n")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("DEV ID0123: MiBTotalSizeUUIDxHealthTrue\n\t")), max_size=300))
def test_efsmi_output_never_breaks_the_parser(text: str) -> None:
    try:
        report = parse_efsmi(text)
    except ToolError:
        return
    for gcu in report.gcus:
        Device(id=gcu.uuid, index=gcu.index, devmem=gcu.memory_mib)  # what discovery makes of it is a valid device


def gcu(uuid: str) -> ContainerDevice:
    return ContainerDevice(uuid=uuid, type="GCU", usedmem=100, usedcores=100)


def test_container_edits_name_the_cards_by_efml_index_whatever_name_the_placement_uses(
    fake_efml: Path, machine: Callable[..., Path]
) -> None:
    machine(S60, S60_B)
    h = plugins({"efmlLibrary": str(fake_efml)})
    h.discover()
    pod = Pod(name="p", uid="u")
    edits = h.container_edits("GCU", pod, 0, (gcu("node-a-GCU-1"), gcu("TR1V57100501")))
    assert edits.env == {"ENFLAME_VISIBLE_DEVICES": "1,0"}
    assert [(d.container_path, d.host_path) for d in edits.devices] == [
        ("/dev/gcu1", "/dev/gcu1"), ("/dev/gcu0", "/dev/gcu0"), ("/dev/gcuctl", "/dev/gcuctl")]  # fmt: skip
    with pytest.raises(HamiError, match="GCU GCU-elsewhere is not on this node"):
        h.container_edits("GCU", pod, 0, (gcu("GCU-elsewhere"),))


def test_a_host_process_sees_whole_cards_through_the_toolkit_selector() -> None:
    h = plugins({})
    assert h.host_environment("GCU", (gcu("a"), gcu("b")), [3, 1]) == {"ENFLAME_VISIBLE_DEVICES": "3,1"}
    assert h.host_environment("Enflame", (), []) is None
