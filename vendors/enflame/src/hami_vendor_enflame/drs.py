"""HAMi's Enflame DRS kind (``Enflame``): GCUs split by the driver into DRS instances of fixed profiles.

Enflame's DRS device plugin publishes a node's cards and the profiles they can be split into in the node
annotation ``enflame.com/gcu-drs-capacity`` (JSON ``{"devices": [{"index", "minor", "capacity"}], "profiles":
{"<slices>g.<GB>gb": "<profile id>"}}``), creates the instance a pod's annotations name, and serves the kubelet's
Allocate. HAMi v2.10 does only the scheduler's part, and so does this module; a node needs Enflame's DRS plugin
(the node daemon here serves whole cards only). What it owns, after HAMi's ``pkg/device/enflame/device.go``:

* `node_devices`: card ``i`` as ``<node>-enflame-drs-<i>``, ``capacity`` slices, memory the largest profile's GB ×
  1024 MiB, 100 cores; a malformed annotation gives the node no DRS cards (logged, naming the annotation);
* `read_ask`: ``enflame.com/drs-gcu: <n>`` asks for the profile of ``n`` slices; otherwise ``enflame.com/gcu-memory``
  (GB, or MiB when above twice the largest profile's GB) and ``enflame.com/gcu-core`` (percent, 1-100) ask for the
  smallest profile (by slices, then GB) holding both. One instance per container;
* `fit_nodes`: per node, each container's ask turned into its profile (memory ``GB × 1024`` MiB, cores
  ``ceil(slices × 100 / max slices)``), then core's share fitter (health, use/no-use selectors
  ``enflame.com/use-gpuuuid``/``nouse-gpuuuid``, slots, memory, cores, the device policy, ``mutex``);
* `pod_annotations`, what HAMi's ``PatchAnnotations`` writes for Enflame's plugin: ``enflame.com/gcu-assigned``
  ``false``, ``enflame.com/gcu-assigned-time`` (nanoseconds), ``assigned-containers`` (JSON by container name:
  ``allocated``, ``request`` slices, ``profileID``, ``profileName``, in Go's encoding), and from the first container
  placed ``enflame.com/gcu-assigned-index`` = ``enflame.com/gcu-assigned-id`` (the card's index),
  ``enflame.com/gcu-assigned-minor`` and ``enflame.com/gcu-request-size``.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami.errors import RequestError
from hami.fitting import Selectors, ShareFitter
from hami.model import (
    Container,
    ContainerPlacement,
    ContainerRequest,
    Device,
    DeviceKind,
    NodeFit,
    NodeView,
    Pod,
    SchedulingPolicy,
)
from hami.requests import read_count

__all__ = ["CAPACITY_ANNOTATION", "Profile", "fit_nodes", "node_devices", "pod_annotations", "read_ask"]

log = logging.getLogger("hami_vendor_enflame")

CAPACITY_ANNOTATION = "enflame.com/gcu-drs-capacity"
DRS, MEMORY, CORE = "enflame.com/drs-gcu", "enflame.com/gcu-memory", "enflame.com/gcu-core"
ASSIGNED, ASSIGNED_TIME = "enflame.com/gcu-assigned", "enflame.com/gcu-assigned-time"
ASSIGNED_INDEX, ASSIGNED_ID = "enflame.com/gcu-assigned-index", "enflame.com/gcu-assigned-id"
ASSIGNED_MINOR, REQUEST_SIZE = "enflame.com/gcu-assigned-minor", "enflame.com/gcu-request-size"
ASSIGNED_CONTAINERS = "assigned-containers"
INT32 = 2**31 - 1
_ATOI = re.compile(r"[+-]?[0-9]+")


def _atoi(text: str) -> int | None:
    return int(text) if _ATOI.fullmatch(text) else None


def parse_profile(name: str) -> tuple[int, int]:
    """HAMi's ``parseProfile``: ``"3g.20gb"`` → (3 slices, 20 GB); (0, 0) or (slices, 0) when unreadable."""
    parts = name.strip().lower().split(".")
    if len(parts) < 2:
        return 0, 0
    size = _atoi(parts[0].strip().removesuffix("g"))
    if size is None:
        return 0, 0
    memory = _atoi(parts[1].strip().removesuffix("gb"))
    return size, memory or 0


def _capacity(raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise ValueError(f"capacity {raw!r} is not a number")
    if isinstance(raw, str):
        value = _atoi(raw.strip())
        if value is None:
            raise ValueError(f"capacity {raw!r} is not a whole number")
        return min(value, INT32)
    if math.isnan(raw) or raw > INT32 or raw < -INT32 - 1:
        raise ValueError(f"capacity {raw!r} is out of range")
    return int(raw)


def node_devices(annotations: Mapping[str, str], node: str) -> list[Device]:
    """The node's DRS cards from Enflame's ``enflame.com/gcu-drs-capacity`` (see the module); ``[]`` without it."""
    raw = annotations.get(CAPACITY_ANNOTATION)
    if raw is None:
        return []
    try:
        return _devices(json.loads(raw), node)
    except (ValueError, TypeError) as exc:
        log.warning("node %s: ignoring its Enflame DRS cards: %s %s", node, CAPACITY_ANNOTATION, exc)
        return []


def _devices(spec: Any, node: str) -> list[Device]:
    if not isinstance(spec, dict):
        raise ValueError("is not a JSON object")
    profiles, cards = spec.get("profiles") or {}, spec.get("devices") or []
    if not isinstance(profiles, dict) or not all(isinstance(v, str) for v in profiles.values()):
        raise ValueError('has "profiles" that are not an object of profile name to profile id string')
    if not isinstance(cards, list) or not all(isinstance(c, dict) for c in cards):
        raise ValueError('has "devices" that are not a list of objects')
    sizes = [parse_profile(p) for p in profiles]
    max_slice, max_gb = max((s for s, _ in sizes), default=0), max((m for _, m in sizes), default=0)
    if max_slice <= 0:
        raise ValueError("names no valid DRS profile (<slices>g.<GB>gb)")
    max_gb = max_gb if max_gb > 0 else max_slice
    out = []
    for position, card in enumerate(cards):
        index_text, minor = card.get("index", ""), card.get("minor", "")
        if not isinstance(index_text, str) or not isinstance(minor, str):
            raise ValueError(f"device {position}: index and minor must be strings")
        index = _atoi(index_text)
        index = position if index is None else index
        capacity = _capacity(card.get("capacity"))
        if capacity <= 0 or index < 0:
            raise ValueError(f"device {position}: capacity {capacity} and index {index} must not be negative or 0")
        custom = {"minor": minor.strip() or str(index), "index": str(index), "profiles": dict(profiles),
                  "maxSlice": max_slice}  # fmt: skip
        out.append(Device(id=f"{node}-enflame-drs-{index}", index=index, count=capacity, devmem=max_gb * 1024,
                          devcore=100, type="Enflame", vendor="Enflame", custom=custom))  # fmt: skip
    return out


@dataclass(frozen=True)
class Ask:
    """One container's DRS ask: a profile size (``drs-gcu``), or memory (GB or MiB) and cores (percent)."""

    size: int | None = None
    memory: int = 0
    cores: int = 0

    def __str__(self) -> str:
        if self.size is not None:
            return f"{self.size} slices ({DRS})"
        return f"{self.memory} memory and {self.cores}% cores ({MEMORY}, {CORE})"


def read_ask(container: Container) -> Ask | None:
    """The container's ask (see the module). :raises RequestError: a value that is not a legal number."""
    size = read_count(container, DRS, unit="DRS slices", limit=INT32)
    memory = read_count(container, MEMORY, unit="GB (or MiB)", limit=INT32)  # read (so checked) even when unused
    cores = read_count(container, CORE, unit="percent", limit=INT32)
    if size is not None:
        if size <= 0:
            raise RequestError(DRS, container.resource(DRS) or "", f"is not legal: {DRS} must be greater than 0")
        return Ask(size=size)
    if memory is None and cores is None:
        return None
    if memory is not None and memory <= 0:
        raise RequestError(MEMORY, container.resource(MEMORY) or "", f"is not legal: {MEMORY} must be greater than 0")
    if cores is not None and not 0 < cores <= 100:
        raise RequestError(CORE, container.resource(CORE) or "", f"is not legal: {CORE} must be in range (0,100]")
    return Ask(memory=memory or 0, cores=cores or 0)


@dataclass(frozen=True)
class Profile:
    name: str
    id: str
    size: int
    memory_gb: int
    cores: int


def profiles_of(devices: Sequence[Device]) -> list[Profile]:
    """The DRS profiles a node's cards offer, smallest first (slices, then GB), as HAMi's ``collectDRSProfiles``."""
    max_slice = max((int(d.custom.get("maxSlice") or 0) for d in devices), default=0)
    seen: dict[str, Profile] = {}
    for d in devices:
        for name, pid in (d.custom.get("profiles") or {}).items():
            size, gb = parse_profile(name)
            if size > 0 and gb > 0 and max_slice > 0:
                seen[name] = Profile(name, pid, size, gb, -(-size * 100 // max_slice))
    return sorted(seen.values(), key=lambda p: (p.size, p.memory_gb, p.name))


def select(profiles: Sequence[Profile], ask: Ask) -> Profile | None:
    """HAMi's ``selectProfileByRequest``, bounded as its ``Fit`` bounds the answer."""
    if not profiles:
        return None
    if ask.size is not None:
        chosen = next((p for p in profiles if p.size == ask.size), None)
    else:
        largest = profiles[-1].memory_gb
        gb = ask.memory if ask.memory <= 2 * largest else -(-ask.memory // 1024)
        chosen = next((p for p in profiles if (gb <= 0 or p.memory_gb >= gb) and p.cores >= ask.cores), None)
    if chosen is None or chosen.size > INT32 or chosen.memory_gb > INT32 // 1024 or chosen.cores > INT32:
        return None
    return chosen


def _ask_of(pod: Pod, index: int, request: ContainerRequest) -> Ask:
    containers = pod.all_containers
    ask = read_ask(containers[index]) if index < len(containers) else None
    return ask or Ask(memory=request.memory, cores=request.cores)


def fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
    now_ns: int | None = None,
) -> list[NodeFit]:
    """Every node's fit for the pod's DRS asks (see the module)."""
    asks = [None if r is None else _ask_of(pod, i, r) for i, r in enumerate(requests)]
    fitter, selectors = ShareFitter(kind), Selectors(kind, pod)
    now = time.time_ns() if now_ns is None else now_ns
    names = [c.name for c in pod.all_containers]
    out = []
    for node in nodes:
        profiles = profiles_of([u.device for u in node.devices])
        chosen: list[Profile | None] = []
        for i, ask in enumerate(asks):
            chosen.append(None if ask is None else select(profiles, ask))
            if ask is not None and chosen[-1] is None:
                who = f"container {names[i]}" if i < len(names) and len(asks) > 1 else "pod"
                offered = ", ".join(p.name for p in profiles) or "none"
                out.append(NodeFit(node=node.name, reason=f"{who}: no DRS profile fits {ask} (profiles: {offered})"))
                break
        else:
            converted = [None if p is None or r is None else
                         ContainerRequest(kind=kind.common_word, count=r.count, memory=p.memory_gb * 1024,
                                          cores=p.cores)
                         for p, r in zip(chosen, requests, strict=True)]  # fmt: skip
            fit = fitter.fit_node(pod, converted, node, policy, selectors)
            if fit.placement is not None:
                extra = pod_annotations(pod, node, fit.placement, chosen, now)
                fit = fit.model_copy(update={"pod_annotations": {**fit.pod_annotations, **extra}})
            out.append(fit)
    return out


def pod_annotations(
    pod: Pod, node: NodeView, placement: Sequence[ContainerPlacement], chosen: Sequence[Profile | None], now_ns: int
) -> dict[str, str]:
    """HAMi's DRS pod annotations for `placement` (see the module)."""
    cards = {u.device.id: u.device for u in node.devices}
    names = [c.name for c in pod.all_containers]
    out = {ASSIGNED: "false", ASSIGNED_TIME: str(now_ns)}
    assigned: dict[str, dict[str, Any]] = {}
    for i, devices in enumerate(placement):
        profile = chosen[i] if i < len(chosen) else None
        if not devices or profile is None:
            continue
        card = cards.get(devices[0].uuid)
        entry: dict[str, Any] = {"allocated": False, "request": profile.size}
        entry.update({k: v for k, v in (("profileID", profile.id), ("profileName", profile.name)) if v})
        assigned[names[i] if i < len(names) else f"container-{i}"] = entry
        if card is not None and ASSIGNED_INDEX not in out:
            out[ASSIGNED_INDEX] = out[ASSIGNED_ID] = str(card.custom.get("index", ""))
            out[ASSIGNED_MINOR] = str(card.custom.get("minor", ""))
        out.setdefault(REQUEST_SIZE, str(profile.size))
    if assigned:
        out[ASSIGNED_CONTAINERS] = go_json(assigned)
    return out


def go_json(value: Mapping[str, Any]) -> str:
    """JSON as Go's ``encoding/json`` writes a map of structs: the map's keys sorted, each struct's fields in the
    order given, no spaces, ``<``, ``>``, ``&``, U+2028 and U+2029 escaped as ``\\uXXXX``."""
    text = json.dumps(dict(sorted(value.items())), separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                          ("\u2029", "\\u2029")):  # fmt: skip
        text = text.replace(char, escaped)
    return text
