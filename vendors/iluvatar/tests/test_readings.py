"""What ixML reads from each GPU (memory in use, busy share, power, temperature) reaches the node monitor
(hami.testing.readings' checks): the fake ixML answers ``nvmlDeviceGetMemoryInfo``, ``nvmlDeviceGetUtilizationRates``,
``nvmlDeviceGetPowerUsage`` (milliwatts) and ``nvmlDeviceGetTemperature`` from the file ``FAKE_IXML_READINGS`` names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hami.testing.readings import ReadingsNode, ReadingsTests


class TestReadings(ReadingsTests):
    @pytest.fixture
    def readings_node(self, ix: Any, tmp_path: Path) -> ReadingsNode:
        chips = [ix.Chip(f"GPU-4a1f0c2e-0000-0000-0000-00000000000{i}", minor=i, bus=0x8A + i) for i in range(2)]
        machine = ix.write_machine(tmp_path / "machine", ix.fake.ixml, chips)
        return ReadingsNode(ix.plugins(machine.config()), "BI-V150", [c.uuid for c in chips], "FAKE_IXML_READINGS")


def test_a_node_without_ixml_reads_nothing(ix: Any, tmp_path: Path) -> None:
    chips = [ix.Chip("GPU-4a1f0c2e-0000-0000-0000-000000000001")]
    machine = ix.write_machine(tmp_path / "machine", ix.fake.ixml, chips)
    plugins = ix.plugins(machine.config(ixmlLibrary=str(tmp_path / "missing.so")))
    assert plugins.device_readings("BI-V150") is None
