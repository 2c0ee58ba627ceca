"""Fitting shared devices: the building block vendors call from `hami_fit_nodes` instead of writing their own.

Owns the accounting every share-based vendor has in common: a device serves a request when it is healthy,
not cordoned, allowed by the pod's use/no-use selectors, and has a free slot, enough free memory and
enough free cores; cores equal to the whole device need an idle device; a request without cores is not put
on a device whose cores are all taken. Init containers run one after another and before the app containers, so
(as in HAMi) each init container is fitted against the node's usage plus the native sidecars declared before it,
and the app containers together against the node's usage plus every sidecar: a device must hold the larger of
the two phases, not their sum (`pod_peaks`, by `hami.model.RunOrder`'s rule).
Among the usable devices the device policy chooses (`binpack`, `spread`, `mutex`, `numa`) in HAMi v2.10's order
(`hami_device_order`), or by what the node daemon measured (`usage`, this project's); app containers of one pod
see each other's grants, and every refused node gets a reason a
user can read. The node score is HAMi's. A pod annotated ``hami.io/numa-alignment`` (`hami.numaalign`) has each
container of several devices placed on devices of one NUMA node: required (``strict``) or preferred
(``best-effort``), whatever the device policy and whichever vendor's `choose_devices` (`ShareFitter._choose_aligned`).

Vendor specifics (topology tables, partition profiles, templates) stay in the vendor. `ShareFitter` has two
extension points: `extra_filter` refuses devices for the vendor's own reasons, and `ShareFitter.choose_devices`
(a method to override, with a stable signature) picks among the usable devices of one container; the vendor
can also post-process the fits. Nothing here modifies the node views it is given.
"""

from __future__ import annotations

import functools
import itertools
import struct
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hami.fragmentation import WorkloadProfile, free_share
from hami.measured import BUSY_ANNOTATION, UNKNOWN_BUSY, decode_busy
from hami.model import (
    NO_INIT,
    ContainerDevice,
    ContainerPlacement,
    ContainerRequest,
    Device,
    DeviceKind,
    DeviceUsage,
    NodeFit,
    NodeView,
    Pod,
    RunOrder,
    SchedulingPolicy,
)
from hami.numaalign import NUMA_ALIGNMENT_ANNOTATION, NumaAlignment, NumaAlignmentError, numa_alignment

__all__ = [
    "CORDON_ANNOTATION",
    "Candidate",
    "ChoiceContext",
    "DeviceState",
    "Grant",
    "Selectors",
    "ShareFitter",
    "effective_grants",
    "hami_device_order",
    "hami_device_score",
    "node_score",
    "pod_peaks",
]

CORDON_ANNOTATION = "hami.io/device-cordon"


@dataclass(slots=True)
class DeviceState:
    """One device while a pod's containers are placed on a node: its usage, plus what the pod's containers
    placed so far were granted on it. The fitter updates it; a device choice only reads it."""

    usage: DeviceUsage
    used: int
    usedmem: int
    usedcores: int

    @property
    def device(self) -> Device:
        return self.usage.device


@dataclass(frozen=True, slots=True)
class Candidate:
    """A device usable by one container, and what the container would be granted on it."""

    state: DeviceState
    memory: int
    """MiB the container would get on the device."""
    cores: int
    """Percent of the device's compute the container would get."""

    @property
    def device(self) -> Device:
        return self.state.usage.device


@dataclass(frozen=True, slots=True)
class ChoiceContext:
    """What a device choice may consult besides its candidates; fields may be added, never removed."""

    pod: Pod
    node: NodeView
    policy: SchedulingPolicy
    devices: Sequence[DeviceState]
    """Every device of the node, usable or not, with the grants of the pod's containers placed so far."""
    order: list[int] = field(default_factory=list)
    """Positions in `devices`, in the order HAMi's device list has after the last container's sort: HAMi sorts
    one list in place for all app containers of a pod (a stable sort, so ties keep the earlier order), and
    starts each init container from the node's registration order (here: index order). `choose_devices` and the
    fitter update it."""


def _split(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


class Selectors:
    """The pod's use/no-use annotations for one kind, and the node's cordon list."""

    def __init__(self, kind: DeviceKind, pod: Pod) -> None:
        keys = kind.annotations
        get = pod.annotations.get
        self.use_uuid = set(_split(get(keys.use_uuid or "")))
        self.nouse_uuid = set(_split(get(keys.nouse_uuid or "")))
        self.use_type = [t.lower() for t in _split(get(keys.use_type or ""))]
        self.nouse_type = [t.lower() for t in _split(get(keys.nouse_type or ""))]

    @property
    def active(self) -> bool:
        """Some list is set (otherwise every device passes, and the fitter need not ask)."""
        return bool(self.use_uuid or self.nouse_uuid or self.use_type or self.nouse_type)

    def refuses(self, usage: DeviceUsage) -> str | None:
        d = usage.device
        if self.use_uuid and d.id not in self.use_uuid:
            return "not in use-uuid list"
        if d.id in self.nouse_uuid:
            return "in no-use-uuid list"
        return self.refuses_model(d.type)

    def refuses_model(self, model: str) -> str | None:
        """Why a device of this model is not for the pod (its use/no-use type lists), or None."""
        model = model.lower()
        if self.use_type and not any(t in model for t in self.use_type):
            return "type not selected"
        if any(t in model for t in self.nouse_type):
            return "type excluded"
        return None


def _device_score(free: DeviceState, memory: int, cores: int, weights: Mapping[str, int]) -> float:
    d = free.usage.device
    slot = (free.used + 1) / d.count if d.count else 1.0
    core = (free.usedcores + cores) / d.devcore if d.devcore else 1.0
    mem = (free.usedmem + memory) / d.devmem if d.devmem else 1.0
    return weights.get("slot", 1) * slot + weights.get("core", 1) * core + weights.get("memory", 1) * mem


_FLOAT32 = struct.Struct("f")


def _f32(value: float) -> float:
    """`value` rounded to a float32, as Go's float32 arithmetic rounds each operation."""
    rounded: float = _FLOAT32.unpack(_FLOAT32.pack(value))[0]
    return rounded


@functools.lru_cache(maxsize=1 << 16)
def _score32(
    slots: int, count: int, cores: int, devcore: int, memory: int, devmem: int, ws: int, wc: int, wm: int
) -> float:
    """HAMi's float32 device score from its inputs (memoised: the nodes of a cluster repeat a few of them)."""
    slot = _f32(float(slots) / count)
    core = _f32(float(cores) / devcore)
    mem = _f32(float(memory) / devmem)
    total = _f32(_f32(ws) * slot)
    total = _f32(total + _f32(_f32(wc) * core))
    total = _f32(total + _f32(_f32(wm) * mem))
    return _f32(10.0 * total)


def hami_device_score(state: DeviceState, weights: Mapping[str, int], request: tuple[int, int] | None = None) -> float:
    """HAMi's device score (`DeviceListsScore.ComputeScore`, float32 like HAMi's): 10 × (slot share + core share
    + memory share) after the container's request, weighted. HAMi counts the request only when its type equals
    the device's registered type (`request` is then its (MiB, cores)); otherwise the score is the device's
    current use. A device without slots, cores or memory scores 0."""
    d = state.usage.device
    if not d.count or not d.devcore or not d.devmem:
        return 0.0
    slots, memory, cores = (1, *request) if request is not None else (0, 0, 0)
    return _score32(
        slots + state.used, d.count, cores + state.usedcores, d.devcore, memory + state.usedmem, d.devmem,
        weights.get("slot", 1), weights.get("core", 1), weights.get("memory", 1),
    )  # fmt: skip


_CHAIN_KEYS = ("binpack", "spread", "numa")


def hami_device_order(
    devices: Sequence[DeviceState], order: Sequence[int], scores: Sequence[float], policy: str, numa_bind: bool
) -> list[int]:
    """HAMi v2.10's sort of a node's device list (`policy.DeviceUsageList.Less`), stable from `order`.

    `policy` is the pod's GPU policy string (`hami.io/gpu-scheduler-policy`, default `spread`), `scores` the
    devices' `hami_device_score`s by position. HAMi's vendors then take devices walking the sorted list from its
    end, so the last entries are the favourites: spread puts the highest score first, binpack the lowest, ties
    ordered by ascending NUMA node (walked: the highest NUMA node first), then by the list's earlier order.
    A comma chain (or bare `numa`) sorts by its binpack/spread/numa keys in the order written, then by device
    index; `mutex` alone puts the busiest devices first. With NUMA binding the NUMA nodes stay contiguous.
    Go's sort.Sort is stable for lists of up to 12 devices (insertion sort), which this is for any length."""

    def numa(i: int) -> int:
        return devices[i].usage.device.numa

    chain_form = "," in policy or policy == "numa"
    if chain_form:
        names = [p.strip() for p in policy.split(",")]
        chain = [k for k in _CHAIN_KEYS if k in names]
        chain.sort(key=names.index)
        if not chain:
            chain = ["spread"]
        if numa_bind and chain[0] != "numa":
            chain = ["numa", *(k for k in chain if k != "numa")]

        def chained(i: int) -> tuple[float, ...]:
            parts: list[float] = []
            for k in chain:
                parts.append(scores[i] if k == "binpack" else -scores[i] if k == "spread" else numa(i))
            return (*parts, devices[i].usage.device.index)

        return sorted(order, key=chained)
    if policy == "mutex":
        return sorted(order, key=lambda i: (-devices[i].used, numa(i)))
    binpack = policy == "binpack"
    numas = [float(d.usage.device.numa) for d in devices]
    keys: list[tuple[float, float]]  # by position, computed once (the sort would call a key function per device)
    if numa_bind:
        keys = [(-n, s) if binpack else (n, -s) for s, n in zip(scores, numas, strict=True)]
    else:
        keys = [(s, n) if binpack else (-s, n) for s, n in zip(scores, numas, strict=True)]
    return sorted(order, key=keys.__getitem__)


def pod_peaks(placement: Sequence[ContainerPlacement], order: RunOrder) -> dict[str, tuple[int, ...]]:
    """Per device UUID, what the pod holds of it at its peak: (slots, MiB, cores), each counted by the pod's run
    order (`RunOrder.peak`: the larger of the init phase's peak, an init container with the sidecars started
    before it, and the steady state, sidecars plus app containers), a container on the device taking one slot.
    `placement` is positional, init containers first."""
    return order.peaks(
        (index, d.uuid, (1, d.usedmem, d.usedcores)) for index, devices in enumerate(placement) for d in devices
    )


def node_score(node: NodeView, placement: Sequence[ContainerPlacement], order: RunOrder = NO_INIT) -> float:
    """HAMi's node score after the placement: 10 × (slots used + cores used + memory used, each as a share).
    The placement counts at the pod's peak (`pod_peaks`) by the pod's run order (`Pod.run_order`; by default
    every entry is an app container's)."""
    slots = cores = memory = used = usedcores = usedmem = 0
    for u in node.devices:  # one pass: this runs for every node fitted
        d = u.device
        slots += d.count
        cores += d.devcore
        memory += d.devmem
        used += u.used
        usedcores += u.usedcores
        usedmem += u.usedmem
    for taken, mem, core in pod_peaks(placement, order).values():
        used += taken
        usedcores += core
        usedmem += mem
    return 10 * (
        (used / slots if slots else 0) + (usedcores / cores if cores else 0) + (usedmem / memory if memory else 0)
    )


class ShareFitter:
    """Fits one pod's requests of one kind onto candidate nodes under a scheduling policy.

    `extra_filter` lets a vendor refuse devices for its own reasons (returning the reason, or None);
    a subclass may override `choose_devices` to pick among the usable devices differently.
    """

    def __init__(
        self,
        kind: DeviceKind,
        *,
        extra_filter: Callable[[DeviceUsage, ContainerRequest], str | None] | None = None,
        numa_bind: bool = False,
    ) -> None:
        self.kind = kind
        self.extra_filter = extra_filter
        self.numa_bind = numa_bind
        """All devices of a container on one NUMA node (HAMi's NUMA binding): ordered as HAMi orders them then."""

    def fit_nodes(
        self, pod: Pod, requests: Sequence[ContainerRequest | None], nodes: Sequence[NodeView], policy: SchedulingPolicy
    ) -> list[NodeFit]:
        selectors = Selectors(self.kind, pod)
        return [self.fit_node(pod, requests, node, policy, selectors) for node in nodes]

    def fit_node(
        self,
        pod: Pod,
        requests: Sequence[ContainerRequest | None],
        node: NodeView,
        policy: SchedulingPolicy,
        selectors: Selectors,
    ) -> NodeFit:
        cordoned = set(_split(node.annotations.get(CORDON_ANNOTATION)))

        def fresh() -> list[DeviceState]:
            return [DeviceState(u, u.used, u.usedmem, u.usedcores) for u in node.devices]

        def registered() -> list[int]:
            # HAMi's list is in registration order, which is index order on every node daemon (HAMi's and this
            # project's); sorting by index keeps a choice independent of how a view happens to list the devices
            return _registration_order(node.devices)

        order = pod.run_order
        # what runs for the pod's whole life (sidecars, then app containers) adds up in one context
        steady = ChoiceContext(pod, node, policy, fresh(), registered())
        names = [c.name for c in pod.all_containers]
        placement: list[ContainerPlacement] = []
        for index, request in enumerate(requests):
            if request is None:
                placement.append(())
                continue
            context = steady
            if not order.steady(index):  # an init container sees the sidecars started before it, not its siblings
                devices = [DeviceState(s.usage, s.used, s.usedmem, s.usedcores) for s in steady.devices]
                context = ChoiceContext(pod, node, policy, devices, list(steady.order))
            chosen, reason = self._fit_container(request, list(context.devices), cordoned, selectors, context)
            if chosen is None:
                who = f"container {names[index]}" if index < len(names) and len(requests) > 1 else "pod"
                return NodeFit(node=node.name, reason=f"{who}: {reason}")
            placement.append(chosen)
        return NodeFit(node=node.name, placement=tuple(placement), score=node_score(node, placement, order))

    def _fit_container(
        self,
        request: ContainerRequest,
        frees: list[DeviceState],
        cordoned: set[str],
        selectors: Selectors,
        context: ChoiceContext,
    ) -> tuple[ContainerPlacement | None, str]:
        usable: list[Candidate] = []
        refused: list[str] = []
        whole = request.cores >= 100
        exclusive = whole or "mutex" in context.policy.device
        selected = selectors.refuses if selectors.active else None
        extra = self.extra_filter
        units = self.kind.core_units
        for free in frees:  # this loop runs for every device of every node fitted: the checks are inline
            d = free.usage.device
            memory = request.memory_on(d)
            cores = d.devcore if whole else (self.kind.cores_on(request.cores, d) if units else request.cores)
            if not d.health:
                reason: str | None = "unhealthy"
            elif d.id in cordoned:
                reason = "cordoned"
            elif selected is not None and (reason := selected(free.usage)):
                pass
            elif free.used >= d.count:
                reason = "no free slot"
            elif exclusive and free.used > 0:
                reason = "not idle (exclusive use asked)"
            elif memory > d.devmem - free.usedmem:
                reason = "insufficient memory"
            elif cores > d.devcore - free.usedcores or (cores == 0 and free.usedcores >= d.devcore):
                reason = "insufficient cores"
            elif extra is not None:
                reason = extra(free.usage, request)
            else:
                reason = None
            if reason:
                refused.append(reason)
            else:
                usable.append(Candidate(free, memory, cores))
        if len(usable) < request.count:
            refusals = Counter(refused)
            detail = ", ".join(f"{n} {why}" for why, n in sorted(refusals.items(), key=lambda kv: (-kv[1], kv[0])))
            need = self._needs(request)
            return None, f"{need}, {len(usable)}/{len(frees)} usable" + (f" ({detail})" if detail else "")
        self._sort_devices(request, context)
        if NUMA_ALIGNMENT_ANNOTATION in context.pod.annotations:
            chosen, unaligned = self._choose_aligned(usable, request.count, context)
            if unaligned:
                return None, f"{self._needs(request)}, {len(usable)}/{len(frees)} usable, but {unaligned}"
        else:
            chosen = self.choose_devices(usable, request.count, context)
        if not chosen:  # the vendor's rules allow no set of the usable devices (a topology's)
            usable_of = f"{len(usable)}/{len(frees)} usable"
            return None, f"{self._needs(request)}, {usable_of}, but the devices' topology allows no set of them"
        if len(chosen) != request.count or len({id(c.state) for c in chosen}) != request.count:
            raise ValueError(
                f"{type(self).__name__}.choose_devices returned {len(chosen)} device(s) for a request of "
                f"{request.count}; it must return that many distinct candidates"
            )
        for c in chosen:
            c.state.used += 1
            c.state.usedmem += c.memory
            c.state.usedcores += c.cores
        return tuple(
            ContainerDevice(uuid=c.device.id, type=self.kind.common_word, usedmem=c.memory, usedcores=c.cores)
            for c in chosen
        ), ""

    def _needs(self, request: ContainerRequest) -> str:
        return f"needs {request.count} {self.kind.common_word} device{'s' if request.count > 1 else ''}"

    def choose_devices(
        self, candidates: Sequence[Candidate], count: int, context: ChoiceContext
    ) -> Sequence[Candidate]:
        """Choose `count` of the usable `candidates` for one container, in the order they are granted.

        The extension point for a vendor's own device choice: override it in a subclass (calling this one for
        the policy's order when useful) and the feasibility checks, accounting, selectors and refusal reasons
        stay the fitter's. Called once per container with at least `count` candidates (for a pod asking
        ``hami.io/numa-alignment``, again with each NUMA node's candidates when the first choice spans NUMA nodes:
        it must not keep state between calls); must return exactly `count` distinct ones, or none when the
        vendor's rules allow no set of them (the node then does not fit, saying so), and must not modify them.
        This implementation applies the device policy in ``context.policy``: ``binpack``/``best-fit`` (the
        fullest devices first) or ``spread`` (the emptiest), ``numa`` (all devices on one NUMA node when one has
        enough), ``fragmentation-aware`` (the devices whose use grows the node's expected fragmentation least),
        ``usage`` (the devices the node daemon measured least busy, `hami.measured`, an unknown one as half busy;
        the emptiest by grant among equals). Except for the last two, the order is HAMi's (`hami_device_order`,
        walked from its end): on equal scores the highest NUMA node, then the device latest in HAMi's list (at
        first the registration order: the highest index).
        """
        policy = context.policy
        if "usage" in policy.device:
            return _least_busy(candidates, count, decode_busy(context.node.annotations.get(BUSY_ANNOTATION)))
        if "fragmentation-aware" in policy.device and policy.workload is not None:
            node, pod = context.node, context.pod
            cpu = None if node.cpu_free is None else node.cpu_free - pod.cpu_request
            memory = None if node.memory_free is None else node.memory_free - pod.memory_request
            return _least_fragmenting(candidates, count, policy.workload, context.devices, cpu, memory)
        if not context.order:  # called outside `fit_node`: the candidates' own scores, from registration order
            by_state = {id(c.state): c for c in candidates}
            scores = [
                hami_device_score(f, policy.weights, self._counted(f, by_state.get(id(f)))) for f in context.devices
            ]
            devices = context.devices
            by_index = _registration_order([d.usage for d in devices])
            context.order[:] = hami_device_order(devices, by_index, scores, _hami_policy(policy), self.numa_bind)
        position = {id(c.state): c for c in candidates}
        devices = context.devices
        # HAMi's vendors walk the sorted list from its end: the walk order is the preference order (read as far
        # as needed: one device, most often)
        ranked = (position[key] for i in reversed(context.order) if (key := id(devices[i])) in position)
        if ("numa" in policy.device or self.numa_bind) and count > 1:
            walk = list(ranked)
            groups: dict[int, list[Candidate]] = {}
            for item in walk:
                groups.setdefault(item.device.numa, []).append(item)
            whole = [g for g in groups.values() if len(g) >= count]
            if whole:
                return whole[0][:count]  # the first NUMA node whose run completes in HAMi's walk
            return walk[:count]
        return list(itertools.islice(ranked, count))

    def _choose_aligned(
        self, usable: Sequence[Candidate], count: int, context: ChoiceContext
    ) -> tuple[Sequence[Candidate], str]:
        """`choose_devices` under the pod's ``hami.io/numa-alignment`` (`hami.numaalign`): the chosen devices,
        or why the node cannot serve the container.

        A container of one device is aligned whatever it gets. For several, the policy's own choice stands when
        its devices share one known NUMA node; otherwise the choice is made again among the usable devices of
        each NUMA node that has enough of them, in the order the policy's walk of the node's list completes
        them (HAMi's order, as the ``numa`` policy takes them), and the first that gives a set wins. When none
        does, ``best-effort`` keeps the policy's own choice and ``strict`` refuses the node, saying how many
        usable devices each NUMA node has. A device whose NUMA node is unknown (-1) is on no NUMA node here."""
        try:
            mode = numa_alignment(context.pod.annotations)
        except NumaAlignmentError as exc:
            return (), str(exc)
        chosen = self.choose_devices(usable, count, context)
        if count < 2 or mode is None or _one_numa_node(chosen):
            return chosen, ""
        groups: dict[int, list[Candidate]] = {}
        for candidate in usable:
            if candidate.device.numa >= 0:
                groups.setdefault(candidate.device.numa, []).append(candidate)
        devices = context.devices
        walked = {id(devices[i]): at for at, i in enumerate(reversed(context.order))}
        last = len(walked)

        def completed(group: list[Candidate]) -> tuple[int, int]:
            return sorted(walked.get(id(c.state), last) for c in group)[count - 1], group[0].device.numa

        for group in sorted((g for g in groups.values() if len(g) >= count), key=completed):
            within = self.choose_devices(group, count, context)
            if within:
                return within, ""
        if mode is NumaAlignment.BEST_EFFORT:
            return chosen, ""
        per = ", ".join(f"{n} on NUMA node {numa}" for numa, n in sorted((k, len(g)) for k, g in groups.items()))
        unknown = sum(1 for c in usable if c.device.numa < 0)
        if unknown:
            per = f"{per}, {unknown} on no known NUMA node" if per else f"{unknown} on no known NUMA node"
        return (), (
            f"{NUMA_ALIGNMENT_ANNOTATION}: strict asks for all {count} on one NUMA node, and no NUMA node can "
            f"serve them (usable: {per})"
        )

    def _counted(self, state: DeviceState, candidate: Candidate | None) -> tuple[int, int] | None:
        """What HAMi's device score counts of a container's request on `state`: only on a device whose
        registered type is the request's type (the kind's common word), else nothing."""
        if candidate is None or state.usage.device.type != self.kind.common_word:
            return None
        return (candidate.memory, candidate.cores)

    def _sort_devices(self, request: ContainerRequest, context: ChoiceContext) -> None:
        """Sort `context.order` as HAMi sorts the node's device list before fitting one container."""
        weights = context.policy.weights
        ws, wc, wm = weights.get("slot", 1), weights.get("core", 1), weights.get("memory", 1)
        word, cores = self.kind.common_word, request.cores
        scores = []
        for state in context.devices:  # `hami_device_score`, inline: this runs for every device fitted
            d = state.usage.device
            if not d.count or not d.devcore or not d.devmem:
                scores.append(0.0)
            elif d.type == word:
                memory = request.memory_on(d) + state.usedmem
                scores.append(_score32(state.used + 1, d.count, state.usedcores + cores, d.devcore, memory, d.devmem,
                                       ws, wc, wm))  # fmt: skip
            else:
                scores.append(_score32(state.used, d.count, state.usedcores, d.devcore, state.usedmem, d.devmem,
                                       ws, wc, wm))  # fmt: skip
        devices = context.devices
        order = context.order or _registration_order([d.usage for d in devices])
        context.order[:] = hami_device_order(
            context.devices, order, scores, _hami_policy(context.policy), self.numa_bind
        )


def _one_numa_node(chosen: Sequence[Candidate]) -> bool:
    """Whether the devices share one known NUMA node."""
    nodes = {c.device.numa for c in chosen}
    return len(nodes) == 1 and min(nodes) >= 0


def _registration_order(devices: Sequence[DeviceUsage]) -> list[int]:
    """Positions of `devices` in registration order (by index, then UUID); the common case, a list already in
    that order, without sorting."""
    keys = [(u.device.index, u.device.id) for u in devices]
    if all(keys[i] < keys[i + 1] for i in range(len(keys) - 1)):
        return list(range(len(keys)))
    return sorted(range(len(keys)), key=keys.__getitem__)


def _hami_policy(policy: SchedulingPolicy) -> str:
    """The pod's device policy as HAMi's policy string (`best-fit` is this project's name for binpack)."""
    return _hami_policy_string(tuple(policy.device))


@functools.lru_cache(maxsize=256)
def _hami_policy_string(device: tuple[str, ...]) -> str:
    return ",".join("binpack" if p == "best-fit" else p for p in device)


def _share_of(free: DeviceState) -> int:
    d = free.usage.device
    return free_share(d.devmem, free.usedmem, d.devcore, free.usedcores)


def _least_fragmenting(
    usable: Sequence[Candidate],
    count: int,
    workload: WorkloadProfile,
    frees: Sequence[DeviceState],
    cpu_after: int | None,
    memory_after: int | None,
) -> list[Candidate]:
    """The devices whose use grows the node's expected fragmentation least (FGD's device choice)."""
    shares = [_share_of(f) for f in frees]
    model = frees[0].usage.device.type if frees else ""
    before = workload.fragmentation(shares, cpu_after, memory_after, model)
    position = {id(f): i for i, f in enumerate(frees)}

    def growth(item: Candidate) -> tuple[float, int, int, str]:
        free = item.state
        d = free.usage.device
        at = position[id(free)]
        after = list(shares)
        after[at] = free_share(d.devmem, free.usedmem + item.memory, d.devcore, free.usedcores + item.cores)
        # equal growth: the device with the least free share left (best fit), then the lowest index
        return (workload.fragmentation(after, cpu_after, memory_after, model) - before, shares[at], d.index, d.id)

    if count == 1:
        return [min(usable, key=growth)]
    return sorted(usable, key=lambda item: (_share_of(item.state), item.device.index, item.device.id))[:count]


@dataclass(frozen=True, slots=True)
class Grant:
    """What one pod takes of one device: containers sharing it, MiB, cores."""

    slots: int
    memory: int
    cores: int


def effective_grants(
    allocation: Mapping[str, tuple[ContainerPlacement, ...]], order: RunOrder
) -> dict[str, dict[str, Grant]]:
    """Per kind and device: what the pod holds at its peak (`pod_peaks`), for slots, memory and cores."""
    return {
        kind: {uuid: Grant(*peak) for uuid, peak in pod_peaks(placements, order).items()}
        for kind, placements in allocation.items()
    }


def _least_busy(candidates: Sequence[Candidate], count: int, busy: Mapping[str, float]) -> list[Candidate]:
    """The `usage` device policy: the `count` candidates measured least busy (`hami.measured`), a device whose
    busy share is unknown counted as `UNKNOWN_BUSY`; among equals the emptiest by grant (spread), then the lowest
    index."""

    def key(c: Candidate) -> tuple[float, float, int]:
        d = c.device
        granted = (c.state.usedcores / d.devcore if d.devcore else 0.0) + (
            c.state.usedmem / d.devmem if d.devmem else 0.0
        )
        return (busy.get(d.id, UNKNOWN_BUSY), granted, d.index)

    return sorted(candidates, key=key)[:count]
