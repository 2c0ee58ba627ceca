"""What MXSML reads from each card (VRAM in use, busy share, power, temperature) reaches the node monitor
(hami.testing.readings' checks): the fake MXSML answers ``mxSmlGetMemoryInfo`` (KB), ``mxSmlGetDeviceIpUsage``
(Xcore), ``mxSmlGetBoardPowerInfo`` (three ways, mW each) and ``mxSmlGetTemperatureInfo`` (hotspot, degrees x 100)
from the file ``FAKE_MXSML_READINGS`` names. Read from mx-smi, the cards have no readings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hami.testing.readings import ReadingsNode, ReadingsTests


class TestReadings(ReadingsTests):
    @pytest.fixture
    def readings_node(self, metax_node: Callable[..., Any], fakes: Any) -> ReadingsNode:
        node = metax_node(fakes.c500_server(2))
        return ReadingsNode(node.plugins(), "Metax-SGPU", [g.uuid for g in node.gpus], "FAKE_MXSML_READINGS")


class TestReadingsOnWholeCards(ReadingsTests):
    @pytest.fixture
    def readings_node(self, metax_node: Callable[..., Any], fakes: Any) -> ReadingsNode:
        node = metax_node(fakes.c500_server(2))
        return ReadingsNode(
            node.plugins(nodeKind="gpu"), "Metax-GPU", [g.uuid for g in node.gpus], "FAKE_MXSML_READINGS"
        )


def test_cards_read_from_mx_smi_have_no_readings(metax_node: Callable[..., Any], fakes: Any) -> None:
    plugins = metax_node(fakes.c500_server(2)).plugins("mx-smi")
    assert plugins.discover()  # the cards are served
    assert plugins.device_readings("Metax-SGPU") is None
