"""Victim selection by device: which node, and which lower-priority pods on it, to evict so that a pod fits.

kube-scheduler's own preemption counts only what its plugins see (a node's `nvidia.com/gpu` slots), so for a pod
HAMi refuses for device memory or cores it finds "no victims needed" and evicts nothing (docs/preemption.md). This
module answers the question on the devices themselves: for each candidate node it works out, device by device,
the cheapest sets of pods whose grants, once removed, leave a device able to serve the pod's per-device request
(a slot, the memory, the cores, an idle device for an exclusive request), combines them into as many devices as
the pod asks, and then asks the vendor's own fitter (`hami_fit_nodes`, through `hami.fitting` for share-based
vendors) whether the pod really fits on the node without them: memory, cores, count, device policy, NUMA and
topology, type selectors and MIG profiles are the vendor's to judge, never re-implemented here. The first set that
the fitter accepts, in the order below, wins; when no per-device set is accepted (a topology rule that needs
devices the per-device sets did not free), all the node's lower-priority pods are removed and then given back one
by one, the most expensive first, while the pod still fits (kube-scheduler's reprieve).

Order of preference between sets (`Choice.key`): the fewest victims; then the lowest total priority; then the
lowest highest priority among them; then the least work lost (the youngest pods: the smallest sum of their ages);
then the fewest victims under a PodDisruptionBudget. A pod whose priority is not lower than the preemptor's is
never a victim; a pod with `preemptionPolicy: Never` preempts nobody; a set that evicts more pods matched by a
PodDisruptionBudget than the budget allows is never chosen (the Eviction API would refuse it).

Owns choosing; it changes nothing: it reads the `ClusterState` under its lock and copies the views it removes
victims from. Evicting and holding the room are `hami.scheduler.preempting`'s.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hami.cluster.port import KubeObject, meta, selects
from hami.model import (
    ContainerPlacement,
    ContainerRequest,
    DeviceUsage,
    NodeView,
    Pod,
    SchedulingPolicy,
)
from hami.plugins import VendorPlugins
from hami.scheduler.state import ClusterState, NodeRecord, PodRecord

__all__ = ["Budget", "Choice", "VictimSelector", "may_preempt"]

SUBSETS_PER_DEVICE = 2048
"""How many sets of pods one device's enumeration examines before it removes its cheapest pods greedily instead."""
OPTIONS_TRIED = 32
"""How many per-device sets, best first, the vendor's fitter is asked about before the reprieve fallback (and how
many nodes the reprieve then judges)."""
SIZE_LIMIT = 16
"""The most victims one device's sets are enumerated up to."""


def may_preempt(pod: Pod) -> str | None:
    """Why `pod` may not preempt anybody (None: it may)."""
    if pod.preemption_policy == "Never":
        return "its preemptionPolicy is Never"
    return None


# ---------------------------------------------------------------------------------- budgets


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


# ---------------------------------------------------------------------------------- the choice


@dataclass(frozen=True)
class Choice:
    """A node, the victims whose eviction makes the pod fit there, and the placement the pod would then get."""

    node: str
    victims: tuple[PodRecord, ...]
    allocation: Mapping[str, tuple[ContainerPlacement, ...]]
    annotations: Mapping[str, str]
    key: tuple[float, ...]


@dataclass
class _Victims:
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
class _Grant:
    """What one lower-priority pod holds of one device."""

    key: str
    slots: int
    memory: int
    cores: int
    priority: int
    started: float


@dataclass(frozen=True)
class _Need:
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
class _Device:
    """A device that evictions could free: the lower-priority grants on it (cheapest first), what must go, and the
    fewest grants that could cover it."""

    grants: tuple[_Grant, ...]
    deficit: tuple[int, int, int]
    lower: int | None
    priorities: tuple[int, ...]
    """The grants' priorities, lowest first."""
    starts: tuple[float, ...]
    """The grants' creation times, latest first."""
    first: tuple[float, ...] = ()
    """`bound(lower)`."""

    @classmethod
    def of(cls, grants: tuple[_Grant, ...], deficit: tuple[int, int, int]) -> _Device:
        lower = _lower_bound(grants, deficit)
        priorities = tuple(sorted(g.priority for g in grants))
        starts = tuple(sorted((g.started for g in grants), reverse=True))
        device = cls(grants, deficit, lower, priorities, starts)
        return replace(device, first=device.bound(lower or 0))

    def bound(self, size: int) -> tuple[float, ...]:
        """No set of `size` of the grants has a smaller key (`_Victims.key`, its PDB term bounded by 0)."""
        cheapest = self.priorities[:size]
        return (size, sum(cheapest), max(cheapest, default=0), -sum(self.starts[:size]), 0)


def _without_pods(devices: Sequence[_Device], gone: frozenset[str]) -> list[_Device]:
    """`devices` with the grants of the `gone` pods left out (best first again)."""
    kept = []
    for device in devices:
        grants = tuple(g for g in device.grants if g.key not in gone)
        if len(grants) != len(device.grants):
            device = _Device.of(grants, device.deficit)
        if device.lower:
            kept.append(device)
    kept.sort(key=lambda d: d.first)
    return kept


def _lower_bound(grants: Sequence[_Grant], deficit: tuple[int, int, int]) -> int | None:
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


def _freeing(grants: Sequence[_Grant], deficit: tuple[int, int, int], size: int) -> list[frozenset[str]]:
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


class VictimSelector:
    """Chooses a preemption for a pod over the scheduler's `ClusterState`."""

    def __init__(self, host: VendorPlugins, state: ClusterState) -> None:
        self.host = host
        self.state = state

    def select(
        self,
        pod: Pod,
        requests: Mapping[str, Sequence[ContainerRequest | None]],
        policy: SchedulingPolicy,
        node_names: Sequence[str],
        budgets: Sequence[Budget] = (),
        exclude: frozenset[str] = frozenset(),
    ) -> Choice | None:
        """The best preemption among `node_names`, or None when evicting lower-priority pods makes it fit nowhere.
        `exclude`: pod keys that must not be victims (already leaving, or held for another preemptor)."""
        if may_preempt(pod) is not None or not requests:
            return None
        kinds = sorted(requests)
        own = f"{pod.namespace}/{pod.name}"
        with self.state.lock:
            records = [r for r in map(self.state.nodes.get, node_names) if r is not None]
            records = [r for r in records if all(k in r.views for k in kinds)]
            if len(kinds) == 1:
                asked = [r for r in requests[kinds[0]] if r is not None]
                if asked:
                    need = _Need(asked, max(r.cores for r in asked), max(r.count for r in asked))
                    choice = self._by_device(pod, requests, kinds[0], policy, records, need, budgets, exclude, own)
                    if choice is not None:
                        return choice
            best: Choice | None = None
            for record in records[:OPTIONS_TRIED]:
                victims = self._victims(record, pod, budgets, exclude | {own})
                if not victims.records:
                    continue
                choice = self._reprieve(record, pod, requests, kinds, policy, victims)
                if choice is not None and (best is None or choice.key < best.key):
                    best = choice
            return best

    def _by_device(
        self,
        pod: Pod,
        requests: Mapping[str, Sequence[ContainerRequest | None]],
        kind: str,
        policy: SchedulingPolicy,
        records: Sequence[NodeRecord],
        need: _Need,
        budgets: Sequence[Budget],
        exclude: frozenset[str],
        own: str,
    ) -> Choice | None:
        """Best first over every node's devices: each device enters a heap under a lower bound of the key of the
        sets that free it (its fewest victims, the cheapest pods' priorities and ages), a popped device's sets of
        that size go back into the heap under their own keys, and the first set popped that the vendor's fitter
        accepts is the best there is."""
        by_name = {r.name: r for r in records}
        victims = _Victims(self.state.pods, budgets)
        heap: list[tuple[tuple[float, ...], int, str, object, int]] = []
        sequence = itertools.count()
        for record in records:
            devices = self._devices(record, kind, pod.priority, need)
            if devices and (exclude or own in record.pods):
                devices = _without_pods(devices, exclude | {own})
            if devices:
                heap.append((devices[0].first, next(sequence), record.name, devices, 0))
        heapq.heapify(heap)
        if need.count > 1:
            options: list[tuple[tuple[float, ...], str, frozenset[str]]] = []
            for _, _, name, listed, _ in heap:
                assert isinstance(listed, list)
                for device in listed:
                    for size in range(device.lower or 1, SIZE_LIMIT + 1):
                        sets = [c for c in _freeing(device.grants, device.deficit, size) if victims.allowed(c)]
                        if sets:
                            options.extend((victims.key(c), name, c) for c in sets)
                            break
            return self._first_fit(pod, requests, kind, policy, by_name, victims,
                                   self._combined(options, need.count, victims))  # fmt: skip
        tried = 0
        while heap and tried < OPTIONS_TRIED:
            _, _, name, item, size = heapq.heappop(heap)
            if isinstance(item, frozenset):  # a set of victims: the best left, if the vendor's fitter agrees
                tried += 1
                fit = self._fits(by_name[name], pod, requests, [kind], policy, item)
                if fit is not None:
                    return self._choice(name, victims, item, fit)
                continue
            if isinstance(item, list):  # a node's devices from the size-th on: the next one, and the rest later
                device = item[size]
                heapq.heappush(heap, (device.first, next(sequence), name, device, 0))
                if size + 1 < len(item):
                    heapq.heappush(heap, (item[size + 1].first, next(sequence), name, item, size + 1))
                continue
            assert isinstance(item, _Device)
            size = size or item.lower or 1
            sets = [c for c in _freeing(item.grants, item.deficit, size) if victims.allowed(c)]
            for chosen in sets:
                heapq.heappush(heap, (victims.key(chosen), next(sequence), name, chosen, size))
            if not sets and size < min(SIZE_LIMIT, len(item.grants)):
                heapq.heappush(heap, (item.bound(size + 1), next(sequence), name, item, size + 1))
        return None

    def _devices(self, record: NodeRecord, kind: str, priority: int, need: _Need) -> list[_Device]:
        """The node's devices that evicting pods below `priority` could free for `need` (kept on the node until it
        changes, `NodeRecord.memo`)."""
        slot = ("preemption", kind, priority, need.signature)
        memo = record.memo.get(slot)
        if isinstance(memo, list):
            return memo
        on_devices = self._grants(record, kind, priority)
        devices = []
        for index, usage in enumerate(record.views[kind].devices):
            deficit = need.deficit(usage)
            if deficit is None:
                continue
            device = _Device.of(tuple(on_devices[index]), deficit)
            if device.lower:  # None: cannot be freed; 0: free already (the node is refused for another reason)
                devices.append(device)
        devices.sort(key=lambda d: d.first)
        record.remember(slot, devices)
        return devices

    def _first_fit(
        self,
        pod: Pod,
        requests: Mapping[str, Sequence[ContainerRequest | None]],
        kind: str,
        policy: SchedulingPolicy,
        by_name: Mapping[str, NodeRecord],
        victims: _Victims,
        options: Sequence[tuple[tuple[float, ...], str, frozenset[str]]],
    ) -> Choice | None:
        """The first of `options` (best first) that the vendor's fitter accepts."""
        for _, name, chosen in sorted(options)[:OPTIONS_TRIED]:
            fit = self._fits(by_name[name], pod, requests, [kind], policy, chosen)
            if fit is not None:
                return self._choice(name, victims, chosen, fit)
        return None

    @staticmethod
    def _combined(
        options: list[tuple[tuple[float, ...], str, frozenset[str]]], count: int, victims: _Victims
    ) -> list[tuple[tuple[float, ...], str, frozenset[str]]]:
        """For a pod asking `count` devices: per node, the union of the cheapest sets of `count` distinct devices."""
        per_node: dict[str, list[tuple[tuple[float, ...], frozenset[str]]]] = {}
        for key, name, chosen in options:
            per_node.setdefault(name, []).append((key, chosen))
        combined = []
        for name, sets in per_node.items():
            sets.sort(key=lambda item: item[0])
            for group in itertools.islice(itertools.combinations([s for _, s in sets], count), OPTIONS_TRIED):
                union = frozenset().union(*group)
                if victims.allowed(union):
                    combined.append((victims.key(union), name, union))
        return combined

    # ------------------------------------------------------------------------------ per node

    def _grants(self, record: NodeRecord, kind: str, priority: int) -> list[list[_Grant]]:
        """Per device of the node's `kind` view (in order), the grants of pods of lower priority than `priority`,
        cheapest first; kept on the node until it changes (`NodeRecord.memo`)."""
        slot = ("preemption", kind, priority)
        memo = record.memo.get(slot)
        if isinstance(memo, list):
            return memo
        index = {u.device.id: i for i, u in enumerate(record.views[kind].devices)}
        per_device: list[list[_Grant]] = [[] for _ in index]
        for key in record.pods:
            victim = self.state.pods.get(key)
            if victim is None or victim.priority >= priority:
                continue
            for device_id, grant in victim.grants.get(kind, {}).items():
                i = index.get(device_id)
                if i is not None:
                    per_device[i].append(
                        _Grant(key, grant.slots, grant.memory, grant.cores, victim.priority, victim.started)
                    )
        for grants in per_device:
            grants.sort(key=lambda g: (g.priority, -g.started, g.key))
        record.remember(slot, per_device)
        return per_device

    def _victims(self, record: NodeRecord, pod: Pod, budgets: Sequence[Budget], exclude: frozenset[str]) -> _Victims:
        """The node's pods of lower priority than `pod`, but `exclude`."""
        records: dict[str, PodRecord] = {}
        for key in record.pods:
            victim = self.state.pods.get(key)
            if victim is not None and key not in exclude and victim.priority < pod.priority:
                records[key] = victim
        return _Victims(records, budgets)

    def _reprieve(
        self,
        record: NodeRecord,
        pod: Pod,
        requests: Mapping[str, Sequence[ContainerRequest | None]],
        kinds: Sequence[str],
        policy: SchedulingPolicy,
        victims: _Victims,
    ) -> Choice | None:
        """All the node's victims removed, then given back one by one, the most expensive first, while the pod
        still fits; None when it does not fit even without all of them."""
        chosen = set(victims.records)
        fit = self._fits(record, pod, requests, kinds, policy, frozenset(chosen))
        if fit is None:
            return None
        costly = sorted(chosen, key=lambda k: victims.key((k,)), reverse=True)
        for key in costly:
            trial = frozenset(chosen - {key})
            again = self._fits(record, pod, requests, kinds, policy, trial)
            if again is not None:
                chosen.discard(key)
                fit = again
        final = frozenset(chosen)
        if not victims.allowed(final):
            return None
        return self._choice(record.name, victims, final, fit)

    def _choice(
        self,
        node: str,
        victims: _Victims,
        victim_set: frozenset[str],
        fit: tuple[dict[str, tuple[ContainerPlacement, ...]], dict[str, str]],
    ) -> Choice:
        ordered = tuple(sorted((victims.records[k] for k in victim_set), key=lambda r: r.key))
        return Choice(node, ordered, fit[0], fit[1], victims.key(victim_set))

    def _fits(
        self,
        record: NodeRecord,
        pod: Pod,
        requests: Mapping[str, Sequence[ContainerRequest | None]],
        kinds: Sequence[str],
        policy: SchedulingPolicy,
        removed: frozenset[str],
    ) -> tuple[dict[str, tuple[ContainerPlacement, ...]], dict[str, str]] | None:
        """The vendors' placement of the pod on the node with `removed` gone, or None when it does not fit."""
        allocation: dict[str, tuple[ContainerPlacement, ...]] = {}
        annotations: dict[str, str] = {}
        for kind in kinds:
            view = without(record, kind, [self.state.pods[k] for k in removed])
            fits = self.host.fit_nodes(kind, pod, list(requests[kind]), [view], policy)
            if not fits or fits[0].placement is None:
                return None
            allocation[kind] = fits[0].placement
            annotations.update(fits[0].pod_annotations)
        return allocation, annotations


def without(record: NodeRecord, kind: str, removed: Sequence[PodRecord]) -> NodeView:
    """A copy of the node's view of `kind` as it would be without the `removed` pods' grants (the state's view is
    left as it is)."""
    view = record.views[kind]
    view.cpu_free, view.memory_free = record.cpu_free, record.memory_free
    freed: dict[str, tuple[int, int, int]] = {}
    for victim in removed:
        for device_id, grant in victim.grants.get(kind, {}).items():
            slots, memory, cores = freed.get(device_id, (0, 0, 0))
            freed[device_id] = (slots + grant.slots, memory + grant.memory, cores + grant.cores)
    devices = []
    for usage in view.devices:
        gone = freed.get(usage.device.id)
        if gone is None:
            devices.append(usage)
        else:
            devices.append(
                DeviceUsage.model_construct(
                    device=usage.device,
                    used=max(0, usage.used - gone[0]),
                    usedmem=max(0, usage.usedmem - gone[1]),
                    usedcores=max(0, usage.usedcores - gone[2]),
                )
            )
    names = {v.key for v in removed}
    pods = {k: p for k, p in view.pods.items() if k not in names}
    return view.model_copy(update={"devices": devices, "pods": pods})
