"""The device readings' checks every vendor runs over its fake management library (`hami_device_readings`, exported
by hami.node.monitor in HAMi's and HAMi-WebUI's device families, where the dashboard and the `usage` policy read them).

A vendor's fake management library answers its reading calls (memory in use, busy share, power, temperature) from
the file an environment variable names, re-read at every call, one device a line (``csrc/fake_readings.h``)::

    <device index> <memory used, bytes> <busy, percent> <power, milliwatts> <temperature, degrees Celsius>

the device index being the fake's own enumeration order, a figure written ``-`` one the library does not support
there (memory in use, which discovery's memory call also answers, then reads as nothing in use), each figure
converted by the fake into its call's unit (KiB, 0.1 W, ...): so a binding that reads a unit wrong fails these
checks. A vendor subclasses `ReadingsTests` in its test module and gives the `readings_node`
fixture::

    class TestReadings(ReadingsTests):
        @pytest.fixture
        def readings_node(self, ...) -> ReadingsNode:
            return ReadingsNode(host=..., kind="MLU", uuids=[...], readings_variable="FAKE_CNDEV_READINGS")

`figures` names the figures the vendor's library documents; the others must stay unknown whatever the fake holds.
This module only drives the real code: the plugin host's `device_readings`, the real `NodeMonitor`, and the
dashboard's reader of a node's /metrics (`hami.dashboard.usage.read_metrics`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hami.dashboard.usage import read_metrics
from hami.node.monitor import NodeMonitor
from hami.plugins import VendorPlugins

__all__ = ["ALL_FIGURES", "Figures", "ReadingsMachine", "ReadingsNode", "ReadingsTests", "exposition", "scrape"]

MiB = 1024 * 1024
ALL_FIGURES = frozenset({"memory", "busy", "power", "temperature"})

FAMILIES = {
    "memory": "hami_memory_used",
    "busy": "hami_core_util",
    "power": "hami_device_power",
    "temperature": "hami_device_temperature",
}
"""The HAMi-WebUI family each figure is exported in (per device, by ``device_uuid``)."""


@dataclass(frozen=True)
class Figures:
    """One device's line of the fake's readings file; None writes ``-`` (not supported)."""

    memory_used_bytes: int | None = None
    busy_percent: int | None = None
    power_milliwatts: int | None = None
    celsius: int | None = None

    def line(self, index: int) -> str:
        words = [self.memory_used_bytes, self.busy_percent, self.power_milliwatts, self.celsius]
        return " ".join([str(index), *("-" if w is None else str(w) for w in words)]) + "\n"


@dataclass(frozen=True)
class ReadingsNode:
    """A vendor's node over its fake management library, as the readings checks need it."""

    plugins: VendorPlugins
    """A plugin host with the vendor's plugin, configured to load the fake."""
    kind: str
    """The common word of the devices (the hook's routing)."""
    uuids: Sequence[str]
    """The devices' UUIDs (as discovery reports them) in the fake's index order; at least two."""
    readings_variable: str
    """The environment variable naming the file the fake reads its figures from."""
    figures: frozenset[str] = ALL_FIGURES
    """The figures the vendor's library documents (of `ALL_FIGURES`)."""


def exposition(plugins: VendorPlugins, node: str = "node-1") -> str:
    """The node daemon's /metrics text from a monitor over `host`'s discovery and readings, wired as the daemon wires
    it (its inventories, the vendors' `device_readings` of each kind)."""
    inventories = {inv.kind: inv for invs in plugins.discover().values() for inv in invs}
    monitor = NodeMonitor(
        node,
        lambda: inventories,
        list,
        device_usage=lambda: [r for kind in inventories for r in plugins.device_readings(kind) or ()],
    )
    return monitor.render().decode()


def scrape(plugins: VendorPlugins, node: str = "node-1") -> dict[str, dict[str, float]]:
    """family → device_uuid → value of `exposition`."""
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(exposition(plugins, node)):
        for s in family.samples:
            if "device_uuid" in s.labels:
                out.setdefault(s.name, {})[s.labels["device_uuid"]] = s.value
    return out


@dataclass
class ReadingsMachine:
    """The fake's readings file, written by the checks."""

    node: ReadingsNode
    file: Path

    def write(self, figures: Mapping[int, Figures]) -> None:
        self.file.write_text("".join(f.line(i) for i, f in sorted(figures.items())))

    def scrape(self) -> dict[str, dict[str, float]]:
        return scrape(self.node.plugins)


class ReadingsTests:
    """The readings over one vendor's management library; subclass it and give the `readings_node` fixture."""

    @pytest.fixture
    def readings_node(self) -> ReadingsNode:
        raise NotImplementedError("a vendor's ReadingsTests subclass gives the readings_node fixture")

    @pytest.fixture
    def machine(self, readings_node: ReadingsNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ReadingsMachine:
        assert len(readings_node.uuids) >= 2, "the readings checks need a node of two devices at least"
        assert readings_node.figures <= ALL_FIGURES, f"figures are some of {sorted(ALL_FIGURES)}"
        m = ReadingsMachine(readings_node, tmp_path / "device.readings")
        m.file.write_text("")
        monkeypatch.setenv(readings_node.readings_variable, str(m.file))
        return m

    def _exported(self, got: Mapping[str, Mapping[str, float]], figure: str, uuid: str) -> Any:
        return got.get(FAMILIES[figure], {}).get(uuid)

    def test_the_libraries_figures_reach_the_monitor_in_its_units(self, machine: ReadingsMachine) -> None:
        # figures exact in every unit a vendor's call uses (bytes, KiB, MiB; percent; mW, 0.1 W, W; °C)
        machine.write({0: Figures(20480 * MiB, 37, 251_000, 61), 1: Figures(1024 * MiB, 5, 90_000, 40)})
        got = machine.scrape()
        node = machine.node
        expected = {
            0: {"memory": 20480, "busy": 37, "power": 251, "temperature": 61},
            1: {"memory": 1024, "busy": 5, "power": 90, "temperature": 40},
        }
        for index, figures in expected.items():
            uuid = node.uuids[index]
            for figure, value in figures.items():
                if figure in node.figures:
                    assert self._exported(got, figure, uuid) == value, (uuid, figure)
                else:  # a figure the library does not document is never made up
                    assert self._exported(got, figure, uuid) is None, (uuid, figure)
        if "busy" in node.figures:
            assert got["hami_host_gpu_utilization_ratio"][node.uuids[0]] == 37

    def test_the_dashboard_reads_the_figures_the_monitor_exports(self, machine: ReadingsMachine) -> None:
        machine.write({0: Figures(20480 * MiB, 37, 251_000, 61), 1: Figures()})
        usage = read_metrics("node-1", "http://node-1:9394/metrics", exposition(machine.node.plugins), 0.0)
        first = usage.devices[machine.node.uuids[0]]
        shown = {"memory": first.memory_used, "busy": first.utilization, "power": first.power,
                 "temperature": first.temperature}  # fmt: skip
        for figure, value in {"memory": 20480, "busy": 37, "power": 251, "temperature": 61}.items():
            assert shown[figure] == (value if figure in machine.node.figures else None), figure
        second = usage.devices.get(machine.node.uuids[1])
        assert second is None or (second.utilization, second.power, second.temperature) == (None, None, None)

    def test_a_figure_the_library_does_not_support_is_unknown_not_zero(self, machine: ReadingsMachine) -> None:
        machine.write({0: Figures(), 1: Figures(1024 * MiB, 5, 90_000, 40)})
        got = machine.scrape()
        for figure in ("busy", "power", "temperature"):
            assert self._exported(got, figure, machine.node.uuids[0]) is None, figure
        assert got["hami_vgpu_count"][machine.node.uuids[0]] >= 1  # what the scheduler knows of the device stays

    def test_nonsense_from_the_library_is_unknown_not_zero(self, machine: ReadingsMachine) -> None:
        # a busy share of 250 %, 4,000 kW, 900 °C, memory in use above any device's
        machine.write({0: Figures(2**50, 250, 4_000_000_000, 900), 1: Figures(1024 * MiB, 5, 90_000, 40)})
        got = machine.scrape()
        for figure in sorted(machine.node.figures):
            assert self._exported(got, figure, machine.node.uuids[0]) is None, figure
            assert self._exported(got, figure, machine.node.uuids[1]) is not None, figure

    def test_each_scrape_reads_the_library_again(self, machine: ReadingsMachine) -> None:
        machine.write({0: Figures(1024 * MiB, 10, 100_000, 30), 1: Figures(1024 * MiB, 10, 100_000, 30)})
        first = machine.scrape()
        machine.write({0: Figures(2048 * MiB, 90, 300_000, 70), 1: Figures(1024 * MiB, 10, 100_000, 30)})
        second = machine.scrape()
        uuid = machine.node.uuids[0]
        for figure, before, after in (("memory", 1024, 2048), ("busy", 10, 90), ("power", 100, 300),
                                      ("temperature", 30, 70)):  # fmt: skip
            if figure in machine.node.figures:
                assert (self._exported(first, figure, uuid), self._exported(second, figure, uuid)) == (before, after)
