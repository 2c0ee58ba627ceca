"""What BRML reads from each card (memory in use, busy share, power, temperatures) reaches the node monitor
(hami.testing.readings' checks): the fake BRML answers ``brmlDeviceGetMemoryInfo``, ``brmlDeviceGetUtilizationRates``,
``brmlDeviceGetPowerUsage`` (milliwatts) and ``brmlDeviceGetTemperature`` from the file ``FAKE_BRML_READINGS`` names,
under each card's registered id (``card_<node id>``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import hami_vendor_biren.plugin as plugin
from hami.plugins import VendorPlugins
from hami.testing.readings import ReadingsNode, ReadingsTests

CARDS = [("BR-0001", "BR106C", 65536, 3), ("BR-0002", "BR106C", 65536, 7)]


def biren_host(library: Path) -> VendorPlugins:
    return VendorPlugins.from_plugins({"biren": plugin}, config={"biren": {"brmlLibrary": str(library)}})


class TestReadings(ReadingsTests):
    @pytest.fixture
    def readings_node(self, machine: Callable[..., Path], fake_brml: Path) -> ReadingsNode:
        machine(*CARDS)
        return ReadingsNode(biren_host(fake_brml), "Biren", ["card_3", "card_7"], "FAKE_BRML_READINGS")


def test_the_memory_sensor_is_the_memory_temperature(
    machine: Callable[..., Path], fake_brml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine(*CARDS)
    (tmp_path / "readings").write_text("1 - - - 48\n")
    monkeypatch.setenv("FAKE_BRML_READINGS", str(tmp_path / "readings"))
    readings = {r.device_uuid: r for r in biren_host(fake_brml).device_readings("Biren") or []}
    assert (readings["card_7"].temperature_celsius, readings["card_7"].memory_temperature_celsius) == (48, 48)
    assert readings["card_3"].temperature_celsius is None


def test_a_node_without_brml_reads_nothing(machine: Callable[..., Path], tmp_path: Path) -> None:
    machine(*CARDS)
    assert biren_host(tmp_path / "absent.so").device_readings("Biren") is None
