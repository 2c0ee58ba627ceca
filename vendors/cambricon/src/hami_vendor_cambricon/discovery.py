"""Discovery: this node's MLUs through CNDev, as the node publishes them.

Owns the node runtime (`NodeRuntime`: the CNDev session, opened on first use and reopened after a failure, and the
cards of the last read, which allocation and container edits use to turn a placement into card indices) and the
`NodeInventory` of kind ``MLU``: per card the UUID (``MLU-<uuid>``, as Cambricon's device plugin names it), its
CNDev index, 100 slots (HAMi's ``Count`` for an MLU), the memory in MiB, 100 % compute, the card name as type
(``MLU370-X8``, which ``cambricon.com/use-mlutype`` matches), NUMA 0 and health.

What is published, and why: HAMi v2.10 has no register annotation for MLUs; its scheduler counts the MLUs from
the node's ``cambricon.com/mlu.smlu.vcore`` capacity (100 per card) and splits the
``cambricon.com/mlu.smlu.vmemory`` capacity (256 MiB units) evenly, naming the cards ``<node>-cambricon-mlu-<i>``.
The node daemon serves those two resources so HAMi's scheduler reads this node; it also publishes the JSON register
annotation `REGISTER_ANNOTATION` with the real cards, which this project's scheduler reads before the capacity, so
it fits per card (real UUIDs, memory and health of each card). A card CNDev gives no UUID is not published.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from hami.errors import HamiError
from hami.model import Device, NodeInventory
from hami_vendor_cambricon import smlu
from hami_vendor_cambricon.cndev import Cndev, CndevError, CndevUnavailable, MluCard
from hami_vendor_cambricon.settings import CambriconSettings

__all__ = ["CAPACITY_NAME", "REGISTER_ANNOTATION", "NodeRuntime", "discover", "inventory", "runtime_for"]

log = logging.getLogger("hami_vendor_cambricon")

REGISTER_ANNOTATION = "hami.io/node-cambricon-mlu-register"
"""This project's per-card register (JSON, HAMi's device form); HAMi's own scheduler ignores it."""
CAPACITY_NAME = "cambricon-mlu"
"""HAMi's capacity-derived card names: ``<node>-cambricon-mlu-<i>``."""
_CAPACITY_ID = re.compile(r".+-cambricon-mlu-([0-9]+)", re.DOTALL)
_TRAILING_INDEX = re.compile(r".+-([0-9]+)", re.DOTALL)


@dataclass
class NodeRuntime:
    """The CNDev session and the MLU cards of this node."""

    settings: CambriconSettings
    lock: threading.RLock = field(default_factory=threading.RLock)
    cndev: Cndev | None = None
    cards: list[MluCard] = field(default_factory=list)
    live_pods: set[str] | None = None
    """UIDs of the pods on this node when the daemon started (`hami_reconcile`); None until told."""
    reconciled: bool = False
    _said: str = ""

    def reconcile_once(self) -> None:
        """Once the daemon said which pods are here: destroy the sMLU instances of any other pod (a crash)."""
        with self.lock:
            if self.reconciled or self.live_pods is None:
                return
            if self.cndev is None:
                self.read_cards()
            if self.cndev is None:
                return
            self.reconciled = True
            smlu.reconcile(self.cndev, self.cards, self.live_pods)

    def _say(self, level: int, message: str) -> None:
        if message != self._said:
            log.log(level, message)
            self._said = message

    def read_cards(self) -> list[MluCard]:
        """This node's cards now; none (said once in the log) when CNDev is missing or fails."""
        with self.lock:
            try:
                if self.cndev is None:
                    self.cndev = Cndev.open(self.settings.cndev_library)
                self.cards = self.cndev.cards()
                self._say(logging.INFO, f"MLU cards read through CNDev ({len(self.cards)} found)")
            except CndevUnavailable as exc:
                self.cards = []
                self._say(logging.WARNING, f"no CNDev ({exc}): this node reports no Cambricon devices")
            except CndevError as exc:
                self.cndev = None  # reopened next time
                self.cards = []
                self._say(logging.WARNING, f"reading the MLU cards failed ({exc}): this node reports none")
            return self.cards

    def card_of(self, uuid: str) -> MluCard:
        """The card a placement names: a real UUID, or HAMi's capacity name ``<node>-cambricon-mlu-<index>``.

        On a node without CNDev at all (no driver: simulated devices, `hami demo`), a name ending in
        ``-<index>`` (HAMi's capacity names, the simulated inventory's ``<id>-<index>``) stands for that card,
        of unknown memory; with CNDev, only its cards are served.

        :raises HamiError: no card of this node has that name.
        """
        with self.lock:
            for attempt in (self.cards, self.read_cards()):
                match = _CAPACITY_ID.fullmatch(uuid)
                for card in attempt:
                    if card.uuid == uuid or (match and card.index == int(match.group(1))):
                        return card
            index = _TRAILING_INDEX.fullmatch(uuid)
            if self.cndev is None and index:
                self._say(logging.WARNING, "no CNDev on this node: MLU indices are taken from the device names")
                return MluCard(int(index.group(1)), uuid, "", 0, 0, True)
            known = ", ".join(c.uuid for c in self.cards) or "no MLU"
            raise HamiError(
                f"MLU {uuid} is not on this node (it has {known}): the pod was placed from an outdated view"
            )


def runtime_for(settings: CambriconSettings) -> NodeRuntime:
    """The node runtime attached to `settings`, created on first use."""
    return settings.runtime_of(NodeRuntime, lambda: NodeRuntime(settings))


def inventory(cards: Sequence[MluCard]) -> NodeInventory:
    """The ``MLU`` inventory of these cards (those without a UUID left out, said in the log)."""
    devices = []
    for card in cards:
        if not card.uuid:
            log.warning("MLU %d (%s) has no UUID in CNDev: not reported", card.index, card.name)
            continue
        devices.append(
            Device(
                id=card.uuid,
                index=card.index,
                count=100,
                devmem=card.memory_mib,
                devcore=100,
                type=card.name or "MLU",
                numa=0,
                health=card.healthy,
            )
        )
    return NodeInventory(kind="MLU", devices=tuple(devices))


def discover(settings: CambriconSettings) -> list[NodeInventory]:
    """This node's MLUs; an empty list when CNDev is absent."""
    cards = runtime_for(settings).read_cards()
    return [inventory(cards)] if cards else []
