"""Namespace quotas on shared device memory and cores: what a namespace may use, what it uses, what a pod asks.

Owns HAMi's quota rule (protocol.md section 5), done right for multi-device pods: a ResourceQuota's
`spec.hard` keys `limits.<memory resource>` and `limits.<cores resource>` of a device kind cap the sum over the
namespace's live pods of *per-device value × device count*, each pod counted at its peak by its run order
(`hami.model.RunOrder`: the larger of its init phase's peak, an init container with the native sidecars started
before it, and its sidecars plus its app containers; once placed, per device, exactly as the scheduler counts
usage). Memory is compared in MiB: a quota value is in the resource's own unit
(256 MiB for Cambricon, GiB for MetaX) and is multiplied out. Every ResourceQuota object of a namespace is
enforced on its own, like Kubernetes does.

What counts as used: a live (not Succeeded or Failed) pod counts by its `…-devices-allocated` annotations once
the scheduler has placed it (exact figures, percentages resolved), or by its requests once it is bound to a
node without such an annotation. Pending pods that are not placed do not count: the admission check stops
what is plainly over the quota, and `QuotaLedger.reserve`, called by the scheduler's filter under one lock,
is the check that two pods admitted at the same moment cannot both pass.

A request for memory as a percentage of a device cannot be counted before it is placed (the device's size is
unknown); admission counts it as 0 MiB and the filter's `reserve` counts the placed MiB.

`QuotaLedger` keeps ResourceQuota objects and every pod's usage current from watches (one list at start, then
events), so neither admission nor filter makes an API call. It never writes to the cluster.

Below both services (the webhook admits with it, the scheduler reserves with it; neither imports the other).

Integration with the scheduler's filter (`hami.scheduler.extender.Extender._filter`), once a node is chosen:

    node, allocation = best
    verdict = self.quota.reserve(pod, allocation)
    if not verdict.fits:
        return FilterResult(failed={name: verdict.reason for name in node_names})
    ...                        # state.assume, then _record_decision; if recording fails:
    self.quota.release(pod.namespace, pod.name)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING
from typing import Any

from hami.cluster.port import Cluster, KubeObject, Subscription, WatchEvent, meta
from hami.codec import AnnotationError, decode_pod_devices
from hami.errors import HamiError
from hami.fitting import effective_grants
from hami.lifecycle import TERMINAL_PHASES
from hami.model import ContainerPlacement, ContainerRequest, DeviceKind, Pod, RunOrder
from hami.plugins import VendorPlugins
from hami.quantity import parse_quantity as quantity_value

__all__ = [
    "QUOTA_PREFIX",
    "PodDemand",
    "QuotaLedger",
    "QuotaVerdict",
    "demand_of_allocation",
    "demand_of_requests",
    "parse_quantity",
    "quota_keys",
]

log = logging.getLogger(__name__)

QUOTA_PREFIX = "limits."


def parse_quantity(text: str) -> int:
    """A Kubernetes quantity as a whole number, rounded up (`resource.Quantity.Value()`): `10k` → 10000, `1Gi`
    → 1073741824, `500m` → 1. Raises ValueError for what is not a non-negative quantity."""
    try:
        value = quantity_value(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a Kubernetes quantity such as 10000, 10k or 8Gi") from None
    if value < 0:
        raise ValueError(f"{text!r} is negative; a quota is a non-negative quantity such as 10000, 10k or 8Gi")
    return int(value.to_integral_value(rounding=ROUND_CEILING))


# --------------------------------------------------------------------------------------------------------
# What a pod takes
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuotaKey:
    """One quota a device kind can be held to: `limits.<resource>`, in MiB (memory) or percent (cores)."""

    key: str
    kind: str
    memory: bool
    unit_mib: int = 1

    def describe(self, amount: int) -> str:
        return f"{amount} MiB" if self.memory else f"{amount}%"


def quota_keys(kind: DeviceKind) -> list[QuotaKey]:
    """The ResourceQuota keys that cap device kind `kind`: its memory and its cores resources."""
    names = kind.resources
    keys = []
    if names.memory:
        keys.append(QuotaKey(QUOTA_PREFIX + names.memory, kind.common_word, True, names.memory_unit_mib))
    if names.cores:
        keys.append(QuotaKey(QUOTA_PREFIX + names.cores, kind.common_word, False))
    return keys


@dataclass(frozen=True)
class PodDemand:
    """What one pod takes of each quota key (MiB or percent), and how that was counted, for messages."""

    amounts: Mapping[str, int] = field(default_factory=dict)
    detail: Mapping[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return any(self.amounts.values())


def demand_of_requests(
    plugins: VendorPlugins,
    requests: Mapping[str, Sequence[ContainerRequest | None]],
    container_names: Sequence[str],
    order: RunOrder,
) -> PodDemand:
    """What a pod asks, from its requests (one per container, init first): per device value × device count, per
    container, counted at the pod's peak by its run order (`RunOrder.peak`: the larger of the init phase's peak
    and the sidecars plus the app containers)."""
    amounts: dict[str, int] = {}
    detail: dict[str, str] = {}
    for kind_word, per_container in requests.items():
        for qk in _keys_of(plugins, kind_word):
            asked: list[tuple[int, tuple[int]]] = []
            where: dict[int, str] = {}
            for index, request in enumerate(per_container):
                if request is None:
                    continue
                per_device = request.memory if qk.memory else request.cores
                name = container_names[index] if index < len(container_names) else f"#{index}"
                asks = qk.describe(per_device)
                if qk.memory and request.memory_percentage is not None:
                    per_device = 0  # unknown until placed; the filter counts the placed MiB
                    asks = f"{request.memory_percentage}% of a device, counted once placed"
                where[index] = f"{name}: {request.count} × {asks}"
                if order.role(index) == "sidecar":
                    where[index] += " (sidecar)"
                asked.append((index, (per_device * request.count,)))
            if not asked:
                continue
            (total,) = order.peak(asked)
            steady = [(i, a) for i, a in asked if order.steady(i)]
            if steady and order.peak(steady) == (total,):
                amounts[qk.key], detail[qk.key] = total, "; ".join(where[i] for i, _ in steady)
                continue
            for index, _ in asked:  # the init phase holds more: name the init container at its peak
                moment = [(i, a) for i, a in asked if i == index or (i < index and order.role(i) == "sidecar")]
                if order.role(index) == "init" and order.peak(moment) == (total,):
                    running = "; ".join(where[i] for i, _ in moment)
                    amounts[qk.key], detail[qk.key] = total, running + " (init container, its peak)"
                    break
    return PodDemand(amounts, detail)


def demand_of_allocation(
    plugins: VendorPlugins,
    allocation: Mapping[str, Sequence[ContainerPlacement]],
    order: RunOrder,
    *,
    detail: bool = True,
) -> PodDemand:
    """What a placed pod takes: per device, what it holds at its peak by its run order (the scheduler's own
    accounting, `effective_grants`), summed over its devices. Without `detail`, no text of how (what the ledger
    keeps of every live pod, whose text no message reads: 40,000 pods' worth at start-up)."""
    amounts: dict[str, int] = {}
    how: dict[str, str] = {}
    grants = effective_grants({k: tuple(v) for k, v in allocation.items()}, order)
    for kind_word, by_device in grants.items():
        for qk in _keys_of(plugins, kind_word):
            per_device = [g.memory if qk.memory else g.cores for g in by_device.values()]
            amounts[qk.key] = sum(per_device)
            if detail:
                how[qk.key] = f"{len(per_device)} device(s) placed: " + " + ".join(qk.describe(v) for v in per_device)
    return PodDemand(amounts, how)


def _keys_of(plugins: VendorPlugins, kind_word: str) -> list[QuotaKey]:
    try:
        return quota_keys(plugins.kind(kind_word))
    except KeyError:
        return []


# --------------------------------------------------------------------------------------------------------
# The verdict
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuotaVerdict:
    """Whether a pod fits its namespace's quotas; when not, `reason` names the quota and gives the figures."""

    fits: bool
    reason: str = ""
    quota: str = ""
    key: str = ""
    limit: int = 0
    used: int = 0
    asked: int = 0


FITS = QuotaVerdict(True)


@dataclass(frozen=True)
class _Limit:
    quota: str
    key: QuotaKey
    raw: str
    value: int
    """In MiB for memory (the quota's units multiplied out), percent for cores."""


@dataclass
class _Usage:
    demand: PodDemand
    assumed: bool = False


def _limit_text(lim: _Limit) -> str:
    """The quota's value as written, with what it means when that is not obvious: `40 (× 256 MiB = 10240 MiB)`."""
    qk = lim.key
    if qk.memory and qk.unit_mib != 1:
        return f"{lim.raw} (× {qk.unit_mib} MiB = {lim.value} MiB)"
    if lim.raw.strip() == str(lim.value):
        return qk.describe(lim.value)
    return f"{lim.raw} (= {qk.describe(lim.value)})"


class QuotaLedger:
    """ResourceQuota limits and live pods' usage per namespace, kept by watches; answers "fits, or why not".

    Thread-safe: one lock guards the tables; `reserve` checks and records under it, so concurrent filters
    cannot both take the last of a quota.
    """

    def __init__(self, cluster: Cluster, plugins: VendorPlugins) -> None:
        self.cluster = cluster
        self.plugins = plugins
        self._lock = threading.RLock()
        self._allocated = [(kind, kind.annotations.allocated) for kind in plugins.kinds]
        """Each kind with the name of its allocated annotation (read for every pod)."""
        self._keys: dict[str, QuotaKey] = {qk.key: qk for kind in plugins.kinds for qk in quota_keys(kind)}
        self._limits: dict[str, dict[str, list[_Limit]]] = {}
        """namespace → quota object name → the device limits it sets."""
        self._usage: dict[str, dict[str, _Usage]] = {}
        """namespace → pod name → what it takes."""
        self._subs: list[Subscription] = []
        self._quota_rv = ""
        """The version of the ResourceQuotas listed by `begin`, which `finish` watches from."""
        self._ready = threading.Event()

    # ---------------------------------------------------------------------------------- lifecycle

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def start(self, *, pods: Iterable[KubeObject] | None = None) -> QuotaLedger:
        """List ResourceQuotas and pods, then watch both. Raises `ClusterError` when the lists fail.

        `pods`: the owner lists and watches pods itself (the scheduler does) and feeds the ledger these, then
        every pod event through `pod_event`: one list and one watch of every pod in the process, not two. An owner
        that reads its pods a page at a time calls `begin`, `set_pod` for each and `finish` instead."""
        self.begin()
        pod_rv = None
        if pods is None:
            pods, pod_rv = self.cluster.list("pods")
        with self._lock:
            for pod in pods:
                self.set_pod(pod)
        return self.finish(pod_rv)

    def begin(self) -> None:
        """List the ResourceQuotas and forget every pod's usage: the pods come next (`set_pod`), then `finish`."""
        quotas, self._quota_rv = self.cluster.list("resourcequotas")
        with self._lock:
            self._limits.clear()
            self._usage.clear()
            for quota in quotas:
                self.set_quota(quota)

    def finish(self, pod_rv: str | None = None) -> QuotaLedger:
        """Every pod was fed since `begin`: watch the quotas (and the pods from `pod_rv`, when the ledger watches
        them itself), and count."""
        self._subs = [self.cluster.watch("resourcequotas", self._quota_rv, self._on_quota)]
        if pod_rv is not None:
            self._subs.append(self.cluster.watch("pods", pod_rv, self.pod_event))
        self._ready.set()
        log.info("quota ledger synced: %d namespaces with device quotas", len(self._limits))
        return self

    def stop(self) -> None:
        self._ready.clear()
        for sub in self._subs:
            sub.stop()
        self._subs = []

    def _on_quota(self, event: WatchEvent) -> None:
        if event.type == "DELETED":
            m = meta(event.object)
            self.remove_quota(str(m.get("namespace") or "default"), str(m.get("name")))
        else:
            self.set_quota(event.object)

    def pod_event(self, event: WatchEvent) -> None:
        """One pod watch event (the ledger's own watch, or its owner's)."""
        if event.type == "DELETED":
            m = meta(event.object)
            self.release(str(m.get("namespace") or "default"), str(m.get("name")))
        else:
            self.set_pod(event.object)

    # ---------------------------------------------------------------------------------- quotas

    def set_quota(self, quota: KubeObject) -> None:
        """Learn (or update) one ResourceQuota object; keys of no loaded device kind are ignored."""
        m = meta(quota)
        namespace, name = str(m.get("namespace") or "default"), str(m.get("name"))
        hard = (quota.get("spec") or {}).get("hard") if isinstance(quota.get("spec"), dict) else None
        limits: list[_Limit] = []
        for key, raw in (hard or {}).items() if isinstance(hard, dict) else ():
            qk = self._keys.get(str(key))
            if qk is None:
                continue
            try:
                value = parse_quantity(str(raw))
            except ValueError as exc:
                log.warning("ResourceQuota %s/%s: ignoring %s: %s", namespace, name, key, exc)
                continue
            limits.append(_Limit(name, qk, str(raw), value * qk.unit_mib if qk.memory else value))
        with self._lock:
            objects = self._limits.setdefault(namespace, {})
            if limits:
                objects[name] = limits
            else:
                objects.pop(name, None)
            if not objects:
                self._limits.pop(namespace, None)

    def remove_quota(self, namespace: str, name: str) -> None:
        with self._lock:
            objects = self._limits.get(namespace, {})
            objects.pop(name, None)
            if not objects:
                self._limits.pop(namespace, None)

    # ---------------------------------------------------------------------------------- pods

    def demand_of_pod(self, pod: KubeObject, *, detail: bool = True) -> PodDemand | None:
        """What a live pod uses (None when it does not count: finished, or neither placed nor bound); `detail`: with
        the text of how its placement was counted (`demand_of_allocation`)."""
        m = meta(pod)
        spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
        status = pod.get("status") if isinstance(pod.get("status"), dict) else {}
        if str((status or {}).get("phase") or "") in TERMINAL_PHASES:
            return None
        annotations = m.get("annotations") if isinstance(m.get("annotations"), dict) else {}
        order = RunOrder.of_spec(spec or {})
        allocation: dict[str, tuple[ContainerPlacement, ...]] = {}
        for kind, key in self._allocated:
            value = (annotations or {}).get(key)
            if not value:
                continue
            try:
                allocation[kind.common_word] = decode_pod_devices(str(value), key)
            except AnnotationError as exc:
                log.warning("pod %s/%s: not counting its %s usage: %s", m.get("namespace"), m.get("name"), kind, exc)
        amounts: dict[str, int] = {}
        how: dict[str, str] = {}
        if allocation:
            placed = demand_of_allocation(self.plugins, allocation, order, detail=detail)
            amounts.update(placed.amounts)
            how.update(placed.detail)
        if (spec or {}).get("nodeName") and self._asks_beyond(spec or {}, allocation):
            try:
                view = Pod.from_api(pod)
                requests = {k: v for k, v in self.plugins.pod_requests(view).items() if k not in allocation}
            except (HamiError, ValueError, TypeError, AttributeError) as exc:
                log.warning("pod %s/%s: not counting its requests: %s", m.get("namespace"), m.get("name"), exc)
                requests = {}
            if requests:
                names = [c.name for c in view.all_containers]
                bound = demand_of_requests(self.plugins, requests, names, view.run_order)
                amounts.update(bound.amounts)
                how.update(bound.detail)
        demand = PodDemand(amounts, how)
        return demand if demand else None

    def _asks_beyond(self, spec: Mapping[str, Any], allocation: Mapping[str, object]) -> bool:
        """Whether a container names a resource of a device kind the allocation does not count: only then can
        the pod's requests add to its demand. Every placed pod's event would otherwise build the pod's model
        and call the vendors' request hooks only to drop what they answer (`VendorPlugins.pod_requests` finds
        kinds through these same resource names)."""
        for key in ("initContainers", "containers"):
            for container in spec.get(key) or ():
                resources = container.get("resources") if isinstance(container, Mapping) else None
                if not isinstance(resources, Mapping):
                    continue
                for part in ("limits", "requests"):
                    for resource in resources.get(part) or ():
                        kind = self.plugins.kind_of_resource(str(resource))
                        if kind is not None and kind.common_word not in allocation:
                            return True
        return False

    def set_pod(self, pod: KubeObject) -> None:
        """Learn (or update) what one pod uses. A filter's reservation stays until the pod's placement arrives."""
        m = meta(pod)
        namespace, name = str(m.get("namespace") or "default"), str(m.get("name"))
        demand = self.demand_of_pod(pod, detail=False)  # kept for its amounts: no message reads its text
        phase = str((pod.get("status") or {}).get("phase") or "") if isinstance(pod.get("status"), dict) else ""
        with self._lock:
            pods = self._usage.setdefault(namespace, {})
            current = pods.get(name)
            if demand is not None:
                pods[name] = _Usage(demand)
            elif current is not None and current.assumed and phase not in TERMINAL_PHASES:
                pass  # the watch has not yet brought the filter's annotations: keep the reservation
            else:
                pods.pop(name, None)
            if not pods:
                self._usage.pop(namespace, None)

    def release(self, namespace: str, name: str) -> None:
        """Forget what a pod uses (it was deleted, or the filter could not record its placement)."""
        with self._lock:
            pods = self._usage.get(namespace, {})
            pods.pop(name, None)
            if not pods:
                self._usage.pop(namespace, None)

    # ---------------------------------------------------------------------------------- reading

    def used(self, namespace: str, *, excluding: str | None = None) -> dict[str, int]:
        """Quota key → what the namespace's live pods use (MiB or percent), without pod `excluding`."""
        with self._lock:
            total: dict[str, int] = {}
            for name, usage in self._usage.get(namespace, {}).items():
                if name == excluding:
                    continue
                for key, amount in usage.demand.amounts.items():
                    total[key] = total.get(key, 0) + amount
            return total

    def limits(self, namespace: str) -> dict[str, dict[str, int]]:
        """Quota object name → quota key → limit (MiB or percent), for status views and tests."""
        with self._lock:
            return {
                name: {lim.key.key: lim.value for lim in limits}
                for name, limits in self._limits.get(namespace, {}).items()
            }

    def totals(self) -> list[tuple[str, str, int, int]]:
        """(namespace, resource, used, limit) for every device resource a ResourceQuota limits, sorted: the
        resource without its `limits.` prefix (`nvidia.com/gpumem`), used and limit in MiB or percent, the limit
        the smallest that any of the namespace's quota objects sets (the one that binds)."""
        with self._lock:
            out = []
            for namespace, objects in self._limits.items():
                binding: dict[str, int] = {}
                for limits in objects.values():
                    for lim in limits:
                        binding[lim.key.key] = min(lim.value, binding.get(lim.key.key, lim.value))
                used = self.used(namespace)
                out += [
                    (namespace, key.removeprefix(QUOTA_PREFIX), used.get(key, 0), limit)
                    for key, limit in binding.items()
                ]
            return sorted(out)

    def _verdict(self, namespace: str, name: str, demand: PodDemand) -> QuotaVerdict:
        """Caller holds the lock."""
        objects = self._limits.get(namespace)
        if not objects or not demand:
            return FITS
        used = self.used(namespace, excluding=name or None)
        for quota_name in sorted(objects):
            for lim in objects[quota_name]:
                asked = demand.amounts.get(lim.key.key, 0)
                if not asked:
                    continue
                in_use = used.get(lim.key.key, 0)
                if in_use + asked <= lim.value:
                    continue
                qk = lim.key
                limit_text = _limit_text(lim)
                free = max(lim.value - in_use, 0)
                reason = (
                    f"exceeds ResourceQuota {namespace}/{quota_name}: {qk.key} is {limit_text}; the namespace's "
                    f"pods already use {qk.describe(in_use)} and this pod asks {qk.describe(asked)} "
                    f"({demand.detail.get(qk.key, '')}), {qk.describe(in_use + asked)} in all, "
                    f"{qk.describe(free)} free. Ask for less, wait for pods to finish, or raise the quota"
                )
                return QuotaVerdict(False, reason, quota_name, qk.key, lim.value, in_use, asked)
        return FITS

    def check(self, pod: Pod, requests: Mapping[str, Sequence[ContainerRequest | None]]) -> QuotaVerdict:
        """Admission: would `pod`, asking `requests` (one per container, init first), fit its namespace's quotas?"""
        demand = demand_of_requests(self.plugins, requests, [c.name for c in pod.all_containers], pod.run_order)
        with self._lock:
            return self._verdict(pod.namespace, pod.name, demand)

    def reserve(self, pod: Pod, allocation: Mapping[str, Sequence[ContainerPlacement]]) -> QuotaVerdict:
        """Filter: check the chosen placement against the quotas and, when it fits, count it at once (until the
        pod's own annotations arrive through the watch, or `release`). The check and the record are atomic."""
        demand = demand_of_allocation(self.plugins, allocation, pod.run_order)
        with self._lock:
            verdict = self._verdict(pod.namespace, pod.name, demand)
            if verdict.fits and demand:
                self._usage.setdefault(pod.namespace, {})[pod.name] = _Usage(demand, assumed=True)
            return verdict
