"""An allocated ResourceClaim read back as HAMi placements, and what a node already holds of its devices.

kube-scheduler writes the allocation into the claim's status (`status.allocation.devices.results`): per
result the request, driver, pool and device name and, on a device that allows several allocations, the
`shareID` and the `consumedCapacity` (KEP-5075) it rounded up under the slice's request policies. This module
turns the results of this driver and node into `ContainerDevice`s (UUID, kind, MiB, cores), the placement
the vendor hooks take:

* a share: its consumed ``memory`` and ``cores``;
* a device that does not allow several allocations (the API then records no consumed capacity; so too with the
  consumable-capacity gate off): the whole device, all its memory and 100 % of its cores.

`NodeUsage` is the one accounting both paths answer to on the node: what the device-plugin pods bound here
(their HAMi allocated annotations) and the claims this node prepared hold of each device; a claim whose
share does not fit beside them is refused, so neither path hands out what the other holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hami.cluster.port import KubeObject, meta
from hami.codec import AnnotationError, decode_pod_devices
from hami.dra.slices import CAPACITY_CORES, CAPACITY_MEMORY, PublishedDevice
from hami.errors import HamiError
from hami.model import ContainerDevice, ContainerPlacement
from hami.plugins import VendorPlugins
from hami.quantity import memory_mib, parse_quantity

__all__ = ["Authentic", "ClaimError", "ClaimShare", "NodeUsage", "Served", "claim_shares", "pod_usage", "share_of"]

FINISHED = ("Succeeded", "Failed")


class ClaimError(HamiError):
    """A claim cannot be prepared on this node; the message (returned to the kubelet) says why."""


@dataclass(frozen=True, slots=True)
class ClaimShare:
    """One allocated device of a claim, as a HAMi placement entry."""

    request: str
    device: str
    """The device's name in the node's ResourceSlice."""
    kind: str
    share_id: str | None
    placement: ContainerDevice


def _qualified(name: str, driver: str) -> str:
    return name.split("/", 1)[1] if name.startswith(driver + "/") else name


def share_of(result: Mapping[str, Any], driver: str, whole: ContainerDevice) -> ContainerDevice:
    """One allocation result as a placement entry: its consumed ``memory`` and ``cores`` (nothing said of cores
    is 0, of memory the whole memory), or `whole` when the result consumed no capacity (a device that does not
    allow several allocations). :raises ValueError: a quantity cannot be read."""
    raw = result.get("consumedCapacity") or {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"consumedCapacity is {type(raw).__name__}, not a map")
    consumed = {_qualified(str(k), driver): str(v) for k, v in raw.items()}
    if not consumed:
        return whole
    memory = memory_mib(consumed[CAPACITY_MEMORY]) if CAPACITY_MEMORY in consumed else whole.usedmem
    cores = int(parse_quantity(consumed[CAPACITY_CORES])) if CAPACITY_CORES in consumed else 0
    if memory < 0 or cores < 0:
        raise ValueError(f"negative consumed capacity {consumed}")
    return whole.model_copy(update={"usedmem": memory, "usedcores": cores})


def claim_shares(claim: KubeObject, driver: str, pool: str, devices: Mapping[str, PublishedDevice]) -> list[ClaimShare]:
    """The claim's allocated devices of `driver` in `pool` (this node), in the allocation's order.

    :raises ClaimError: the claim is not allocated, or names a device this node does not publish.
    """
    name = f"{meta(claim).get('namespace')}/{meta(claim).get('name')}"
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        raise ClaimError(f"claim {name} is not allocated yet; the kubelet prepares only allocated claims")
    devices_result = allocation.get("devices") or {}
    results = devices_result.get("results") if isinstance(devices_result, Mapping) else None
    if not isinstance(results, list):
        results = []
    out: list[ClaimShare] = []
    for result in results:
        if not isinstance(result, Mapping) or result.get("driver") != driver:
            continue
        if result.get("pool") != pool:
            raise ClaimError(f"claim {name}: device {result.get('device')} is in pool {result.get('pool')}, not {pool}")
        device_name = str(result.get("device") or "")
        published = devices.get(device_name)
        if published is None:
            raise ClaimError(
                f"claim {name}: device {device_name} is not published by node {pool} (it is gone or unhealthy); "
                "delete the claim's pod so the scheduler allocates another"
            )
        d = published.device
        whole = ContainerDevice(uuid=d.id, type=published.kind, usedmem=d.devmem, usedcores=100)
        try:
            placement = share_of(result, driver, whole)
        except ValueError as exc:
            raise ClaimError(f"claim {name}: unreadable consumed capacity of device {device_name}: {exc}") from None
        share = result.get("shareID")
        if share is not None and not isinstance(share, str):
            raise ClaimError(f"claim {name}: device {device_name} has a shareID that is not a string")
        out.append(ClaimShare(str(result.get("request") or ""), device_name, published.kind, share, placement))
    if not out:
        raise ClaimError(f"claim {name} has no device of driver {driver} allocated")
    seen: set[str] = set()
    for share in out:
        if share.placement.uuid in seen:
            raise ClaimError(
                f"claim {name} was given two shares of device {share.device}: a device counts once per container "
                f"(add the constraint `distinctAttribute: {driver}/uuid` to ask for distinct devices)"
            )
        seen.add(share.placement.uuid)
    return out


@dataclass
class _Held:
    slots: int = 0
    memory: int = 0
    cores: int = 0
    holders: list[str] = field(default_factory=list)


Served = tuple[str, str, ContainerPlacement]
"""(who, pod UID, devices): one container the node daemon gave devices to, from its own record."""

Authentic = Callable[[Mapping[str, str], str], Mapping[str, str]]
"""(a pod's annotations, its UID) → the annotations to count it by (the signed values under placement signing)."""


def pod_usage(
    plugins: VendorPlugins,
    pods: Iterable[KubeObject],
    node: str,
    *,
    served: Iterable[Served] = (),
    authentic: Authentic | None = None,
) -> NodeUsage:
    """What the device-plugin pods bound to `node` hold, by device UUID.

    The containers the daemon served count by its own record (`served`), which a pod's owner cannot edit: a
    tenant who rewrites or deletes its pod's annotations does not free its devices for a claim. Each served
    container counts (init containers too, which is stricter than the scheduler's peak rule). The pods not
    served yet (placed, not yet started) count by their allocated annotations, through `authentic` when given.
    """
    usage = NodeUsage({})
    known: set[str] = set()
    for who, uid, placement in served:
        known.add(uid)
        usage.add(who, placement)
    for obj in pods:
        spec: Mapping[str, Any] = obj.get("spec") or {}
        m = meta(obj)
        uid = str(m.get("uid") or "")
        if spec.get("nodeName") != node or (obj.get("status") or {}).get("phase") in FINISHED or uid in known:
            continue
        annotations: Mapping[str, str] = m.get("annotations") or {}
        if authentic is not None:
            annotations = authentic(annotations, uid)
        who = f"pod {m.get('namespace')}/{m.get('name')}"
        for kind in plugins.kinds:
            value = annotations.get(kind.annotations.allocated)
            if not value:
                continue
            try:
                entries = decode_pod_devices(value, kind.annotations.allocated)
            except AnnotationError:
                continue  # the scheduler and the daemon report these; nothing is held by an unreadable placement
            for placement in entries:
                usage.add(who, placement)
    return usage


class NodeUsage:
    """What the pods and the prepared claims of this node hold of each device, and whether a share fits."""

    def __init__(self, held: dict[str, _Held]) -> None:
        self.held = held

    def add(self, who: str, placement: Iterable[ContainerDevice]) -> None:
        for d in placement:
            h = self.held.setdefault(d.uuid, _Held())
            h.slots += 1
            h.memory += d.usedmem
            h.cores += d.usedcores
            h.holders.append(who)

    def refusal(self, share: ClaimShare, published: PublishedDevice) -> str | None:
        """Why `share` does not fit beside what is held (None when it does)."""
        d = published.device
        h = self.held.get(d.id)
        if h is None or not h.slots:
            return None
        by = ", ".join(sorted(set(h.holders))[:3])
        if not published.shared:
            return f"device {share.device} ({d.id}) is not shared and is held by {by}"
        p = share.placement
        if h.slots + 1 > max(d.count, 1):
            return f"device {share.device} ({d.id}) has all its {d.count} shares held (by {by})"
        if h.memory + p.usedmem > d.devmem:
            return (
                f"device {share.device} ({d.id}) has {d.devmem - h.memory} MiB free beside {by}; "
                f"the claim was given {p.usedmem} MiB"
            )
        if h.cores + p.usedcores > d.devcore:
            return (
                f"device {share.device} ({d.id}) has {d.devcore - h.cores}% cores free beside {by}; "
                f"the claim was given {p.usedcores}%"
            )
        return None
