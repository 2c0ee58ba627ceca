"""Victim sets, device by device: what one device must free for a pod, which lower-priority pods hold it, the
sets of them that free it, and what each set costs.

`hami.scheduler.preemption` searches these sets best first and asks the vendor's fitter about them; this module
is the arithmetic it searches over. A device's deficit (`Need.deficit`) is what its slots, memory and cores lack
to serve the pod's per-device request (a lower bound: the fitter judges the rest); the lower-priority grants on
each device of a node, cheapest first, and the devices evictions could free, best first, are kept on the node
until it changes (`NodeRecord.memo`). A set's cost (`Victims.key`) orders sets as preemption prefers them: the
fewest victims, the lowest total priority, the lowest highest priority, the youngest, the fewest under a
PodDisruptionBudget; `Victims.allowed` refuses a set that would evict more of a budget's pods than it allows.

Owns the per-device sets and their order; it asks no vendor, chooses no node and changes nothing of the state
(it reads the pods it is given under the state's lock, held by the caller).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hami.cluster.port import KubeObject, meta, selects
from hami.model import ContainerRequest, DeviceUsage
from hami.scheduler.state import NodeRecord, PodRecord

__all__ = [
    "SIZE_LIMIT",
    "SUBSETS_PER_DEVICE",
    "Budget",
    "FreeableDevice",
    "Grant",
    "Need",
    "Victims",
    "device_grants",
    "freeable_devices",
    "freeing",
    "without_pods",
]

SUBSETS_PER_DEVICE = 2048
"""How many sets of pods one device's enumeration examines before it removes its cheapest pods greedily instead."""
SIZE_LIMIT = 16
"""The most victims one device's sets are enumerated up to."""


@dataclass(frozen=True)
class Budget:
    """A PodDisruptionBudget as preemption needs it: whom it selects and how many of them may go now."""

    namespace: str
    name: str
    selector: Mapping[str, Any]
    allowed: int

    @classmethod
    def from_api(cls, obj: KubeObject) -> Budget:
        m, spec = meta(obj), obj.get("spec") or {}
        allowed = (obj.get("status") or {}).get("disruptionsAllowed")
        return cls(
            namespace=str(m.get("namespace") or "default"),
            name=str(m.get("name") or ""),
            selector=spec.get("selector") or {},
            allowed=allowed if isinstance(allowed, int) else 0,
        )

    def covers(self, record: PodRecord) -> bool:
        """Whether the budget selects the pod."""
        return record.key.partition("/")[0] == self.namespace and selects(self.selector, record.labels)


@dataclass
class Victims:
    """The cost terms of sets of pods (`key`) and whether the budgets allow evicting them (`allowed`)."""

    records: Mapping[str, PodRecord]
    """The pods that may be chosen (or every counted pod: who is eligible was decided before)."""
    budgets: Sequence[Budget]
    _covered: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def covered(self, key: str) -> tuple[int, ...]:
        """The indexes of the budgets selecting the pod."""
        if not self.budgets:
            return ()
        found = self._covered.get(key)
        if found is None:
            record = self.records[key]
            found = self._covered[key] = tuple(i for i, b in enumerate(self.budgets) if b.covers(record))
        return found

    def key(self, keys: Iterable[str]) -> tuple[float, ...]:
        chosen = [self.records[k] for k in keys]
        priorities = [r.priority for r in chosen]
        protected = sum(1 for r in chosen if self.covered(r.key))
        # the work lost, among sets of as many pods: the sum of their ages, ordered as minus the sum of their
        # creation times (a pod of unknown age counts as the oldest)
        return (len(chosen), sum(priorities), max(priorities, default=0), -sum(r.started for r in chosen), protected)

    def allowed(self, keys: Iterable[str]) -> bool:
        """No budget would see more of its pods evicted than it allows."""
        if not self.budgets:
            return True
        spent: dict[int, int] = {}
        for k in keys:
            for i in self.covered(k):
                spent[i] = spent.get(i, 0) + 1
                if spent[i] > self.budgets[i].allowed:
                    return False
        return True


@dataclass(frozen=True, slots=True)
class Grant:
    """What one lower-priority pod holds of one device."""

    key: str
    slots: int
    memory: int
    cores: int
    priority: int
    started: float


@dataclass(frozen=True)
class Need:
    """What one device must have free to serve the pod: a lower bound of the pod's per-device request."""

    memory: Sequence[ContainerRequest]
    cores: int
    count: int
    """How many devices the largest container asks."""

    def deficit(self, usage: DeviceUsage) -> tuple[int, int, int] | None:
        """What must be freed on the device (containers, MiB, cores) to serve the pod; None when nothing can make
        it (unhealthy, too small)."""
        device = usage.device
        if not device.health or device.count < 1:
            return None
        memory = max(r.memory_on(device) for r in self.memory)
        if memory > device.devmem or self.cores > device.devcore > 0:
            return None
        slots = usage.used + 1 - device.count
        mem = usage.usedmem + memory - device.devmem
        if self.cores >= 100:
            return (usage.used, max(mem, usage.usedmem), usage.usedcores)  # an idle device: everybody leaves
        if self.cores == 0:
            cores = usage.usedcores - device.devcore + 1 if device.devcore else 0
        else:
            cores = usage.usedcores + self.cores - device.devcore
        return (max(slots, 0), max(mem, 0), max(cores, 0))

    @property
    def signature(self) -> tuple[object, ...]:
        return (tuple((r.memory, r.memory_percentage) for r in self.memory), self.cores, self.count)


@dataclass(frozen=True)
class FreeableDevice:
    """A device that evictions could free: the lower-priority grants on it (cheapest first), what must go, and the
    fewest grants that could cover it."""

    grants: tuple[Grant, ...]
    deficit: tuple[int, int, int]
    lower: int | None
    priorities: tuple[int, ...]
    """The grants' priorities, lowest first."""
    starts: tuple[float, ...]
    """The grants' creation times, latest first."""
    first: tuple[float, ...] = ()
    """`bound(lower)`."""

    @classmethod
    def of(cls, grants: tuple[Grant, ...], deficit: tuple[int, int, int]) -> FreeableDevice:
        lower = _lower_bound(grants, deficit)
        priorities = tuple(sorted(g.priority for g in grants))
        starts = tuple(sorted((g.started for g in grants), reverse=True))
        device = cls(grants, deficit, lower, priorities, starts)
        return replace(device, first=device.bound(lower or 0))

    def bound(self, size: int) -> tuple[float, ...]:
        """No set of `size` of the grants has a smaller key (`Victims.key`, its PDB term bounded by 0)."""
        cheapest = self.priorities[:size]
        return (size, sum(cheapest), max(cheapest, default=0), -sum(self.starts[:size]), 0)


def without_pods(devices: Sequence[FreeableDevice], gone: frozenset[str]) -> list[FreeableDevice]:
    """`devices` with the grants of the `gone` pods left out (best first again)."""
    kept = []
    for device in devices:
        grants = tuple(g for g in device.grants if g.key not in gone)
        if len(grants) != len(device.grants):
            device = FreeableDevice.of(grants, device.deficit)
        if device.lower:
            kept.append(device)
    kept.sort(key=lambda d: d.first)
    return kept


def _lower_bound(grants: Sequence[Grant], deficit: tuple[int, int, int]) -> int | None:
    """The fewest of `grants` that could cover `deficit` (None: all of them cannot)."""
    if deficit == (0, 0, 0):
        return 0
    bound = 0
    for field_index, needed in enumerate(deficit):
        if needed <= 0:
            continue
        values = sorted((g.slots, g.memory, g.cores)[field_index] for g in grants)
        total, taken = 0, 0
        while total < needed and values:
            total += values.pop()
            taken += 1
        if total < needed:
            return None
        bound = max(bound, taken)
    return bound


def freeing(grants: Sequence[Grant], deficit: tuple[int, int, int], size: int) -> list[frozenset[str]]:
    """Every set of `size` of `grants` that covers `deficit` (the cheapest pods first; past
    `SUBSETS_PER_DEVICE` sets, only the greedy one)."""
    if size == 0:
        return [frozenset()]
    found: list[frozenset[str]] = []
    for examined, combination in enumerate(itertools.combinations(grants, size)):
        if examined >= SUBSETS_PER_DEVICE:
            break
        if (
            sum(g.slots for g in combination) >= deficit[0]
            and sum(g.memory for g in combination) >= deficit[1]
            and sum(g.cores for g in combination) >= deficit[2]
        ):
            found.append(frozenset(g.key for g in combination))
    return found


def device_grants(record: NodeRecord, pods: Mapping[str, PodRecord], kind: str, priority: int) -> list[list[Grant]]:
    """Per device of the node's `kind` view (in order), the grants of pods of lower priority than `priority`,
    cheapest first; kept on the node until it changes (`NodeRecord.memo`)."""
    slot = ("preemption", kind, priority)
    memo = record.memo.get(slot)
    if isinstance(memo, list):
        return memo
    index = {u.device.id: i for i, u in enumerate(record.views[kind].devices)}
    per_device: list[list[Grant]] = [[] for _ in index]
    for key in record.pods:
        victim = pods.get(key)
        if victim is None or victim.priority >= priority:
            continue
        for device_id, grant in victim.grants.get(kind, {}).items():
            i = index.get(device_id)
            if i is not None:
                per_device[i].append(
                    Grant(key, grant.slots, grant.memory, grant.cores, victim.priority, victim.started)
                )
    for grants in per_device:
        grants.sort(key=lambda g: (g.priority, -g.started, g.key))
    record.remember(slot, per_device)
    return per_device


def freeable_devices(
    record: NodeRecord, pods: Mapping[str, PodRecord], kind: str, priority: int, need: Need
) -> list[FreeableDevice]:
    """The node's devices that evicting pods below `priority` could free for `need` (kept on the node until it
    changes, `NodeRecord.memo`)."""
    slot = ("preemption", kind, priority, need.signature)
    memo = record.memo.get(slot)
    if isinstance(memo, list):
        return memo
    on_devices = device_grants(record, pods, kind, priority)
    devices = []
    for index, usage in enumerate(record.views[kind].devices):
        deficit = need.deficit(usage)
        if deficit is None:
            continue
        device = FreeableDevice.of(tuple(on_devices[index]), deficit)
        if device.lower:  # None: cannot be freed; 0: free already (the node is refused for another reason)
            devices.append(device)
    devices.sort(key=lambda d: d.first)
    record.remember(slot, devices)
    return devices
