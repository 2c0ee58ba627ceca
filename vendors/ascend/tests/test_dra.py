"""Ascend's DRA facts: the chip's attributes, and in template mode the vNPU templates as the only memory sizes a
share of a chip may take, published in the node's ResourceSlice."""

from __future__ import annotations

from hami.dra.slices import build_slice
from hami.model import Device, NodeInventory
from hami.plugins import VendorPlugins
from hami_vendor_ascend import plugin
from hami_vendor_ascend.chips import DEFAULT_CHIPS


def _host(mode: str) -> VendorPlugins:
    return VendorPlugins.from_plugins({"ascend": plugin}, config={"ascend": {"hamiVnpuMode": mode}})


def _chip_device(word: str) -> Device:
    chip = DEFAULT_CHIPS[word]
    return Device(id=f"{word}-0", index=0, count=4, devmem=chip.memory_allocatable, devcore=chip.ai_core, type=word)


def test_template_mode_publishes_the_templates_and_the_whole_card_as_the_memory_sizes() -> None:
    word = "Ascend910B3"
    chip = DEFAULT_CHIPS[word]
    device = _chip_device(word)
    spec = build_slice(_host("template"), "n", "hami.io", {word: NodeInventory(kind=word, devices=(device,))})["spec"]
    [entry] = spec["devices"]
    assert entry["attributes"]["chip"] == {"string": chip.chip_name}
    assert entry["attributes"]["aiCore"] == {"int": chip.ai_core}
    policy = entry["capacity"]["hami.io/memory"]["requestPolicy"]
    sizes = sorted({t.memory for t in chip.templates})
    assert policy["validValues"] == [f"{m}Mi" for m in (*sizes, chip.memory_allocatable)]
    assert policy["default"] == f"{chip.memory_allocatable}Mi"


def test_soft_split_mode_publishes_any_memory_in_mib() -> None:
    word = "Ascend910B3"
    facts = _host("hami-core").dra_device(word, _chip_device(word))
    assert facts.memory_values_mib == ()
    assert facts.attributes["chip"] == DEFAULT_CHIPS[word].chip_name


def test_the_hccs_group_is_published_as_network_id_when_discovery_knows_it() -> None:
    word = "Ascend910B3"
    grouped = _chip_device(word).model_copy(update={"custom": {"NetworkID": 1}})
    plugins = _host("template")
    assert plugins.dra_device(word, grouped).attributes["networkID"] == 1
    spec = build_slice(plugins, "n", "hami.io", {word: NodeInventory(kind=word, devices=(grouped,))})["spec"]
    assert spec["devices"][0]["attributes"]["networkID"] == {"int": 1}
    assert "networkID" not in plugins.dra_device(word, _chip_device(word)).attributes
