"""What CNDev reads from each card (memory in use, busy share, power, temperature) reaches the node monitor
(hami.testing.readings' checks): the fake CNDev answers the memory calls (MB), ``cndevGetDeviceUtilizationInfo``,
``cndevGetDevicePowerInfo`` (W) and ``cndevGetTemperatureInfo`` from the file ``FAKE_CNDEV_READINGS`` names; an
older driver (without ``cndevGetMemoryUsageV2``) through ``cndevGetMemoryUsage``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hami.testing.readings import ReadingsNode, ReadingsTests

CARDS = [(f"a1b2c3d4-0000-0000-0000-00000000000{i}", "MLU370-X8", 24576, 8, 1) for i in range(2)]
UUIDS = [f"MLU-{card[0]}" for card in CARDS]


class TestReadings(ReadingsTests):
    @pytest.fixture
    def readings_node(self, mlu_node: Callable[..., Any]) -> ReadingsNode:
        return ReadingsNode(mlu_node(CARDS), "MLU", UUIDS, "FAKE_CNDEV_READINGS")


class TestReadingsOnAnOlderDriver(ReadingsTests):
    @pytest.fixture
    def readings_node(self, mlu_node: Callable[..., Any]) -> ReadingsNode:
        return ReadingsNode(mlu_node(CARDS, variant="old"), "MLU", UUIDS, "FAKE_CNDEV_READINGS")
