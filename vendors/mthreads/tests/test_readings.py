"""What MTML reads from each GPU (memory in use, busy share, power, temperature) reaches the node monitor
(hami.testing.readings' checks): the fake MTML answers ``mtmlMemoryGetUsed``, ``mtmlGpuGetUtilization``,
``mtmlGpuGetTemperature`` (of the GPU object) and ``mtmlDeviceGetPowerUsage`` (milliwatts) from the file
``FAKE_MTML_READINGS`` names. Read from mthreads-gmi, the GPUs have no readings."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pytest

from hami.testing.readings import Figures, ReadingsMachine, ReadingsNode, ReadingsTests


class TestReadings(ReadingsTests):
    @pytest.fixture
    def readings_node(self, mthreads_node: Callable[..., Any], fakes: Any) -> ReadingsNode:
        node = mthreads_node(fakes.s4000_server(2))
        return ReadingsNode(node.plugins(), "Mthreads", [g.uuid for g in node.gpus], "FAKE_MTML_READINGS")

    def test_every_object_a_reading_opens_is_freed(self, machine: ReadingsMachine, fake_mtml: Any) -> None:
        machine.write({0: Figures(1024 * 2**20, 10, 100_000, 30), 1: Figures()})
        library = ctypes.CDLL(str(fake_mtml))
        machine.scrape()
        before = library.fake_mtml_live_objects()
        machine.scrape()
        assert library.fake_mtml_live_objects() == before


def test_gpus_read_from_mthreads_gmi_have_no_readings(mthreads_node: Callable[..., Any], fakes: Any) -> None:
    plugins = mthreads_node(fakes.s4000_server(2)).plugins("mthreads-gmi")
    assert plugins.discover()  # the GPUs are served
    assert plugins.device_readings("Mthreads") is None
