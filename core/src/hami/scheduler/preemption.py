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

Owns choosing: the search over nodes and sets, best first, and the vendor's verdict on each. The sets of one
device, their costs and the budgets' allowance are `hami.scheduler.victimsets`'s. It changes nothing: it reads the
`ClusterState` under its lock and copies the views it removes victims from. Evicting and holding the room are
`hami.scheduler.preempting`'s.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hami.model import ContainerPlacement, ContainerRequest, DeviceUsage, NodeView, Pod, SchedulingPolicy
from hami.plugins import VendorPlugins
from hami.scheduler.state import ClusterState, NodeRecord, PodRecord
from hami.scheduler.victimsets import (
    SIZE_LIMIT,
    Budget,
    FreeableDevice,
    Need,
    Victims,
    freeable_devices,
    freeing,
    without_pods,
)

__all__ = ["Budget", "Choice", "VictimSelector", "may_preempt"]

OPTIONS_TRIED = 32
"""How many per-device sets, best first, the vendor's fitter is asked about before the reprieve fallback (and how
many nodes the reprieve then judges)."""


def may_preempt(pod: Pod) -> str | None:
    """Why `pod` may not preempt anybody (None: it may)."""
    if pod.preemption_policy == "Never":
        return "its preemptionPolicy is Never"
    return None


@dataclass(frozen=True)
class Choice:
    """A node, the victims whose eviction makes the pod fit there, and the placement the pod would then get."""

    node: str
    victims: tuple[PodRecord, ...]
    allocation: Mapping[str, tuple[ContainerPlacement, ...]]
    annotations: Mapping[str, str]
    key: tuple[float, ...]


class VictimSelector:
    """Chooses a preemption for a pod over the scheduler's `ClusterState`."""

    def __init__(self, plugins: VendorPlugins, state: ClusterState) -> None:
        self.plugins = plugins
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
                    need = Need(asked, max(r.cores for r in asked), max(r.count for r in asked))
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
        need: Need,
        budgets: Sequence[Budget],
        exclude: frozenset[str],
        own: str,
    ) -> Choice | None:
        """Best first over every node's devices: each device enters a heap under a lower bound of the key of the
        sets that free it (its fewest victims, the cheapest pods' priorities and ages), a popped device's sets of
        that size go back into the heap under their own keys, and the first set popped that the vendor's fitter
        accepts is the best there is."""
        by_name = {r.name: r for r in records}
        victims = Victims(self.state.pods, budgets)
        heap: list[tuple[tuple[float, ...], int, str, object, int]] = []
        sequence = itertools.count()
        for record in records:
            devices = freeable_devices(record, self.state.pods, kind, pod.priority, need)
            if devices and (exclude or own in record.pods):
                devices = without_pods(devices, exclude | {own})
            if devices:
                heap.append((devices[0].first, next(sequence), record.name, devices, 0))
        heapq.heapify(heap)
        if need.count > 1:
            options: list[tuple[tuple[float, ...], str, frozenset[str]]] = []
            for _, _, name, listed, _ in heap:
                assert isinstance(listed, list)
                for device in listed:
                    for size in range(device.lower or 1, SIZE_LIMIT + 1):
                        sets = [c for c in freeing(device.grants, device.deficit, size) if victims.allowed(c)]
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
            assert isinstance(item, FreeableDevice)
            size = size or item.lower or 1
            sets = [c for c in freeing(item.grants, item.deficit, size) if victims.allowed(c)]
            for chosen in sets:
                heapq.heappush(heap, (victims.key(chosen), next(sequence), name, chosen, size))
            if not sets and size < min(SIZE_LIMIT, len(item.grants)):
                heapq.heappush(heap, (item.bound(size + 1), next(sequence), name, item, size + 1))
        return None

    def _first_fit(
        self,
        pod: Pod,
        requests: Mapping[str, Sequence[ContainerRequest | None]],
        kind: str,
        policy: SchedulingPolicy,
        by_name: Mapping[str, NodeRecord],
        victims: Victims,
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
        options: list[tuple[tuple[float, ...], str, frozenset[str]]], count: int, victims: Victims
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

    def _victims(self, record: NodeRecord, pod: Pod, budgets: Sequence[Budget], exclude: frozenset[str]) -> Victims:
        """The node's pods of lower priority than `pod`, but `exclude`."""
        records: dict[str, PodRecord] = {}
        for key in record.pods:
            victim = self.state.pods.get(key)
            if victim is not None and key not in exclude and victim.priority < pod.priority:
                records[key] = victim
        return Victims(records, budgets)

    def _reprieve(
        self,
        record: NodeRecord,
        pod: Pod,
        requests: Mapping[str, Sequence[ContainerRequest | None]],
        kinds: Sequence[str],
        policy: SchedulingPolicy,
        victims: Victims,
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
        victims: Victims,
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
            fits = self.plugins.fit_nodes(kind, pod, list(requests[kind]), [view], policy)
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
