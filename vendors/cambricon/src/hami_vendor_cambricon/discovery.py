"""Discovery: this node's MLUs through CNDev, as the node publishes them.

Owns the node runtime (`NodeRuntime`: the CNDev session, opened on first use and reopened after a failure by core's
`hami.vendordriver.DriverReader`, which also says, once, what a missing or failing CNDev means, and the cards of
the last read, which allocation and container edits use to turn a placement into card indices) and the
`NodeInventory` of kind ``MLU``: per card the UUID (``MLU-<uuid>``, as Cambricon's device plugin names it), its
CNDev index, 100 slots (HAMi's ``Count`` for an MLU), the memory in MiB, 100 % compute, the card name as type
(``MLU370-X8``, which ``cambricon.com/use-mlutype`` matches), its NUMA node and health.

What is published, and why: HAMi v2.10 has no register annotation for MLUs; its scheduler counts the MLUs from
the node's ``cambricon.com/mlu.smlu.vcore`` capacity (100 per card) and splits the
``cambricon.com/mlu.smlu.vmemory`` capacity (256 MiB units) evenly, naming the cards ``<node>-cambricon-mlu-<i>``.
The node daemon serves those two resources so HAMi's scheduler reads this node; it also publishes the JSON register
annotation `REGISTER_ANNOTATION` with the real cards, which this project's scheduler reads before the capacity, so
it fits per card (real UUIDs, memory and health of each card). A card CNDev gives no UUID is not published.

Where CNDev cannot be loaded, the cards come from ``cnmon``'s table (`hami_vendor_cambricon.cnmon`: named after
their bus id, no cores, no health; rows it cannot read are said in the log and the other cards are served), and
no sMLU can be made. MLU-Link: each card's peers (`Cndev.link_peers`) become pairwise link scores, the number of
ports joining two cards, published as `LINK_ANNOTATION` (HAMi's link-score form) for core's topology-aware choice;
a card whose links cannot be read has none, said in the log.

For the node-side backstop, `device_processes`: each card's processes and the device memory CNDev counts for each
(``cndevGetProcessInfo``), under the card's UUID; for the node monitor, `device_readings`: each card's memory in
use, busy share, power and temperature; both nothing (None) where the cards came from cnmon or CNDev fails.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from hami.codec import encode_link_scores
from hami.model import Device, DeviceProcess, DeviceReading, NodeInventory
from hami.vendordriver import DriverReader, DriverWords, per_device
from hami.vendorstate import capacity_index, devices_named, trailing_index
from hami_vendor_cambricon import cnmon, smlu
from hami_vendor_cambricon.cndev import Cndev, CndevError, MluCard
from hami_vendor_cambricon.fit import LINK_ANNOTATION
from hami_vendor_cambricon.settings import CambriconSettings

T = TypeVar("T")

__all__ = [
    "CAPACITY_NAME",
    "LINK_ANNOTATION",
    "REGISTER_ANNOTATION",
    "NodeRuntime",
    "device_processes",
    "device_readings",
    "discover",
    "inventory",
    "link_scores",
    "runtime_for",
]

log = logging.getLogger("hami_vendor_cambricon")

REGISTER_ANNOTATION = "hami.io/node-cambricon-mlu-register"
"""This project's per-card register (JSON, HAMi's device form); HAMi's own scheduler ignores it."""
CAPACITY_NAME = "cambricon-mlu"
"""HAMi's capacity-derived card names: ``<node>-cambricon-mlu-<i>``."""


@dataclass
class NodeRuntime:
    """The CNDev session and the MLU cards of this node."""

    settings: CambriconSettings
    lock: threading.RLock = field(default_factory=threading.RLock)
    cards: list[MluCard] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """What the last read could not use (cnmon rows, links)."""
    live_pods: set[str] | None = None
    """UIDs of the pods on this node when the daemon started (`hami_reconcile`); None until told."""
    reconciled: bool = False
    reader: DriverReader[Cndev] = field(init=False)

    def __post_init__(self) -> None:
        words = DriverWords(
            "CNDev",
            "the MLU cards",
            read_failed="reading the MLU cards failed ({error})",
            no_tool="{problem}: this node reports none",
            from_tool=f"{{problem}}: MLU cards read from {self.cnmon} ({{count}} found; no sMLU)",
            nothing="{problem}, and {error}: this node reports no Cambricon devices",
            from_library="MLU cards read through CNDev ({count} found)",
        )
        self.reader = DriverReader(log, words, lambda: Cndev.open(self.settings.cndev_library), ("cndev", "cnmon"))

    @property
    def cnmon(self) -> str:
        return self.settings.cnmon_path or "cnmon"

    @property
    def cndev(self) -> Cndev | None:
        """The open CNDev session, or None."""
        return self.reader.session

    @cndev.setter
    def cndev(self, session: Cndev | None) -> None:
        self.reader.session = session

    @property
    def source(self) -> str:
        """Where the cards were last read from: ``cndev``, ``cnmon`` or ``""`` (nowhere)."""
        return self.reader.source

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

    def read_cards(self) -> list[MluCard]:
        """This node's cards now, from CNDev, else (no CNDev at all) from cnmon; none (said once in the log) when
        neither answers, or when CNDev fails."""
        with self.lock:
            self.problems = []
            self.cards = self.reader.read(self._from_cndev, self._from_cnmon, tool_after_failure=False) or []
            for problem in self.problems:
                log.error("%s", problem)
            return self.cards

    def _from_cndev(self, cndev: Cndev) -> list[MluCard]:
        return [replace(c, links=self._links(cndev, c)) for c in cndev.cards()]

    def _links(self, cndev: Cndev, card: MluCard) -> tuple[str, ...]:
        try:
            return tuple(cndev.link_peers(card.index))
        except CndevError as exc:
            self.problems.append(f"MLU {card.index}: its MLU-Link peers cannot be read ({exc}); it has no links")
            return ()

    def _from_cnmon(self) -> list[MluCard]:
        report = cnmon.read_cards(self.cnmon)
        self.problems.extend(report.problems)
        return report.cards

    def card_of(self, uuid: str) -> MluCard:
        """The card a placement names: a real UUID, or HAMi's capacity name ``<node>-cambricon-mlu-<index>``.

        On a node without CNDev at all (no driver: simulated devices, `hami demo`), a name ending in
        ``-<index>`` (HAMi's capacity names, the simulated inventory's ``<id>-<index>``) stands for that card,
        of unknown memory; with CNDev, only its cards are served.

        :raises HamiError: no card of this node has that name.
        """

        def stand_in(name: str) -> MluCard | None:
            index = trailing_index(name)
            if self.cndev is not None or self.source or index is None:
                return None
            self.reader.said(logging.WARNING, "no CNDev on this node: MLU indices are taken from the device names")
            return MluCard(index, name, "", 0, 0, True)

        with self.lock:
            (card,) = devices_named([uuid], self.cards, self.read_cards, what="MLU", name_of=lambda c: c.uuid,
                                    answers=lambda c, n: c.uuid == n or capacity_index(n, "cambricon-mlu") == c.index,
                                    stand_in=stand_in)  # fmt: skip
            return card


def device_processes(settings: CambriconSettings) -> list[DeviceProcess] | None:
    """Each process on this node's cards and the device memory CNDev counts for it; None without CNDev, or when
    CNDev fails this round (the backstop then checks nothing rather than something half-read)."""
    return _per_card(settings, "the MLU cards' processes", lambda cndev, card: [
        DeviceProcess(device_uuid=card.uuid, pid=pid, used_bytes=used)
        for pid, used in cndev.processes(card.index)])  # fmt: skip


def device_readings(settings: CambriconSettings) -> list[DeviceReading] | None:
    """What CNDev reads from this node's cards now; None without CNDev, or when it fails this round (the monitor
    then shows the cards' figures unknown)."""
    return _per_card(settings, "the MLU cards' figures", lambda cndev, card: [cndev.readings(card.index, card.uuid)])


def _per_card(settings: CambriconSettings, what: str, read: Callable[[Cndev, MluCard], list[T]]) -> list[T] | None:
    runtime = runtime_for(settings)
    with runtime.lock:
        cards = runtime.cards if runtime.cndev is not None else runtime.read_cards()
        cndev = runtime.cndev
        if cndev is None:
            return None
        return per_device(log, what, [c for c in cards if c.uuid], lambda card: read(cndev, card))


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
                numa=card.numa,
                health=card.healthy,
            )
        )
    scores = link_scores(cards)
    extra = {LINK_ANNOTATION: encode_link_scores(scores)} if scores else {}
    return NodeInventory(kind="MLU", devices=tuple(devices), link_scores=scores, annotations=extra)


def link_scores(cards: Sequence[MluCard]) -> dict[str, dict[str, int]]:
    """Card UUID → peer UUID → the number of MLU-Link ports joining them (only cards of this node)."""
    known = {c.uuid for c in cards if c.uuid}
    scores: dict[str, dict[str, int]] = {}
    for card in cards:
        for peer in card.links:
            if card.uuid in known and peer in known and peer != card.uuid:
                row = scores.setdefault(card.uuid, {})
                row[peer] = row.get(peer, 0) + 1
    return scores


def discover(settings: CambriconSettings) -> list[NodeInventory]:
    """This node's MLUs; an empty list when CNDev is absent."""
    cards = runtime_for(settings).read_cards()
    return [inventory(cards)] if cards else []
