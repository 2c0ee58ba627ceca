"""Fitting and scoring MetaX pods, HAMi v2.10's rules on the core building blocks.

Whole cards (``Metax-GPU``): `hami.topology.TopologyFitter`, always topology-aware (MetaX's gpu-device plugin
places over MetaXLink), reading the node's ``hami.io/node-metax-gpu-score``; a node HAMi counts from capacity
(no link scores) is served as the share fitter serves it. The node score is HAMi's default plus MetaX's term:
binpack ``2000 - losses[n]``, spread ``2000 - scores[n]`` (the node's ``metax-tech.com/gpu.topology.*`` for the
``n`` cards the pod takes; nothing when the node has none).

Shared cards (``Metax-SGPU``): `hami.fitting.ShareFitter` with MetaX's filters and choice:

* app class (``metax-tech.com/sgpu-app-class``): an idle card takes anything; a card running classed pods
  (online or offline) takes only classed pods, and no offline pod once it runs an online one; a card running
  unclassed pods takes only unclassed ones. An ``online`` pod is fitted by memory and slots alone and granted no
  compute (MetaX suspends offline work for it);
* QoS (``metax-tech.com/sgpu-qos-policy``, ``best-effort`` when absent): a busy card takes a share only of its
  own policy (the policy of the shares on it, else the node's ``qosPolicy`` for it; none means any); a pod asking
  for a whole card's compute is not checked;
* choice: an unclassed pod asking for 100 % compute takes cards within one MetaXLink group when one holds them
  (the smallest such group), else across groups, then unlinked cards (HAMi's ``prioritizeExclusiveDevices``);
  an online pod the cards with the fewest online pods, avoiding cards that run only offline ones; otherwise the
  device policy's order;
* score: HAMi's default plus ``±10000 ×`` MetaX's policy-neutral term (negative under spread): for online pods
  ``-100`` per offline pod on a card running only offline pods, else ``-20`` per online and ``-2`` per offline pod;
  for exclusive placements with topology awareness (``sgpuTopologyAware``, overridden by the pod's
  ``metax-tech.com/sgpu-topology-aware``) ``10 × links taken - links the idle cards lose``.

What the cards' pods are is read from the node view's pods: their ``metax-tech.com/gpu-devices-allocated``,
app class and QoS, which every fit writes on the pod with its placement (`placement_annotations`), together
with ``metax-tech.com/predicate-time``, as HAMi does.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami.fitting import Candidate, ChoiceContext, ShareFitter
from hami.model import (
    ContainerPlacement,
    ContainerRequest,
    DeviceKind,
    DeviceUsage,
    NodeFit,
    NodeView,
    Pod,
    SchedulingPolicy,
)
from hami.topology import TOPOLOGY_POLICY, TopologyFitter, scores_from_annotation
from hami_vendor_metax.discovery import DIRECT_LINK_SCORE, GPU_LINK_ANNOTATION, LOSS_ANNOTATION, SCORE_ANNOTATION

__all__ = [
    "metaxlink_islands",
    "ALLOCATED_ANNOTATION",
    "APP_CLASS_ANNOTATION",
    "PREDICATE_TIME_ANNOTATION",
    "QOS_ANNOTATION",
    "TOPOLOGY_AWARE_ANNOTATION",
    "fit_gpu",
    "fit_sgpu",
    "placement_annotations",
    "score_gpu",
    "score_sgpu",
]

ALLOCATED_ANNOTATION = "metax-tech.com/gpu-devices-allocated"
PREDICATE_TIME_ANNOTATION = "metax-tech.com/predicate-time"
QOS_ANNOTATION = "metax-tech.com/sgpu-qos-policy"
APP_CLASS_ANNOTATION = "metax-tech.com/sgpu-app-class"
TOPOLOGY_AWARE_ANNOTATION = "metax-tech.com/sgpu-topology-aware"
BEST_EFFORT = "best-effort"
ONLINE, OFFLINE = "online", "offline"
NEUTRAL_WEIGHT = 10000


# ------------------------------------------------------------------------------------------------ whole cards


def fit_gpu(
    kind: DeviceKind, pod: Pod, requests: Sequence[ContainerRequest | None], nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
) -> list[NodeFit]:  # fmt: skip
    linked = policy if TOPOLOGY_POLICY in policy.device else policy.model_copy(
        update={"device": (*policy.device, TOPOLOGY_POLICY)}
    )  # fmt: skip
    return TopologyFitter(kind, links=scores_from_annotation(GPU_LINK_ANNOTATION)).fit_nodes(
        pod, requests, nodes, linked
    )


def _per_count(annotations: Mapping[str, str], key: str, count: int) -> float | None:
    raw = annotations.get(key)
    if raw is None:
        return None
    try:
        table = json.loads(raw)
        return float(table[str(count)]) if isinstance(table, dict) and str(count) in table else 0.0
    except (ValueError, TypeError):
        return 0.0  # HAMi: an unreadable table counts 0


def score_gpu(
    fits: Sequence[NodeFit], nodes: Mapping[str, NodeView], policy: SchedulingPolicy
) -> dict[str, float] | None:
    if policy.node not in ("binpack", "spread"):
        return None
    key = LOSS_ANNOTATION if policy.node == "binpack" else SCORE_ANNOTATION
    out = {}
    for fit in fits:
        count = sum(len(c) for c in fit.placement or ())
        value = _per_count(nodes[fit.node].annotations, key, count)
        out[fit.node] = fit.score + (2000 - value if value is not None else 0.0)
    return out


# ------------------------------------------------------------------------------------------------ shared cards


@dataclass
class CardPods:
    """What the pods on one card are: app classes and the QoS policies of their shares."""

    online: int = 0
    offline: int = 0
    unclassed: int = 0
    qos: list[str] = field(default_factory=list)


def _allocated(annotations: Mapping[str, str]) -> list[list[dict[str, Any]]]:
    try:
        value = json.loads(annotations.get(ALLOCATED_ANNOTATION) or "[]")
    except ValueError:
        return []
    return [c for c in value if isinstance(c, list)] if isinstance(value, list) else []


def cards_pods(node: NodeView) -> dict[str, CardPods]:
    """UUID → the pods counted on the node that hold shares of it."""
    out: dict[str, CardPods] = {}
    for placed in node.pods.values():
        annotations = placed.annotations
        app = annotations.get(APP_CLASS_ANNOTATION, "")
        qos = annotations.get(QOS_ANNOTATION) or BEST_EFFORT
        seen: set[str] = set()
        for container in _allocated(annotations):
            for entry in container:
                uuid = entry.get("uuid") if isinstance(entry, dict) else None
                if not isinstance(uuid, str) or uuid in seen:
                    continue
                seen.add(uuid)
                card = out.setdefault(uuid, CardPods())
                if app == ONLINE:
                    card.online += 1
                elif app == OFFLINE:
                    card.offline += 1
                else:
                    card.unclassed += 1
                compute = entry.get("compute", 0)
                if app != ONLINE and isinstance(compute, int) and compute < 100:
                    card.qos.append(qos)
    return out


def _app_class_fits(request_class: str, usage: DeviceUsage, card: CardPods | None) -> bool:
    if usage.used == 0 or card is None:
        return True
    classed_card = card.online > 0 or card.offline > 0
    classed_pod = request_class in (ONLINE, OFFLINE)
    if classed_card != classed_pod:
        return False
    return not (card.online > 0 and request_class == OFFLINE)


def _qos_fits(request_qos: str, usage: DeviceUsage, request: ContainerRequest, card: CardPods | None) -> bool:
    if usage.used == 0 or request.cores >= 100:
        return True
    card_qos = card.qos[0] if card is not None and card.qos else str(usage.device.custom.get("QosPolicy") or "")
    return card_qos in ("", request_qos)


def _zone(candidate: Candidate) -> int:
    zone = candidate.device.custom.get("LinkZone", 0)
    return zone if isinstance(zone, int) else 0


def exclusive_choice(ranked: Sequence[Candidate], count: int) -> list[Candidate]:
    """HAMi's ``prioritizeExclusiveDevices``: within one MetaXLink group (the smallest that holds them), else
    across groups (smallest first), then unlinked cards."""
    groups: dict[int, list[Candidate]] = {}
    for c in ranked:
        groups.setdefault(_zone(c), []).append(c)
    linked = sorted((g for z, g in groups.items() if z > 0), key=len)
    for group in linked:
        if len(group) >= count:
            return group[:count]
    flat = [c for g in linked for c in g] + groups.get(0, [])
    return flat[:count]


class SgpuFitter(ShareFitter):
    """`ShareFitter` with MetaX's app-class and QoS filters and its device choice."""

    def __init__(self, kind: DeviceKind, pod: Pod) -> None:
        super().__init__(kind, extra_filter=self._metax_refuses)
        self.app_class = pod.annotations.get(APP_CLASS_ANNOTATION, "")
        self.qos = pod.annotations.get(QOS_ANNOTATION) or BEST_EFFORT
        self._cards: dict[str, CardPods] = {}
        self._pods: dict[str, dict[str, CardPods]] = {}

    def fit_nodes(
        self, pod: Pod, requests: Sequence[ContainerRequest | None], nodes: Sequence[NodeView], policy: SchedulingPolicy
    ) -> list[NodeFit]:
        online = self.app_class == ONLINE
        if online:  # memory and slots alone: no compute is asked or granted
            requests = [None if r is None else r.model_copy(update={"cores": 0}) for r in requests]
        out = []
        for node in nodes:
            self._cards = cards_pods(node)
            self._pods[node.name] = self._cards
            view = node
            if online:
                view = node.model_copy(
                    update={
                        "devices": [DeviceUsage(device=u.device, used=u.used, usedmem=u.usedmem) for u in node.devices]
                    }
                )
            fit = super().fit_nodes(pod, requests, [view], policy)[0]
            if fit.placement is not None:
                fit = fit.model_copy(update={"pod_annotations": placement_annotations(pod, fit.placement)})
            out.append(fit)
        return out

    def _metax_refuses(self, usage: DeviceUsage, request: ContainerRequest) -> str | None:
        card = self._cards.get(usage.id)
        if not _app_class_fits(self.app_class, usage, card):
            return "app class mismatch"
        if self.app_class != ONLINE and not _qos_fits(self.qos, usage, request, card):
            return "QoS policy mismatch"
        return None

    def choose_devices(
        self, candidates: Sequence[Candidate], count: int, context: ChoiceContext
    ) -> Sequence[Candidate]:
        ranked = list(super().choose_devices(candidates, len(candidates), context))
        if len(ranked) <= count:
            return ranked[:count]
        if self.app_class == ONLINE:

            def load(c: Candidate) -> tuple[int, int, int]:
                card = self._cards.get(c.device.id) or CardPods()
                only_offline = card.online == 0 and card.offline > 0
                return (1, card.offline, 0) if only_offline else (0, card.online, card.offline)

            return sorted(ranked, key=load)[:count]
        if (
            not self.app_class
            and context.pod.annotations.get(APP_CLASS_ANNOTATION) is None
            and all(c.cores >= c.device.devcore for c in ranked)
        ):
            return exclusive_choice(ranked, count)
        return ranked[:count]


def fit_sgpu(
    kind: DeviceKind, pod: Pod, requests: Sequence[ContainerRequest | None], nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
) -> list[NodeFit]:  # fmt: skip
    return SgpuFitter(kind, pod).fit_nodes(pod, requests, nodes, policy)


def metax_allocated(placement: Sequence[ContainerPlacement]) -> str:
    """``metax-tech.com/gpu-devices-allocated``: per container ``[{uuid, compute, vRam}]``, zero values left out."""
    body = [
        [{k: v for k, v in (("uuid", d.uuid), ("compute", d.usedcores), ("vRam", d.usedmem)) if k == "uuid" or v}
         for d in container]
        for container in placement
    ]  # fmt: skip
    return json.dumps(body, separators=(",", ":"))


def placement_annotations(pod: Pod, placement: Sequence[ContainerPlacement]) -> dict[str, str]:
    """What a shared-card placement writes on the pod beside HAMi's device strings (see the module)."""
    out = {ALLOCATED_ANNOTATION: metax_allocated(placement), PREDICATE_TIME_ANNOTATION: str(time.time_ns())}
    app = pod.annotations.get(APP_CLASS_ANNOTATION)
    if app is not None:
        out[APP_CLASS_ANNOTATION] = app
    if app != ONLINE:
        out[QOS_ANNOTATION] = pod.annotations.get(QOS_ANNOTATION) or BEST_EFFORT
    return out


def _parse_bool(value: str) -> bool | None:
    """Go's ``strconv.ParseBool``."""
    if value in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if value in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    return None


def _link_score(zones: Sequence[int]) -> int:
    return sum(DIRECT_LINK_SCORE for i, a in enumerate(zones) for b in zones[i + 1 :] if a and a == b)


def _neutral_score(pod: Pod, fit: NodeFit, node: NodeView, topology_aware: bool) -> int:
    placed = [d for container in fit.placement or () for d in container]
    if pod.annotations.get(APP_CLASS_ANNOTATION) == ONLINE:
        cards = cards_pods(node)
        total = 0
        for uuid in dict.fromkeys(d.uuid for d in placed):
            card = cards.get(uuid) or CardPods()
            if card.offline > 0 and card.online == 0:
                total += -100 * card.offline
            else:
                total += -20 * card.online - 2 * card.offline
        return total
    exclusive = [d for d in placed if d.usedcores == 100]
    if not exclusive:
        return 0
    enabled = topology_aware
    override = pod.annotations.get(TOPOLOGY_AWARE_ANNOTATION)
    if override is not None and _parse_bool(override) is not None:
        enabled = bool(_parse_bool(override))
    if not enabled:
        return 0
    zone_of = {u.id: (u.device.custom.get("LinkZone", 0) if isinstance(u.device.custom.get("LinkZone", 0), int) else 0)
               for u in node.devices}  # fmt: skip
    idle = [u.id for u in node.devices if u.used == 0]
    taken = {d.uuid for d in exclusive}
    available = _link_score([zone_of[i] for i in idle])
    allocated = _link_score([zone_of.get(d.uuid, 0) for d in exclusive])
    rest = _link_score([zone_of[i] for i in idle if i not in taken])
    return 10 * allocated - (available - allocated - rest)


def score_sgpu(
    pod: Pod, fits: Sequence[NodeFit], nodes: Mapping[str, NodeView], policy: SchedulingPolicy, topology_aware: bool
) -> dict[str, float]:
    weight = -NEUTRAL_WEIGHT if policy.node == "spread" else NEUTRAL_WEIGHT
    return {f.node: f.score + weight * _neutral_score(pod, f, nodes[f.node], topology_aware) for f in fits}


def metaxlink_islands(node: NodeView) -> dict[str, str]:
    """The node's MetaXLink islands (`hami_device_islands`): devices of one ``LinkZone`` above 0, as MetaX's
    device plugin publishes it; a device in zone 0 (no MetaXLink) is left out."""
    zones = {u.id: u.device.custom.get("LinkZone", 0) for u in node.devices}
    return {d: f"metaxlink-{z}" for d, z in zones.items() if isinstance(z, int) and not isinstance(z, bool) and z > 0}
