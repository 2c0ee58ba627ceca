"""Fitting Ascend requests onto candidate nodes, on core's share fitter, as HAMi v2.10 places them.

Owns the Ascend rules layered on `hami.fitting.ShareFitter` (which keeps feasibility, accounting, use/no-use UUID
selectors, the device cordon and refusal reasons):

* **what a container is granted** on each device, as HAMi writes it in ``hami.io/<CW>-devices-allocated``:
  in template mode the smallest template holding the memory asked (``vir05_1c_16g`` for 8000 MiB on a 910B3: 16384
  MiB), or, for a count alone or memory no template holds, the whole card; no cores are granted in template mode
  (the template's memory is what HAMi counts); in soft-split mode the memory and the ``-core`` percentage asked, a
  whole card being its memory and every core;
* **which nodes may serve a share**: a soft-split share only a node that serves soft splits (node annotation
  ``hami-vnpu-core: "true"``), a template share only a node that does not; whole cards any node;
* **super-pod pairing** (910C): several whole cards are whole modules, both dies of module ``index // 2`` free,
  chosen module by module in the device policy's order; a node without enough free modules is refused saying so;
* **NetworkID topology** (910-series, when every device of the node has ``custominfo.NetworkID``): several devices
  come from one network group when one can hold them all (the group that fits them most tightly, so larger groups
  stay whole), else from the largest groups first (HAMi's choice); and the node score gains HAMi's bonus, 10 × the
  share of each container's devices on its most used network, in the direction of the node policy (added for
  binpack, subtracted for spread, so cohesive placements win under both);
* **the runtime annotation** ``huawei.com/<CW>`` the fit carries for the node side (HAMi's ``RuntimeInfo`` list):
  per device ``{"UUID", "temp", "memory", "core"}`` in template mode (the smallest template holding the memory,
  none for a whole card; the memory granted and the cores, as HAMi writes them since v2.9), ``{"UUID", "memory",
  "core"}`` in soft-split mode, zero values left out, JSON as Go writes it; and HAMi's ``predicate-time`` (unix
  seconds of the decision).

Nothing here modifies the node views it is given.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence

from hami.errors import RequestError
from hami.fitting import CORDON_ANNOTATION, Candidate, ChoiceContext, Selectors, ShareFitter, node_score
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
from hami_vendor_ascend.admission import is_whole_card, vnpu_mode
from hami_vendor_ascend.chips import AscendChip
from hami_vendor_ascend.discovery import NETWORK_ID, SOFT_SPLIT_NODE_ANNOTATION
from hami_vendor_ascend.settings import SOFT_SPLIT, AscendSettings, VnpuMode

__all__ = ["NETWORK_WEIGHT", "PREDICATE_TIME", "AscendFitter", "hccs_islands", "runtime_annotation", "runtime_info"]

PREDICATE_TIME = "predicate-time"
"""Pod annotation HAMi's Ascend fit writes with the placement: unix seconds of the decision."""
NETWORK_WEIGHT = 10
"""HAMi's weight of the NetworkID cohesion in the node score (Ascend910NetworkWeight)."""
_910 = "Ascend910"


class _NoModules(Exception):
    """A container asking for several super-pod whole cards finds too few complete modules."""


def runtime_annotation(kind: DeviceKind) -> str:
    """The pod annotation carrying the node side's runtime information: ``huawei.com/<CW>``."""
    return f"huawei.com/{kind.common_word}"


def runtime_info(placement: Sequence[ContainerPlacement], chip: AscendChip, mode: VnpuMode) -> str:
    """HAMi's ``huawei.com/<CW>`` value for a placement: one object per device, in container order."""
    entries: list[dict[str, object]] = []
    for devices in placement:
        for device in devices:
            # HAMi v2.10's RuntimeInfo (`pkg/device/ascend`): UUID, temp, memory, core, each omitted when empty
            entry: dict[str, object] = {"UUID": device.uuid}
            if mode != SOFT_SPLIT:
                template = chip.template_for(device.usedmem)
                if template is not None:
                    entry["temp"] = template.name
            if device.usedmem:
                entry["memory"] = device.usedmem
            if device.usedcores:
                entry["core"] = device.usedcores
            entries.append(entry)
    return json.dumps(entries, separators=(",", ":"))


def _network(usage: DeviceUsage) -> int | None:
    value = usage.device.custom.get(NETWORK_ID)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def hccs_islands(kind: DeviceKind, node: NodeView) -> dict[str, str] | None:
    """The node's HCCS islands (`hami_device_islands`): 910-series devices of one ``custominfo.NetworkID``; None for
    other chips (no HCCS network is published for them)."""
    if not kind.common_word.startswith(_910):
        return None
    return {u.id: f"hccs-{network}" for u in node.devices if (network := _network(u)) is not None}


class _Chooser(ShareFitter):
    """`ShareFitter` with the Ascend device choice for several devices (modules, network groups)."""

    def __init__(self, owner: AscendFitter) -> None:
        super().__init__(owner.kind, extra_filter=owner.refuse_device)
        self.owner = owner

    def choose_devices(
        self, candidates: Sequence[Candidate], count: int, context: ChoiceContext
    ) -> Sequence[Candidate]:
        networks = [_network(c.state.usage) for c in candidates] if self.owner.topology else []
        by_network = bool(networks) and all(n is not None for n in networks)
        if count < 2 or not (self.owner.chip.super_pod or by_network):
            return super().choose_devices(candidates, count, context)
        ranked = super().choose_devices(candidates, len(candidates), context)  # all of them, in the policy's order
        if self.owner.chip.super_pod:  # several devices are whole cards: whole modules
            return _modules(ranked, count)
        network_of = {id(c): _network(c.state.usage) for c in ranked}
        return _by_network(ranked, [network_of[id(c)] or 0 for c in ranked], count)


def _modules(ranked: Sequence[Candidate], count: int) -> list[Candidate]:
    """Whole modules (both dies of ``index // 2`` usable), in the order their first die is ranked."""
    by_module: dict[int, list[Candidate]] = {}
    for item in ranked:
        by_module.setdefault(item.device.index // 2, []).append(item)
    chosen: list[Candidate] = []
    for item in ranked:
        module = by_module.get(item.device.index // 2)
        if module is None or len(module) != 2:
            continue
        chosen.extend(sorted(module, key=lambda c: c.device.index))
        del by_module[item.device.index // 2]
        if len(chosen) >= count:
            return chosen[:count]
    raise _NoModules(f"needs {count // 2} whole modules of two NPUs, {len(chosen) // 2} complete ones usable")


def _by_network(ranked: Sequence[Candidate], networks: Sequence[int], count: int) -> list[Candidate]:
    groups: dict[int, list[Candidate]] = {}
    for item, network in zip(ranked, networks, strict=True):
        groups.setdefault(network, []).append(item)
    holding = [g for g in groups.values() if len(g) >= count]
    if holding:
        return min(holding, key=len)[:count]  # ties: the policy's favourite group (dicts keep ranking order)
    chosen: list[Candidate] = []
    for group in sorted(groups.values(), key=len, reverse=True):
        chosen.extend(group[: count - len(chosen)])
        if len(chosen) == count:
            break
    return chosen


def network_bonus(node: NodeView, placement: Sequence[ContainerPlacement]) -> float:
    """HAMi's NetworkID score of a placement: per container, the share of its devices on its most used network;
    0 when a device of the placement has no NetworkID."""
    networks = {u.device.id: _network(u) for u in node.devices}
    score = 0.0
    for devices in placement:
        if not devices:
            continue
        counts: dict[int, int] = {}
        for device in devices:
            network = networks.get(device.uuid)
            if network is None:
                return 0.0
            counts[network] = counts.get(network, 0) + 1
        score += max(counts.values()) / len(devices)
    return score * NETWORK_WEIGHT


class AscendFitter:
    """Fits one pod's requests of one Ascend kind onto candidate nodes; one instance per hook call."""

    def __init__(self, kind: DeviceKind, pod: Pod, policy: SchedulingPolicy, settings: AscendSettings) -> None:
        self.kind = kind
        self.pod = pod
        self.policy = policy
        self.chip = settings.chips[kind.common_word]
        self.topology = kind.common_word.startswith(_910)
        self.selectors = Selectors(kind, pod)
        self.problem = ""
        self.mode: VnpuMode = settings.default_vnpu_mode
        try:
            self.mode = vnpu_mode(pod, settings)
        except RequestError as exc:
            self.problem = str(exc)
        self.share = _Chooser(self)
        self.whole_request = False
        self._pairable: frozenset[str] = frozenset()

    # ------------------------------------------------------------------------------------------ requests

    def granted(self, request: ContainerRequest) -> tuple[ContainerRequest, bool] | str:
        """The request as the share fitter must place it (the grant per device) and whether it is whole cards,
        or why no node can serve it."""
        chip = self.chip
        if request.memory > chip.memory_capacity:
            return (
                f"pod: asks {request.memory} MiB per {self.kind.common_word}, more than one has "
                f"({chip.memory_capacity} MiB)"
            )
        if self.mode == SOFT_SPLIT:
            return request, is_whole_card(request, chip, self.mode)
        template = None if request.memory_percentage == 100 else chip.template_for(request.memory)
        if template is None:  # a count alone, or memory no template holds: the whole card, as HAMi gives it
            return ContainerRequest(kind=request.kind, count=request.count, memory_percentage=100), True
        return ContainerRequest(kind=request.kind, count=request.count, memory=template.memory), False

    # ------------------------------------------------------------------------------------------ fitting

    def fit_nodes(self, requests: Sequence[ContainerRequest | None], nodes: Sequence[NodeView]) -> list[NodeFit]:
        if self.problem:
            return [NodeFit(node=n.name, reason=self.problem) for n in nodes]
        answers = [None if r is None else self.granted(r) for r in requests]
        impossible = next((a for a in answers if isinstance(a, str)), None)
        if impossible is not None:
            return [NodeFit(node=n.name, reason=impossible) for n in nodes]
        grants = [a for a in answers if not isinstance(a, str)]
        placed = [None if g is None else g[0] for g in grants]
        shares = any(g is not None and not g[1] for g in grants)
        self.whole_request = any(g is not None and g[1] and g[0].count > 1 for g in grants)
        annotation = runtime_annotation(self.kind)
        predicate_time = str(int(time.time()))
        fits = []
        for node in nodes:
            refusal = self._node_refusal(node, shares)
            if refusal:
                fits.append(NodeFit(node=node.name, reason=refusal))
                continue
            if self.chip.super_pod and self.whole_request:
                self._pairable = self._complete_modules(node)
            try:
                fit = self.share.fit_node(self.pod, placed, node, self.policy, self.selectors)
            except _NoModules as exc:
                fits.append(NodeFit(node=node.name, reason=f"pod: {exc}"))
                continue
            if fit.placement is None:
                fits.append(fit)
                continue
            fits.append(
                fit.model_copy(
                    update={
                        "score": self._score(node, fit.placement),
                        "pod_annotations": {
                            annotation: runtime_info(fit.placement, self.chip, self.mode),
                            PREDICATE_TIME: predicate_time,
                        },
                    }
                )
            )
        return fits

    def _node_refusal(self, node: NodeView, shares: bool) -> str:
        if not shares:
            return ""
        soft_node = node.annotations.get(SOFT_SPLIT_NODE_ANNOTATION) == "true"
        if self.mode == SOFT_SPLIT and not soft_node:
            return (
                f"pod: soft-split shares of {self.kind.common_word} need a node that serves them "
                f"({SOFT_SPLIT_NODE_ANNOTATION}: true, set by ascend.hamiVnpuCore on its node daemon)"
            )
        if self.mode != SOFT_SPLIT and soft_node:
            return (
                f"pod: the node serves soft-split shares ({SOFT_SPLIT_NODE_ANNOTATION}: true), not vNPU templates; "
                "add the pod annotation huawei.com/vnpu-mode: hami-core for a soft-split share"
            )
        return ""

    def _complete_modules(self, node: NodeView) -> frozenset[str]:
        """Devices whose module (``index // 2``) is wholly free and selectable: what several whole cards may take."""
        cordoned = {p.strip() for p in node.annotations.get(CORDON_ANNOTATION, "").split(",") if p.strip()}

        def free(usage: DeviceUsage) -> bool:
            d = usage.device
            return d.health and d.id not in cordoned and usage.used == 0 and self.selectors.refuses(usage) is None

        modules: dict[int, list[DeviceUsage]] = {}
        for usage in node.devices:
            modules.setdefault(usage.device.index // 2, []).append(usage)
        return frozenset(
            u.device.id
            for members in modules.values()
            if len(members) == 2 and all(map(free, members))
            for u in members
        )

    def refuse_device(self, usage: DeviceUsage, request: ContainerRequest) -> str | None:
        """The share fitter's extra filter: several super-pod whole cards only on complete modules."""
        if self.chip.super_pod and request.count > 1 and usage.device.id not in self._pairable:
            return "module partner not free (whole cards come in modules of two)"
        return None

    def _score(self, node: NodeView, placement: Sequence[ContainerPlacement]) -> float:
        score = node_score(node, placement, self.pod.run_order)
        if not self.topology:
            return score
        bonus = network_bonus(node, placement)
        return score - bonus if self.policy.node == "spread" else score + bonus


def fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
    settings: AscendSettings,
) -> list[NodeFit]:
    """The fits of `pod`'s requests of `kind` on `nodes` (see the module's docstring)."""
    return AscendFitter(kind, pod, policy, settings).fit_nodes(requests, nodes)


def runtime_templates(annotations: Mapping[str, str], kind: DeviceKind) -> dict[str, str]:
    """UUID → template name from a pod's ``huawei.com/<CW>`` annotation (empty when absent or unreadable)."""
    raw = annotations.get(runtime_annotation(kind))
    if not raw:
        return {}
    try:
        entries = json.loads(raw)
    except ValueError:
        return {}
    out: dict[str, str] = {}
    if isinstance(entries, list):
        for entry in entries:
            if isinstance(entry, dict) and isinstance(entry.get("UUID"), str) and isinstance(entry.get("temp"), str):
                out[entry["UUID"]] = entry["temp"]
    return out
