"""The node side's Ascend state: where the chips are read from, and the chips last read.

Owns the choice of source (DCMI through `hami_vendor_ascend.dcmi` when ``libdcmi.so`` loads, else ``npu-smi info``
through `hami_vendor_ascend.npusmi`), the session's lifecycle (opened on first use, dropped and reopened after a
failure), the messages about a missing driver (each said once, and once more when it changes), and the chips of
the last read, which container edits use to turn a placement's UUIDs into the physical ids the Ascend container
runtime wants. On simulated devices (`simulate`, from `hami_simulated_devices`) the chips are the inventory's and
no driver is asked.

One runtime per settings object: `runtime_for(settings)` attaches it to the settings the host loaded, so it lives as
long as that host and two hosts (two tests) never share one. Reads are serialized by `NodeRuntime.lock`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from hami.errors import HamiError
from hami_vendor_ascend.dcmi import Dcmi, DcmiError, DcmiUnavailable, NpuChip
from hami_vendor_ascend.npusmi import NpuSmiError, read_chips
from hami_vendor_ascend.settings import AscendSettings

__all__ = ["NodeRuntime", "runtime_for"]

log = logging.getLogger("hami_vendor_ascend")


@dataclass
class NodeRuntime:
    """The DCMI session and the chips of this node."""

    settings: AscendSettings
    lock: threading.RLock = field(default_factory=threading.RLock)
    dcmi: Dcmi | None = None
    chips: list[NpuChip] = field(default_factory=list)
    """The chips of the last read, in the driver's order."""
    source: str = ""
    """Where they were read: ``dcmi``, ``npu-smi``, or empty when nothing could be read."""
    _said: str = ""
    _dcmi_problem: str = "libdcmi.so not loaded"
    simulated: dict[str, list[NpuChip]] | None = None
    """The chips a simulated inventory stands in for the driver with, by kind (`simulate`); None on hardware."""

    def simulate(self, common_word: str, chips: list[NpuChip]) -> None:
        """From now on, this node's chips of kind `common_word` are `chips` and no driver is read."""
        with self.lock:
            self.simulated = {**(self.simulated or {}), common_word: chips}
            self.chips = [chip for group in self.simulated.values() for chip in group]
            self.source = "simulated"

    def _say(self, level: int, message: str) -> None:
        if message != self._said:
            log.log(level, message)
            self._said = message

    def session(self) -> Dcmi | None:
        """The open DCMI session, opening it when needed; None when DCMI is not available."""
        with self.lock:
            if self.dcmi is None:
                try:
                    self.dcmi = Dcmi.open(self.settings.dcmi_library)
                except DcmiUnavailable as exc:
                    self._dcmi_problem = str(exc)
                    return None
                log.info("DCMI opened from %s", self.dcmi.where)
            return self.dcmi

    def read_chips(self) -> list[NpuChip]:
        """This node's chips now: from DCMI, else from npu-smi; none (said once in the log) when neither works."""
        with self.lock:
            if self.simulated is not None:
                return self.chips
            chips: list[NpuChip] | None = None
            dcmi_problem = ""
            dcmi = self.session()
            if dcmi is not None:
                try:
                    chips = dcmi.chips()
                    self.source = "dcmi"
                except DcmiError as exc:
                    dcmi_problem = f"reading the chips through DCMI failed ({exc})"
                    self.dcmi = None  # reopened next time
            else:
                dcmi_problem = f"no DCMI ({self._dcmi_problem})"
            if chips is None:
                try:
                    chips = read_chips(self.settings.npu_smi)
                    self.source = "npu-smi"
                    self._say(logging.WARNING, f"{dcmi_problem}: Ascend chips are read from `npu-smi info` instead")
                except NpuSmiError as exc:
                    self.source = ""
                    chips = []
                    self._say(logging.WARNING, f"{dcmi_problem}, and {exc}: this node reports no Ascend devices")
            elif self.source == "dcmi":
                self._say(logging.INFO, f"Ascend chips are read through DCMI ({len(chips)} found)")
            self.chips = chips
            return chips

    def physical_ids(self, uuids: Sequence[str]) -> list[int]:
        """The physical ids of the chips with these UUIDs (read the chips again when one is not known).

        :raises HamiError: a UUID is not a chip of this node.
        """
        with self.lock:
            by_uuid = {c.uuid: c.phy_id for c in self.chips if c.uuid}
            if any(u not in by_uuid for u in uuids):
                by_uuid = {c.uuid: c.phy_id for c in self.read_chips() if c.uuid}
            missing = [u for u in uuids if u not in by_uuid]
            if missing:
                raise HamiError(
                    f"Ascend device {', '.join(missing)} is not on this node (it has "
                    f"{', '.join(sorted(by_uuid)) or 'no Ascend device'}): the pod was placed from an outdated view"
                )
            return [by_uuid[u] for u in uuids]


_attaching = threading.Lock()


def runtime_for(settings: AscendSettings) -> NodeRuntime:
    """The node runtime attached to `settings`, created on first use."""
    with _attaching:
        runtime = settings.runtime
        if not isinstance(runtime, NodeRuntime):
            runtime = NodeRuntime(settings)
            settings.attach_runtime(runtime)
        return runtime
