"""Discovery through ixML: what a CoreX node registers, per chip, in HAMi's legacy string form.

Every test points the plugin at a fake ixML (conftest.py: ``libixml.so`` built from the documented NVML-compatible
API, reading a machine file), so the binding loads and calls it exactly as CoreX's.
"""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.codec import decode_legacy_register, decode_link_scores, encode_legacy_register
from hami.testing.hami_rules import counted_by_hami
from hami_vendor_iluvatar.discovery import chip_of
from hami_vendor_iluvatar.ixml import sysfs_bus_id
from hami_vendor_iluvatar.plugin import CHIPS

A = "GPU-1a2b3c4d-0000-4000-8000-00000000000a"
B = "GPU-1a2b3c4d-0000-4000-8000-00000000000b"
C = "GPU-1a2b3c4d-0000-4000-8000-00000000000c"


def test_a_bi_v150_board_registers_its_two_chips_as_hami_does(ix, machine):
    node = machine(ix.Chip(A, minor=0, bus=0x8A, numa=0), ix.Chip(B, minor=1, bus=0x8B, numa=1))
    found = ix.plugins(node.config()).discover()
    (inventory,) = found["iluvatar"]
    assert inventory.kind == "BI-V150"
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.type, d.numa, d.health) for d in inventory.devices] == [
        (A, 0, 10, 32768, 100, "BI-V150", 0, True),
        (B, 1, 10, 32768, 100, "BI-V150", 1, True),
    ]
    assert inventory.annotations["hami.io/iluvatar-mode"] == "gpu-manager"
    # the board's two chips are linked (ixML's nvmlDeviceOnSameBoard), in the form of HAMi's link scores
    assert decode_link_scores(inventory.annotations["hami.io/node-iluvatar-score"]) == {A: {B: 100}, B: {A: 100}}
    # HAMi's legacy string form round-trips: HAMi's scheduler reads what this daemon writes
    text = encode_legacy_register(inventory.devices)
    assert text == f"{A},10,32768,100,BI-V150,0,true,0,:{B},10,32768,100,BI-V150,1,true,1,:"
    assert [d.id for d in decode_legacy_register(text)] == [A, B]
    assert counted_by_hami((d.type for d in decode_legacy_register(text)), "BI-V150")  # HAMi's getNodeResources


def test_each_chip_kind_has_its_own_inventory_and_split_count_is_a_setting(ix, machine):
    node = machine(ix.Chip(A, "Iluvatar MR-V100", 0, 32768, 0x10), ix.Chip(B, "Iluvatar MR-V50", 1, 16384, 0x11),
                   ix.Chip(C, "Iluvatar BI-V100", 2, 32768, 0x12))  # fmt: skip
    found = {i.kind: i for i in ix.plugins(node.config(splitCount=4)).discover()["iluvatar"]}
    assert sorted(found) == ["BI-V100", "MR-V100", "MR-V50"]
    assert [d.id for d in found["MR-V50"].devices] == [B]
    assert found["MR-V50"].devices[0].devmem == 16384
    assert {d.count for i in found.values() for d in i.devices} == {4}


@pytest.mark.parametrize(
    ("name", "chip"),
    [("Iluvatar BI-V150S", "BI-V150"), ("Iluvatar BI-V100", "BI-V100"), ("Iluvatar MR-V100", "MR-V100"),
     ("MR-V50", "MR-V50"), ("iluvatar mr-v100", "MR-V100"), ("Iluvatar XX-V1", None), ("", None)],
)  # fmt: skip
def test_the_chip_is_read_from_ixmls_name(name, chip):
    assert chip_of(name, CHIPS) == chip


def test_a_gpu_of_no_known_chip_is_left_out_and_the_others_served(ix, machine, caplog):
    node = machine(ix.Chip(A, "Iluvatar ZZ-V9"), ix.Chip(B, minor=1, bus=0x8B))
    with caplog.at_level(logging.WARNING, "hami_vendor_iluvatar"):
        (inventory,) = ix.plugins(node.config()).discover()["iluvatar"]
    assert [d.id for d in inventory.devices] == [B]
    assert "ZZ-V9" in caplog.text
    assert "not reported" in caplog.text


def test_a_gpu_that_cannot_be_named_is_left_out_with_ixmls_reason(ix, machine, caplog):
    node = machine(ix.Chip("-"), ix.Chip(B, minor=1, bus=0x8B))
    with caplog.at_level(logging.ERROR, "hami_vendor_iluvatar"):
        (inventory,) = ix.plugins(node.config()).discover()["iluvatar"]
    assert [d.id for d in inventory.devices] == [B]
    assert "Iluvatar GPU 0 is not reported: ixML nvmlDeviceGetUUID failed: Unknown Error (999)" in caplog.text


def test_a_gpu_that_no_longer_answers_is_registered_unhealthy(ix, machine):
    node = machine(ix.Chip(A, healthy=False), ix.Chip(B, minor=1, bus=0x8B))
    (inventory,) = ix.plugins(node.config()).discover()["iluvatar"]
    assert [(d.id, d.health) for d in inventory.devices] == [(A, False), (B, True)]


def test_without_ixml_the_node_reports_nothing_and_says_why_once(ix, tmp_path, caplog):
    plugins = ix.plugins({"ixmlLibrary": str(tmp_path / "libixml.so")})
    with caplog.at_level(logging.WARNING, "hami_vendor_iluvatar"):
        assert plugins.discover() == {"iluvatar": []}
        assert plugins.discover() == {"iluvatar": []}
    assert caplog.text.count("this node reports no Iluvatar GPU") == 1


def test_another_projects_libixml_is_refused_by_name(ix, caplog):
    plugins = ix.plugins({"ixmlLibrary": str(ix.fake.not_ixml)})
    with caplog.at_level(logging.WARNING, "hami_vendor_iluvatar"):
        assert plugins.discover() == {"iluvatar": []}
    assert "has no nvmlInit_v2: it is not CoreX's ixML" in caplog.text


def test_a_driver_that_is_not_loaded_is_ixmls_own_message(ix, tmp_path, caplog, monkeypatch):
    node = ix.write_machine(tmp_path / "m", ix.fake.ixml, [ix.Chip(A)])
    monkeypatch.setenv("FAKE_IXML_FAIL_INIT", "1")
    with caplog.at_level(logging.WARNING, "hami_vendor_iluvatar"):
        assert ix.plugins(node.config()).discover() == {"iluvatar": []}
    assert "ixML nvmlInit_v2 failed: Driver Not Loaded (9)" in caplog.text


def test_the_soft_mode_is_published(ix, machine):
    node = machine(ix.Chip(A))
    (inventory,) = ix.plugins(node.config(iluvatarMode="hami-core")).discover()["iluvatar"]
    assert inventory.annotations == {"hami.io/iluvatar-mode": "hami-core"}  # one chip: no links


def test_chips_of_two_boards_are_linked_within_their_board_only(ix, machine):
    node = machine(ix.Chip(A, minor=0, bus=0x10, board=0), ix.Chip(B, minor=1, bus=0x11, board=1),
                   ix.Chip(C, minor=2, bus=0x12, board=1))  # fmt: skip
    (inventory,) = ix.plugins(node.config()).discover()["iluvatar"]
    assert decode_link_scores(inventory.annotations["hami.io/node-iluvatar-score"]) == {A: {}, B: {C: 100}, C: {B: 100}}


@given(st.text(max_size=64))
@settings(max_examples=200, deadline=None)
def test_any_name_or_bus_id_ixml_gives_is_read_without_an_error(text):
    chip = chip_of(text, CHIPS)
    assert chip is None or (chip in CHIPS and chip.upper() in text.upper())
    assert isinstance(sysfs_bus_id(text), str)


def test_ixmls_bus_id_is_read_as_sysfs_spells_it():
    assert sysfs_bus_id("00000000:8A:00.0") == "0000:8a:00.0"
    assert sysfs_bus_id("0000:8a:00.0") == "0000:8a:00.0"
