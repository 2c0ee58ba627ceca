"""The node side's Ascend state: where the chips are read from, and the chips last read.

Owns the choice of source (DCMI through `hami_vendor_ascend.dcmi` when ``libdcmi.so`` loads, else ``npu-smi info``
through `hami_vendor_ascend.npusmi`; core's `hami.vendordriver.DriverReader` makes the choice, keeps the session
(opened on first use, dropped and reopened after a failure) and says, once and once more when it changes, what a
missing driver means, in the words given here), and the chips of the last read, which container edits use to turn a
placement's UUIDs into the physical ids the Ascend container runtime wants. On simulated devices (`simulate`, from
`hami_simulated_devices`) the chips are the inventory's and no driver is asked.

One runtime per settings object: `runtime_for(settings)` attaches it to the settings the `VendorPlugins` loaded
(core's `hami.vendorstate.VendorSettings`), so it lives as long as they do and two of them (two tests) never share
one. Reads are serialized by `NodeRuntime.lock`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from hami.vendordriver import DriverReader, DriverWords
from hami.vendorstate import devices_named
from hami_vendor_ascend.dcmi import Dcmi, NpuChip
from hami_vendor_ascend.npusmi import read_chips
from hami_vendor_ascend.settings import AscendSettings

__all__ = ["NodeRuntime", "runtime_for"]

log = logging.getLogger("hami_vendor_ascend")


WORDS = DriverWords(
    "DCMI",
    "the chips",
    from_tool="{problem}: Ascend chips are read from `npu-smi info` instead",
    nothing="{problem}, and {error}: this node reports no Ascend devices",
    from_library="Ascend chips are read through DCMI ({count} found)",
    opened="DCMI opened from {where}",
)


@dataclass
class NodeRuntime:
    """The DCMI session and the chips of this node."""

    settings: AscendSettings
    lock: threading.RLock = field(default_factory=threading.RLock)
    chips: list[NpuChip] = field(default_factory=list)
    """The chips of the last read, in the driver's order."""
    simulated: dict[str, list[NpuChip]] | None = None
    """The chips a simulated inventory stands in for the driver with, by kind (`simulate`); None on hardware."""
    reader: DriverReader[Dcmi] = field(init=False)

    def __post_init__(self) -> None:
        self.reader = DriverReader(log, WORDS, lambda: Dcmi.open(self.settings.dcmi_library), ("dcmi", "npu-smi"))

    @property
    def dcmi(self) -> Dcmi | None:
        """The open DCMI session, or None."""
        return self.reader.session

    @property
    def source(self) -> str:
        """Where the chips were read: ``dcmi``, ``npu-smi``, ``simulated``, or empty when nothing could be read."""
        return self.reader.source

    def simulate(self, common_word: str, chips: list[NpuChip]) -> None:
        """From now on, this node's chips of kind `common_word` are `chips` and no driver is read."""
        with self.lock:
            self.simulated = {**(self.simulated or {}), common_word: chips}
            self.chips = [chip for group in self.simulated.values() for chip in group]
            self.reader.source = "simulated"

    def session(self) -> Dcmi | None:
        """The open DCMI session, opening it when needed; None when DCMI is not available."""
        with self.lock:
            return self.reader.opened()

    def read_chips(self) -> list[NpuChip]:
        """This node's chips now: from DCMI, else from npu-smi; none (said once in the log) when neither works."""
        with self.lock:
            if self.simulated is not None:
                return self.chips
            self.chips = self.reader.read(Dcmi.chips, lambda: read_chips(self.settings.npu_smi)) or []
            return self.chips

    def physical_ids(self, uuids: Sequence[str]) -> list[int]:
        """The physical ids of the chips with these UUIDs (read the chips again when one is not known).

        :raises HamiError: a UUID is not a chip of this node.
        """
        with self.lock:
            named = [c for c in self.chips if c.uuid]
            chips = devices_named(uuids, named, lambda: [c for c in self.read_chips() if c.uuid],
                                  what="Ascend device", name_of=lambda c: c.uuid or "")  # fmt: skip
            return [c.phy_id for c in chips]


def runtime_for(settings: AscendSettings) -> NodeRuntime:
    """The node runtime attached to `settings`, created on first use."""
    return settings.runtime_of(NodeRuntime, lambda: NodeRuntime(settings))
