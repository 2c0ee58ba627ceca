"""What DCMI reads from each chip (memory in use, AI-core busy share, power, temperature) reaches the node monitor
(hami.testing.readings' checks): the fake DCMI answers ``dcmi_get_device_hbm_info`` (HBM chips, MB) or
``dcmi_get_device_memory_info_v3`` (310P's DDR), ``dcmi_get_device_utilization_rate`` (AI cores),
``dcmi_get_device_power_info`` (0.1 W) and ``dcmi_get_device_temperature`` from the file ``FAKE_DCMI_READINGS``
names. Read from npu-smi, the chips have no readings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hami.testing.readings import ReadingsNode, ReadingsTests


class TestReadingsOnHbmChips(ReadingsTests):
    @pytest.fixture
    def readings_node(self, ascend_node: Callable[..., Any], machines: Any) -> ReadingsNode:
        node = ascend_node(machines.b3_server(2))
        return ReadingsNode(node.plugins(), "Ascend910B3", [n.uuid for n in node.npus], "FAKE_DCMI_READINGS")


class TestReadingsOnDdrChips(ReadingsTests):
    @pytest.fixture
    def readings_node(self, ascend_node: Callable[..., Any], machines: Any) -> ReadingsNode:
        node = ascend_node(machines.p310_cards())
        return ReadingsNode(node.plugins(), "Ascend310P", [n.uuid for n in node.npus], "FAKE_DCMI_READINGS")
