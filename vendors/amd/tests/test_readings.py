"""What AMD SMI reads from each GPU (VRAM in use, busy share, power, temperature) reaches the node monitor
(hami.testing.readings' checks): the fake AMD SMI answers ``amdsmi_get_gpu_memory_usage``,
``amdsmi_get_gpu_activity``, ``amdsmi_get_power_info`` (watts) and ``amdsmi_get_temp_metric`` from the file
``FAKE_AMDSMI_READINGS`` names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hami.testing.readings import ReadingsNode, ReadingsTests


class TestReadings(ReadingsTests):
    @pytest.fixture
    def readings_node(self, amd: Any, machine: Callable[..., Any]) -> ReadingsNode:
        gpus = [amd.gpu(0), amd.gpu(1)]
        return ReadingsNode(amd.plugins(machine(*gpus).config()), "AMD", [g.uuid for g in gpus], "FAKE_AMDSMI_READINGS")


def test_a_node_without_amd_smi_reads_nothing(amd: Any, machine: Callable[..., Any], tmp_path: Path) -> None:
    plugins = amd.plugins(machine(amd.gpu(0)).config(amdSmiLibrary=str(tmp_path / "missing.so")))
    assert plugins.device_readings("AMD") is None
