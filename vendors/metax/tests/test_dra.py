"""MetaX's DRA facts: an sGPU card's MetaXLink group published as the ResourceSlice attribute ``linkZone``."""

from __future__ import annotations

from hami.dra.slices import build_slice
from hami.model import Device, NodeInventory
from hami.plugins import VendorPlugins
from hami_vendor_metax import plugin

WORD = "Metax-SGPU"


def _card(zone: object) -> Device:
    return Device(id="GPU-mx-0", index=0, count=16, devmem=65536, devcore=100, type=WORD, custom={"LinkZone": zone})


def test_a_linked_card_publishes_its_link_zone() -> None:
    plugins = VendorPlugins.from_plugins({"metax": plugin})
    spec = build_slice(plugins, "n", "hami.io", {WORD: NodeInventory(kind=WORD, devices=(_card(2),))})["spec"]
    assert spec["devices"][0]["attributes"]["linkZone"] == {"int": 2}


def test_an_unlinked_card_publishes_no_link_zone() -> None:
    plugins = VendorPlugins.from_plugins({"metax": plugin})
    for zone in (0, None, "1", True):
        assert "linkZone" not in plugins.dra_device(WORD, _card(zone)).attributes
