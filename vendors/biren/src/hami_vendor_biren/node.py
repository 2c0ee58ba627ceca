"""The node side of Biren: the cards read through BRML, the inventory, and the container's edits.

Owns, as HAMi's Biren device plugin (Project-HAMi/biren-device-plugin) does it:

* the cards of the last read, through core's `hami.vendordriver.DriverReader` in Biren's words (BRML only: the
  plugin reads no tool; without BRML the node reports no card, said once); a card BRML cannot name is left out with
  a line naming it, the node keeps serving the others; on simulated devices the inventory's cards;
* what BRML reads from the cards now, for the node monitor (`NodeRuntime.readings`, under each card's id);
* the inventory: each card registered by its ``card_<node id>`` (the id of ``/dev/biren/card_<id>``), its index in
  BRML's order, count 1 (a card serves one container), its memory in MiB, the product name as its type, cores 100;
* a container's edits for its cards: the device nodes ``<devRoot>/biren/card_<id>`` (``rw``),
  ``BR_PHY_CARDS`` (the card ids, comma-separated, which Biren's runtime reads), ``/dev/dri/renderD128`` with
  ``mountDriDevice``; with ``cdi``, the CDI devices ``birentech.com/gpu=card_<id>`` instead of the device nodes.
  A card the placement names that this node does not have is refused, as the plugin refuses it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from hami.model import ContainerEdits, ContainerPlacement, Device, DeviceNode, DeviceReading, NodeInventory
from hami.vendordriver import DriverReader, DriverWords, per_device
from hami.vendorstate import devices_named
from hami_vendor_biren.brml import Brml, BrmlError, Card
from hami_vendor_biren.settings import BirenSettings

__all__ = ["CARDS_ENV", "WORD", "NodeRuntime", "container_edits", "discover", "runtime_for", "simulate"]

log = logging.getLogger("hami_vendor_biren")

WORD = "Biren"
CARDS_ENV = "BR_PHY_CARDS"
RENDER_NODE = "/dev/dri/renderD128"
WORDS = DriverWords(
    "BRML",
    "the Biren cards",
    no_library="{error}: this node reports no Biren card",
    read_failed="reading the Biren cards failed ({error}): this node reports none until BRML answers",
    no_tool="{problem}",
    opened="BRML opened from {where}",
)


@dataclass
class NodeRuntime:
    settings: BirenSettings
    lock: threading.RLock = field(default_factory=threading.RLock)
    cards: list[Card] = field(default_factory=list)
    simulated: bool = False
    reader: DriverReader[Brml] = field(init=False)

    def __post_init__(self) -> None:
        self.reader = DriverReader(log, WORDS, lambda: Brml.open(self.settings.brml_library))

    def read_cards(self) -> list[Card]:
        with self.lock:
            if not self.simulated:
                self.cards = self.reader.read(self._from_brml) or []
            return self.cards

    def _from_brml(self, session: Brml) -> list[Card]:
        cards = []
        for index in range(session.count()):
            try:
                cards.append(session.card(index))
            except BrmlError as exc:
                log.error("Biren card %d is not reported: %s", index, exc)
        self.reader.said.forget()
        return cards

    def readings(self) -> list[DeviceReading] | None:
        """What BRML reads from this node's cards now; None on simulated devices, without BRML, or when it fails
        this round (the monitor then shows the cards' figures unknown)."""
        with self.lock:
            if self.simulated:
                return None
            cards = self.cards if self.reader.session is not None else self.read_cards()
            session = self.reader.session
            if session is None:
                return None
            return per_device(log, "the Biren cards' figures", cards, lambda c: [session.readings(c.index, c.card_id)])

    def card(self, card_id: str) -> Card:
        """:raises HamiError: this node has no such card (read again first)."""
        with self.lock:
            (card,) = devices_named(
                [card_id], self.cards, self.read_cards, what="Biren card", name_of=lambda c: c.card_id
            )
            return card


def runtime_for(settings: BirenSettings) -> NodeRuntime:
    return settings.runtime_of(NodeRuntime, lambda: NodeRuntime(settings))


def discover(settings: BirenSettings) -> list[NodeInventory]:
    cards = runtime_for(settings).read_cards()
    if not cards:
        return []
    devices = tuple(Device(id=c.card_id, index=c.index, count=1, devmem=c.memory_mib, devcore=100,
                           type=c.name or WORD, vendor=WORD) for c in cards)  # fmt: skip
    return [NodeInventory(kind=WORD, devices=devices)]


def simulate(settings: BirenSettings, devices: Sequence[Device]) -> None:
    """Simulated devices stand for this node's cards: id, index, model and memory are the inventory's."""
    runtime = runtime_for(settings)
    with runtime.lock:
        runtime.simulated = True
        runtime.cards = [Card(d.index, d.id, d.id, d.type, d.devmem) for d in devices]


def container_edits(settings: BirenSettings, devices: ContainerPlacement) -> ContainerEdits:
    if not devices:
        return ContainerEdits()
    runtime = runtime_for(settings)
    ids = [runtime.card(d.uuid).card_id for d in devices]
    env = {CARDS_ENV: ",".join(ids)}
    if settings.cdi:
        return ContainerEdits(env=env, cdi_devices=tuple(f"birentech.com/gpu={i}" for i in ids))
    root = settings.dev_root.rstrip("/")
    nodes = [DeviceNode(container_path=f"/dev/biren/{i}", host_path=f"{root}/biren/{i}") for i in ids]
    if settings.mount_dri_device:
        nodes.append(DeviceNode(container_path=RENDER_NODE, host_path=RENDER_NODE))
    return ContainerEdits(env=env, devices=tuple(nodes))
