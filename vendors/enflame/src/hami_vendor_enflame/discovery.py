"""The node side's Enflame state: the GCUs of this node, read through EFML or ``efsmi``, and the inventory.

Owns the GCUs of the last read, which container edits use to turn a placement's device names into GCU indices
(`NodeRuntime.gcu_of`), read through core's `hami.vendordriver.DriverReader` in Enflame's words: EFML's session
(opened on first use, dropped and reopened after a failure), else ``efsmi -q``, and what the node lacks said once.
A GCU the driver cannot name is left out with an error line naming it; the node keeps serving the others. On
simulated devices (`NodeRuntime.simulate`, from `hami_simulated_devices`) the GCUs are the inventory's and no
driver is asked. For the node monitor, what EFML reads from the GCUs now (`NodeRuntime.readings`). One runtime per
settings object (`runtime_for`).

The inventory is HAMi's ``GCU`` kind only: whole cards, served to the kubelet as ``enflame.com/gcu`` (one device
per card), which HAMi's scheduler counts from the node's capacity, naming card ``i`` ``<node>-GCU-<i>``; the cards
themselves (UUID, memory, health, NUMA) are registered in this project's ``hami.io/node-enflame-gcu-register``,
which this scheduler reads before the capacity. DRS partitions (``enflame.com/drs-gcu``) are published and served
by Enflame's own DRS device plugin, as in HAMi (`hami_vendor_enflame.drs`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from hami import pcidevice
from hami.model import Device, DeviceReading, NodeInventory
from hami.vendordriver import DriverReader, DriverWords, per_device
from hami.vendorstate import capacity_index, devices_named
from hami_vendor_enflame.efml import Efml, EfmlError, Gcu, read_efsmi
from hami_vendor_enflame.settings import EnflameSettings

__all__ = ["GCU_REGISTER", "GCU_WORD", "NodeRuntime", "discover", "runtime_for"]

log = logging.getLogger("hami_vendor_enflame")

GCU_WORD = "GCU"
GCU_REGISTER = "hami.io/node-enflame-gcu-register"
WORDS = DriverWords(
    "EFML",
    "the Enflame GCUs",
    from_tool="{problem}: Enflame GCUs are read from efsmi instead",
    nothing="{problem}, and {error}: this node reports no Enflame GCU",
    opened="EFML opened from {where}",
)


@dataclass
class NodeRuntime:
    settings: EnflameSettings
    lock: threading.RLock = field(default_factory=threading.RLock)
    gcus: list[Gcu] = field(default_factory=list)
    simulated: bool = False
    reader: DriverReader[Efml] = field(init=False)

    def __post_init__(self) -> None:
        self.reader = DriverReader(log, WORDS, lambda: Efml.open(self.settings.efml_library), ("efml", "efsmi"))

    def simulate(self, gcus: list[Gcu]) -> None:
        with self.lock:
            self.simulated, self.gcus = True, gcus

    def read_gcus(self) -> list[Gcu]:
        """This node's GCUs now: from EFML, else from ``efsmi``; none (said once) without either."""
        with self.lock:
            if self.simulated:
                return self.gcus
            self.gcus = self.reader.read(self._from_efml, self._from_efsmi) or []
            return self.gcus

    def _from_efml(self, session: Efml) -> list[Gcu]:
        gcus = []
        for index in range(session.count()):
            try:
                gcus.append(session.gcu(index))
            except EfmlError as exc:
                log.error("Enflame GCU %d is not reported: %s", index, exc)
        self.reader.said.forget()
        return gcus

    def _from_efsmi(self) -> list[Gcu]:
        report = read_efsmi(self.settings.efsmi)
        for problem in report.problems:
            log.error("%s", problem)
        root = self.settings.sysfs_root
        return [
            Gcu(
                g.index,
                g.uuid,
                g.name,
                g.memory_mib,
                g.healthy,
                g.bus_id,
                pcidevice.numa_node(root, g.bus_id) if g.bus_id else None,
            )
            for g in report.gcus
        ]

    def readings(self) -> list[DeviceReading] | None:
        """What EFML reads from this node's GCUs now; None on simulated devices, without EFML (efsmi gives none
        here), or when it fails this round (the monitor then shows the GCUs' figures unknown)."""
        with self.lock:
            if self.simulated:
                return None
            gcus = self.gcus if self.reader.session is not None else self.read_gcus()
            session = self.reader.session
            if session is None:
                return None
            return per_device(log, "the Enflame GCUs' figures", gcus, lambda g: [session.readings(g.index, g.uuid)])

    def gcu_of(self, name: str) -> Gcu:
        """The GCU a placement names: its UUID, or HAMi's capacity name ``<node>-GCU-<index>``.

        :raises HamiError: no GCU of this node has that name (read again first)."""

        with self.lock:
            (gcu,) = devices_named([name], self.gcus, self.read_gcus, what="Enflame GCU", name_of=lambda g: g.uuid,
                                   answers=lambda g, n: g.uuid == n or capacity_index(n, "GCU") == g.index)  # fmt: skip
            return gcu


def runtime_for(settings: EnflameSettings) -> NodeRuntime:
    return settings.runtime_of(NodeRuntime, lambda: NodeRuntime(settings))


def inventory(gcus: Sequence[Gcu]) -> list[NodeInventory]:
    if not gcus:
        return []
    devices = tuple(
        Device(
            id=g.uuid,
            index=g.index,
            count=1,
            devmem=g.memory_mib,
            devcore=100,
            type=g.name or GCU_WORD,
            numa=-1 if g.numa is None else g.numa,
            health=g.healthy,
            vendor="Enflame",
        )
        for g in gcus
    )
    return [NodeInventory(kind=GCU_WORD, devices=devices)]


def discover(settings: EnflameSettings) -> list[NodeInventory]:
    """This node's Enflame inventory; ``[]`` without a driver or a GCU."""
    return inventory(runtime_for(settings).read_gcus())


def simulate(settings: EnflameSettings, devices: Sequence[Device]) -> None:
    """Simulated devices stand for this node's GCUs (`hami_simulated_devices`): index, UUID, model and memory are
    the inventory's."""
    runtime_for(settings).simulate(
        [Gcu(d.index, d.id, d.type, d.devmem, d.health, numa=d.numa if d.numa >= 0 else None) for d in devices]
    )
