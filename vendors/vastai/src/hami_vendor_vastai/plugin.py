"""The Vastai vendor plugin: HAMi v2.10's scheduling of Vastai accelerators (`vastaitech.com/va`, `hami.io/Vastai-*`).

HAMi serves Vastai from its scheduler alone (``pkg/device/vastai/device.go``): the node side is Vastai's own device
plugin, which registers the devices under ``hami.io/node-va-register`` (HAMi's JSON form, each device's
``custominfo`` saying whether it is a whole card or one die of a card, ``DeviceStrategy: die``, and which card,
``AIC``), answers the handshake ``hami.io/node-handshake-va`` and serves the placement HAMi's scheduler writes. This
plugin is that scheduler side, on the core's building blocks; like HAMi it has no discovery, allocation or edits.

* node devices: the register, every device's cores read as 100 (HAMi's ``GetNodeDevices``: "only for calscore");
* requests: ``vastaitech.com/va`` devices, no memory and no cores asked (HAMi's ``GenerateResourceRequests``), so a
  placement is ``<uuid>,Vastai,0,0`` and a device is shared up to its registered count;
* fitting: core's share fitter (health, ``vastaitech.com/use-gpuuuid``/``nouse-gpuuuid``, free slots, the ``mutex``
  policy) walking HAMi's sorted list from its end, and on a node of dies HAMi's rules: under ``mutex`` no die of a
  card another pod uses; several dies preferably from the cards with most of them free (`dies_by_card`);
* scoring: HAMi's node score plus, on a node of dies, each container's share of dies on one card (``ScoreNode``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from hami import hookimpl
from hami.codec import AnnotationError, decode_node_register
from hami.fitting import Candidate, ChoiceContext, ShareFitter
from hami.model import (
    AnnotationKeys,
    Container,
    ContainerRequest,
    Device,
    DeviceKind,
    NodeFit,
    NodeView,
    Pod,
    RegisterFormat,
    ResourceNames,
    SchedulingPolicy,
    VendorInfo,
)
from hami.requests import read_count

__all__ = ["INFO", "KIND", "card_of", "dies_by_card", "is_die"]

log = logging.getLogger("hami_vendor_vastai")

KIND = DeviceKind(
    common_word="Vastai",
    resources=ResourceNames(count="vastaitech.com/va"),
    annotations=AnnotationKeys(
        node_register="hami.io/node-va-register",
        node_handshake="hami.io/node-handshake-va",
        to_allocate="hami.io/Vastai-devices-to-allocate",
        allocated="hami.io/Vastai-devices-allocated",
        use_uuid="vastaitech.com/use-gpuuuid",
        nouse_uuid="vastaitech.com/nouse-gpuuuid",
    ),
    register_format=RegisterFormat.JSON,
    reusable_fits=True,  # the fit reads the pod's spec and annotations, the policy and the node's view alone
)

INFO = VendorInfo(name="vastai", display_name="Vastai", kinds=(KIND,))


def is_die(device: Device) -> bool:
    return device.custom.get("DeviceStrategy") == "die"


def card_of(device: Device) -> str | None:
    """The card (AIC) a die is on, from its ``custominfo``; None when the register does not say."""
    card = device.custom.get("AIC")
    return card if isinstance(card, str) else None


def dies_by_card(dies: Sequence[Candidate], count: int) -> list[Candidate]:
    """`count` of the fitting `dies`, as HAMi's ``computeBestCombination``: the cards with the most fitting dies
    first (cards of equal counts in the order their first die was walked; HAMi's order there is its map's, random),
    each card's dies in the walk's order. A die without a card is not taken."""
    cards: dict[str, list[Candidate]] = {}
    for die in dies:
        card = card_of(die.device)
        if card is not None:
            cards.setdefault(card, []).append(die)
    ranked = sorted(cards.values(), key=len, reverse=True)
    return [die for group in ranked for die in group][:count]


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_node_devices(kind: DeviceKind, annotations: Mapping[str, str]) -> list[Device] | None:
    key = kind.annotations.node_register or ""
    if key not in annotations:
        return []
    try:
        devices = decode_node_register(annotations[key], key)
    except AnnotationError as exc:
        log.warning("ignoring a node's Vastai devices: %s", exc)
        return []
    return [d.model_copy(update={"devcore": 100, "vendor": kind.common_word}) for d in devices]


@hookimpl
def hami_container_request(kind: DeviceKind, container: Container) -> ContainerRequest | None:
    count = read_count(container, kind.resources.count, unit="devices", limit=1024)
    return ContainerRequest(kind=kind.common_word, count=count) if count else None


class VastaiFitter(ShareFitter):
    """Core's share fitter with HAMi's rules for a node of dies."""

    def choose_devices(
        self, candidates: Sequence[Candidate], count: int, context: ChoiceContext
    ) -> Sequence[Candidate]:
        states = context.devices
        first = states[context.order[0]] if context.order else states[0] if states else None
        if first is None or not is_die(first.device):  # HAMi looks at the first device of its sorted list
            return super().choose_devices(candidates, count, context)
        walked = super().choose_devices(candidates, len(candidates), context)  # all of them, in HAMi's walk
        if "mutex" in context.policy.device:  # no die of a card another pod holds a die of
            taken = {card_of(s.device) for s in states if s.used > 0} - {None}
            walked = [c for c in walked if card_of(c.device) not in taken]
        if len(walked) < count:
            return []
        if len(walked) == count or count == 1:
            return walked[:count]
        chosen = dies_by_card(walked, count)
        return chosen if len(chosen) == count else []


@hookimpl
def hami_fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
) -> list[NodeFit]:
    return VastaiFitter(kind).fit_nodes(pod, requests, nodes, policy)


@hookimpl
def hami_score_nodes(fits: Sequence[NodeFit], nodes: Mapping[str, NodeView]) -> dict[str, float]:
    """HAMi's node score plus ``ScoreNode``: for each container the largest share of its devices on one card (1.0
    when all are on one card); nothing when a device names no card or is registered as other than a die."""
    out = {}
    for fit in fits:
        devices = {u.device.id: u.device for u in nodes[fit.node].devices}
        out[fit.node] = fit.score + _card_share(fit.placement or (), devices)
    return out


def _card_share(placement: Sequence[Sequence[Any]], devices: Mapping[str, Device]) -> float:
    total = 0.0
    for container in placement:
        if not container:
            continue
        counts: dict[str, int] = {}
        for granted in container:
            device = devices.get(granted.uuid)
            strategy = device.custom.get("DeviceStrategy") if device is not None else None
            card = card_of(device) if device is not None else None
            if card is None or (strategy is not None and strategy != "die"):
                return 0.0
            counts[card] = counts.get(card, 0) + 1
        total += max(counts.values()) / len(container)
    return total
