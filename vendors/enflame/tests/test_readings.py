"""What EFML reads from each GCU (memory in use, busy share, power, temperature) reaches the node monitor
(hami.testing.readings' checks): the fake EFML answers ``EfmlGetDevMem`` (MiB), ``EfmlGetDevDtuUsage``,
``EfmlGetDevPwr`` (W) and ``EfmlGetDevTemp`` (floats) from the file ``FAKE_EFML_READINGS`` names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import hami_vendor_enflame.plugin as plugin
from hami.plugins import VendorPlugins
from hami.testing.readings import ReadingsNode, ReadingsTests, scrape

GCUS = [
    ("GCU-0d6c1b2a-0000-4000-8000-00000000000a", "S60", 49152, "1", "0000:b0:00.0", 0),
    ("GCU-0d6c1b2a-0000-4000-8000-00000000000b", "S60", 49152, "1", "0000:b1:00.0", 0),
]


def enflame_host(fake_efml: Path) -> VendorPlugins:
    return VendorPlugins.from_plugins({"enflame": plugin}, config={"enflame": {"efmlLibrary": str(fake_efml)}})


class TestReadings(ReadingsTests):
    @pytest.fixture
    def readings_node(self, machine: Callable[..., Path], fake_efml: Path) -> ReadingsNode:
        machine(*GCUS)
        return ReadingsNode(enflame_host(fake_efml), "GCU", [g[0] for g in GCUS], "FAKE_EFML_READINGS")


def test_the_hbm_temperature_is_the_memory_temperature(
    machine: Callable[..., Path], fake_efml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine(*GCUS)
    (tmp_path / "readings").write_text("0 - 10 100000 55\n")
    monkeypatch.setenv("FAKE_EFML_READINGS", str(tmp_path / "readings"))
    plugins = enflame_host(fake_efml)
    (first, _) = plugins.device_readings("GCU") or []
    assert (first.temperature_celsius, first.memory_temperature_celsius) == (55, 55)
    assert scrape(plugins)["hami_device_temperature"][GCUS[0][0]] == 55


def test_a_node_without_efml_reads_nothing(machine: Callable[..., Path], tmp_path: Path) -> None:
    machine(*GCUS)
    config = {"efmlLibrary": str(tmp_path / "absent.so"), "efsmi": str(tmp_path / "no-efsmi")}
    plugins = VendorPlugins.from_plugins({"enflame": plugin}, config={"enflame": config})
    assert plugins.device_readings("GCU") is None
