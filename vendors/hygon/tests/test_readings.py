"""What ROCm SMI reads from each DCU (VRAM in use, busy share, power, temperature) reaches the node monitor
(hami.testing.readings' checks): the fake ROCm SMI answers ``rsmi_dev_memory_usage_get``,
``rsmi_dev_busy_percent_get``, ``rsmi_dev_power_ave_get`` (microwatts) and ``rsmi_dev_temp_metric_get``
(millidegrees) from the file ``FAKE_DTK_READINGS`` names. Read from hy-smi, the DCUs have no readings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hami.testing.readings import ReadingsNode, ReadingsTests


class TestReadings(ReadingsTests):
    @pytest.fixture
    def readings_node(self, hygon_node: Callable[..., Any], fakes: Any) -> ReadingsNode:
        node = hygon_node(fakes.z100l_server(2))
        return ReadingsNode(node.plugins(), "DCU", [d.uuid for d in node.dcus], "FAKE_DTK_READINGS")


def test_dcus_read_from_hy_smi_have_no_readings(hygon_node: Callable[..., Any], fakes: Any) -> None:
    plugins = hygon_node(fakes.z100l_server(2)).plugins("hy-smi")
    assert plugins.discover()  # the DCUs are served
    assert plugins.device_readings("DCU") is None
