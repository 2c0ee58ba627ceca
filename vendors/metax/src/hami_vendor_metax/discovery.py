"""Discovery: this node's MetaX GPUs as MetaX's device plugins publish them for HAMi.

Owns turning the cards the driver reports (`hami_vendor_metax.node`) and what the node serves
(`hami_vendor_metax.records`) into the inventory of the node's kind (``nodeKind``):

* shared cards (``Metax-SGPU``, MetaX's sGPU plugin): the node annotation ``metax-tech.com/node-gpu-devices``,
  HAMi's ``MetaxSDeviceInfo`` JSON list: per card ``uuid``, ``bdf``, ``model``, ``totalDevCount`` (``sgpuCount``),
  ``totalCompute`` 100, ``totalVRam`` (MiB), the ``available*`` figures left after the served containers, ``numa``,
  ``healthy``, ``qosPolicy`` (the policy of the shares on the card, empty when it has none or is held whole) and
  ``linkZone`` (the MetaXLink group of the card, 1.., 0 when it has no link), with Go's ``omitempty``: zero
  values are left out. HAMi's scheduler reads that annotation (`read_sgpu_devices`, which is also this
  scheduler's reading of it);
* whole cards (``Metax-GPU``, MetaX's gpu-device plugin): HAMi counts them from the node's ``metax-tech.com/gpu``
  capacity, which the daemon serves (one device per card), and ranks nodes by MetaX's
  ``metax-tech.com/gpu.topology.losses`` and ``.scores``: per number of cards ``n`` (JSON object, ``{"2": 10}``),
  the MetaXLink score of the ``n`` free cards a pod would take (the best-connected set; for one card the least
  connected one) and what taking them loses for the rest. The
  cards themselves go in this project's register ``hami.io/node-metax-gpu-register`` (read before the capacity)
  with their pairwise link scores in ``hami.io/node-metax-gpu-score`` (10 per pair on one MetaXLink, HAMi's
  ``DirectLinkScore``), for topology-aware placement.

A card with no VRAM or no UUID is not reported (logged); the node keeps serving the others.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from hami.codec import encode_link_scores
from hami.model import Device, NodeInventory
from hami.topology import best_connected, least_connected, set_score
from hami_vendor_metax import records
from hami_vendor_metax.node import Card, runtime_for
from hami_vendor_metax.settings import MetaxSettings

__all__ = [
    "DIRECT_LINK_SCORE",
    "GPU_LINK_ANNOTATION",
    "GPU_REGISTER",
    "LOSS_ANNOTATION",
    "SCORE_ANNOTATION",
    "SGPU_ANNOTATION",
    "discover",
    "link_zones",
    "read_sgpu_devices",
    "sgpu_info",
]

log = logging.getLogger("hami_vendor_metax")

SGPU_ANNOTATION = "metax-tech.com/node-gpu-devices"
GPU_REGISTER = "hami.io/node-metax-gpu-register"
GPU_LINK_ANNOTATION = "hami.io/node-metax-gpu-score"
LOSS_ANNOTATION = "metax-tech.com/gpu.topology.losses"
SCORE_ANNOTATION = "metax-tech.com/gpu.topology.scores"
DIRECT_LINK_SCORE = 10
SGPU_WORD, GPU_WORD = "Metax-SGPU", "Metax-GPU"
MIB = 1024 * 1024


def link_zones(cards: Sequence[Card]) -> dict[str, int]:
    """UUID → MetaXLink group: the connected groups of the cards' links, numbered from 1 in card order; 0 for a
    card linked to none."""
    by_index = {c.index: c for c in cards}
    zones: dict[str, int] = {}
    zone = 0
    for card in sorted(cards, key=lambda c: c.index):
        if card.uuid in zones:
            continue
        if not card.gpu.metalink:
            zones[card.uuid] = 0
            continue
        zone += 1
        stack = [card]
        while stack:
            current = stack.pop()
            if current.uuid in zones:
                continue
            zones[current.uuid] = zone
            stack.extend(by_index[i] for i in current.gpu.metalink if i in by_index)
    return zones


def _usable(cards: Sequence[Card]) -> list[Card]:
    out = []
    for c in cards:
        if c.gpu.memory_total <= 0:
            log.warning("MetaX GPU %d (%s) reports no VRAM; it is not reported", c.index, c.gpu.bdf)
        elif not c.uuid:
            log.error("MetaX GPU %d (%s) has no UUID; it is not reported", c.index, c.gpu.bdf)
        else:
            out.append(c)
    return out


def _omit_empty(info: Mapping[str, Any]) -> dict[str, Any]:
    """Go's ``omitempty``: zero numbers, empty strings and false are left out (``uuid`` always written)."""
    return {k: v for k, v in info.items() if k == "uuid" or v not in (0, "", False)}


def sgpu_info(cards: Sequence[Card], settings: MetaxSettings, held: Sequence[records.Held]) -> list[dict[str, Any]]:
    """The ``metax-tech.com/node-gpu-devices`` entries of these cards."""
    zones = link_zones(cards)
    out = []
    for c in cards:
        mine = [h for h in held if h.uuid == c.uuid and h.kind == SGPU_WORD]
        total = c.gpu.memory_total // MIB
        shared = [h for h in mine if h.compute < 100]
        info = {
            "uuid": c.uuid,
            "bdf": c.gpu.bdf,
            "model": c.gpu.name,
            "totalDevCount": settings.sgpu_count,
            "totalCompute": 100,
            "totalVRam": total,
            "availableDevCount": max(settings.sgpu_count - len(mine), 0),
            "availableCompute": max(100 - sum(h.compute for h in mine), 0),
            "availableVRam": max(total - sum(h.vram for h in mine), 0),
            "numa": c.numa,
            "healthy": c.gpu.healthy,
            "qosPolicy": shared[0].qos if shared else "",
            "linkZone": zones.get(c.uuid, 0),
        }
        out.append(_omit_empty(info))
    return out


def read_sgpu_devices(annotations: Mapping[str, str]) -> list[Device]:
    """The shared-card devices of a node from its ``metax-tech.com/node-gpu-devices``, as HAMi converts them: the
    register index is the position, ``Count`` ``totalDevCount``, memory ``totalVRam``, cores ``totalCompute``,
    type ``Metax-SGPU``, the QoS policy, model and link zone kept as custom values. A malformed annotation gives
    no device (logged); an entry without a usable UUID is left out."""
    raw = annotations.get(SGPU_ANNOTATION)
    if raw is None:
        return []
    try:
        entries = json.loads(raw)
    except ValueError as exc:
        log.warning("ignoring %s: not JSON (%s)", SGPU_ANNOTATION, exc)
        return []
    if not isinstance(entries, list):
        log.warning("ignoring %s: a JSON list of devices was expected, not %s", SGPU_ANNOTATION, type(entries).__name__)
        return []
    out = []
    for position, entry in enumerate(entries):
        try:
            if not isinstance(entry, dict):
                raise TypeError(f"entry {position} is not an object")

            def number(key: str, entry: dict[str, Any] = entry) -> int:
                value = entry.get(key, 0)
                if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
                    raise ValueError(f"{key} {value!r} is not a non-negative 32-bit integer")
                return value

            uuid = entry.get("uuid")
            if not isinstance(uuid, str):
                raise TypeError("uuid is not a string")
            qos, model = entry.get("qosPolicy", ""), entry.get("model", "")
            out.append(
                Device(
                    id=uuid,
                    index=position,
                    count=number("totalDevCount"),
                    devmem=number("totalVRam"),
                    devcore=number("totalCompute"),
                    type=SGPU_WORD,
                    numa=number("numa"),
                    health=entry.get("healthy") is True,
                    vendor=SGPU_WORD,
                    custom={
                        "QosPolicy": qos if isinstance(qos, str) else "",
                        "Model": model if isinstance(model, str) else "",
                        "LinkZone": number("linkZone"),
                    },
                )
            )
        except (TypeError, ValueError) as exc:
            log.warning("ignoring entry %d of %s: %s", position, SGPU_ANNOTATION, exc)
    return out


def _topology(free: Sequence[str], scores: Mapping[str, Mapping[str, int]]) -> tuple[dict[str, int], dict[str, int]]:
    """MetaX's losses and scores per number of cards, over the free cards."""
    losses: dict[str, int] = {}
    best: dict[str, int] = {}
    whole = set_score(scores, free)
    for n in range(1, len(free) + 1):
        chosen = (least_connected(free, scores),) if n == 1 else best_connected(free, n, scores)
        rest = [c for c in free if c not in chosen]
        best[str(n)] = set_score(scores, chosen)
        losses[str(n)] = whole - best[str(n)] - set_score(scores, rest)
    return losses, best


def gpu_inventory(cards: Sequence[Card], held: Sequence[records.Held]) -> NodeInventory:
    """The whole-card inventory: the cards, their link scores and MetaX's losses and scores."""
    zones = link_zones(cards)
    scores: dict[str, dict[str, int]] = {}
    for a in cards:
        for b in cards:
            if a.uuid != b.uuid and zones[a.uuid] and zones[a.uuid] == zones[b.uuid]:
                scores.setdefault(a.uuid, {})[b.uuid] = DIRECT_LINK_SCORE
    taken = {h.uuid for h in held if h.kind == GPU_WORD}
    free = [c.uuid for c in cards if c.gpu.healthy and c.uuid not in taken]
    losses, best = _topology(free, scores)
    devices = tuple(
        Device(
            id=c.uuid,
            index=c.index,
            count=1,
            devmem=c.gpu.memory_total // MIB,
            devcore=100,
            type=c.gpu.name or GPU_WORD,
            numa=c.numa,
            health=c.gpu.healthy,
        )
        for c in cards
    )
    annotations = {
        GPU_LINK_ANNOTATION: encode_link_scores(scores),
        LOSS_ANNOTATION: json.dumps(losses, separators=(",", ":")),
        SCORE_ANNOTATION: json.dumps(best, separators=(",", ":")),
    }
    return NodeInventory(kind=GPU_WORD, devices=devices, link_scores=scores, annotations=annotations)


def inventory(cards: Sequence[Card], settings: MetaxSettings) -> list[NodeInventory]:
    usable = _usable(cards)
    if not usable:
        return []
    held = records.read_all(settings)
    if settings.node_kind == "gpu":
        return [gpu_inventory(usable, held)]
    info = sgpu_info(usable, settings, held)
    annotations = {SGPU_ANNOTATION: json.dumps(info, separators=(",", ":"))}
    devices = tuple(read_sgpu_devices(annotations))
    return [NodeInventory(kind=SGPU_WORD, devices=devices, annotations=annotations)]


def discover(settings: MetaxSettings) -> list[NodeInventory]:
    """This node's MetaX inventory; ``[]`` without a driver or a GPU."""
    return inventory(runtime_for(settings).read_cards(), settings)
