"""The node side's MetaX state: where GPUs are read from, and the GPUs last read.

Owns the choice of source (MXSML through `hami_vendor_metax.mxsml` when ``libmxsml.so`` loads, else ``mx-smi``
through `hami_vendor_metax.mxsmi`: core's `hami.vendordriver.DriverReader`, which keeps the session, opened on first
use, dropped and reopened after a failure, and says what a missing driver means once, in MetaX's words), the NUMA
node of each card (sysfs, by PCI address), and the devices of the last read, which allocation and container edits use
to turn a placement into cards: a real UUID, or HAMi's capacity-derived name ``<node>-metax-<i>`` for card ``i``
(what HAMi's scheduler writes for whole cards). Without any driver (simulated devices), a placement's names give the
card indices.

For the node-side backstop, `NodeRuntime.processes`: each card's processes and the memory MXSML counts for each (none
where the cards come from mx-smi); for the node monitor, `NodeRuntime.readings`: each card's VRAM in use, busy
share, power and temperature from MXSML (none from mx-smi). One runtime per settings object (`runtime_for`), so
that two `VendorPlugins` (two tests) never share one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from hami.model import DeviceProcess, DeviceReading
from hami.pcidevice import numa_node
from hami.vendordriver import DriverReader, DriverWords, per_device
from hami.vendorstate import capacity_index, devices_named, trailing_index
from hami_vendor_metax.mxsmi import read_devices
from hami_vendor_metax.mxsml import MetaxGpu, Mxsml
from hami_vendor_metax.settings import MetaxSettings

T = TypeVar("T")

__all__ = ["CAPACITY_NAME", "Card", "NodeRuntime", "runtime_for"]

log = logging.getLogger("hami_vendor_metax")

CAPACITY_NAME = "metax"
"""HAMi's capacity-derived whole-card names: ``<node>-metax-<i>``."""


@dataclass(frozen=True)
class Card:
    """One card of this node: what the driver reports, and its NUMA node."""

    gpu: MetaxGpu
    numa: int = 0

    @property
    def uuid(self) -> str:
        return self.gpu.uuid

    @property
    def index(self) -> int:
        return self.gpu.index


WORDS = DriverWords(
    "MXSML",
    "the GPUs",
    from_tool="{problem}: MetaX GPUs are read from mx-smi instead",
    nothing="{problem}, and {error}: this node reports no MetaX GPU",
)


@dataclass
class NodeRuntime:
    settings: MetaxSettings
    lock: threading.RLock = field(default_factory=threading.RLock)
    cards: list[Card] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """What the last read could not use (malformed tool lines, devices left out)."""
    reader: DriverReader[Mxsml] = field(init=False)

    def __post_init__(self) -> None:
        self.reader = DriverReader(log, WORDS, lambda: Mxsml.open(self.settings.mxsml_library), ("mxsml", "mx-smi"))

    @property
    def session(self) -> Mxsml | None:
        """The open MXSML session, or None."""
        return self.reader.session

    @property
    def source(self) -> str:
        """Where the cards were last read from: ``mxsml``, ``mx-smi``, or empty (nowhere)."""
        return self.reader.source

    def read_cards(self) -> list[Card]:
        """This node's cards now, from MXSML, else mx-smi; none (said once) when neither works."""
        with self.lock:
            self.problems = []
            gpus = self.reader.read(Mxsml.devices, self._from_mx_smi) or []
            for p in self.problems:
                log.error("%s", p)
            self.cards = [Card(g, numa_node(self.settings.sysfs_root, g.bdf) or 0) for g in gpus]
            return self.cards

    def _from_mx_smi(self) -> list[MetaxGpu]:
        report = read_devices(self.settings.mx_smi)
        self.problems = report.problems
        return report.devices

    def card_of(self, uuid: str) -> Card:
        """The card a placement names: a real UUID, or HAMi's capacity name ``<node>-metax-<index>``.

        On a node with no MetaX driver at all (neither MXSML nor mx-smi: simulated devices, `hami demo`), a name
        ending in ``-<index>`` stands for that card, of unknown PCI address (so no DRM node is known for it).

        :raises HamiError: no card of this node has that name (read again first).
        """

        def stand_in(name: str) -> Card | None:
            index = trailing_index(name)
            if self.source or index is None:
                return None
            self.reader.said(logging.WARNING, "no MetaX driver on this node: card indices are taken from device names")
            return Card(MetaxGpu(index, name, "", "", 0, 0))

        with self.lock:
            (card,) = devices_named([uuid], self.cards, self.read_cards, what="MetaX GPU", name_of=lambda c: c.uuid,
                                    answers=lambda c, n: c.uuid == n or capacity_index(n, "metax") == c.index,
                                    stand_in=stand_in)  # fmt: skip
            return card

    def processes(self) -> list[DeviceProcess] | None:
        """Each process on this node's cards and the memory MXSML counts for it; None without MXSML, or when it
        fails this round (the backstop then checks nothing rather than something half-read)."""
        return self._per_card("processes", lambda session, card: [
            DeviceProcess(device_uuid=card.uuid, pid=pid, used_bytes=used)
            for pid, used in session.processes(card.index, card.gpu.bdf)])  # fmt: skip

    def readings(self) -> list[DeviceReading] | None:
        """What MXSML reads from this node's cards now; None as for `processes` (the monitor then shows the cards'
        figures unknown)."""
        return self._per_card("figures", lambda session, card: [session.readings(card.index, card.uuid)])

    def _per_card(self, what: str, read: Callable[[Mxsml, Card], list[T]]) -> list[T] | None:
        with self.lock:
            cards = self.cards if self.session is not None else self.read_cards()
            session = self.session
            if session is None:
                return None
            return per_device(log, f"the MetaX GPUs' {what}", cards, lambda card: read(session, card))

    def cards_of(self, uuids: Sequence[str]) -> list[Card]:
        return [self.card_of(u) for u in uuids]


def runtime_for(settings: MetaxSettings) -> NodeRuntime:
    """The node runtime attached to `settings`, created on first use."""
    return settings.runtime_of(NodeRuntime, lambda: NodeRuntime(settings))
