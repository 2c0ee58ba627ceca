"""What the kubelet is told about a node's devices: resources, advertised device IDs, health and NUMA.

Owns the mapping from what vendor discovery found (`NodeInventory` per device kind) to the device-plugin
view: which extended resources the daemon serves for a kind, and the device IDs it advertises for each.

* A kind with a register annotation (JSON or legacy) is shared: its count resource advertises HAMi's
  `<UUID>-<i>` for i in 0..split-1 per physical device, so the kubelet admits up to `split` containers per
  card and the scheduler decides which card each gets.
* A kind that publishes no register annotation (`RegisterFormat.CAPACITY`) is read by the scheduler from the
  node's `status.capacity`, which is what the kubelet sums from these lists: its count resource advertises
  one ID per physical device, and its memory resource (when it has one) one ID per memory unit. A capacity
  kind that HAMi counts from its cores (`DeviceKind.capacity_by_cores`) also serves its cores resource,
  `DeviceKind.capacity_cores_per_device` IDs per device (100; Moore Threads 16).

Pure functions over the model: no gRPC, no Kubernetes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from hami.model import Device, DeviceKind, RegisterFormat

__all__ = [
    "AdvertisedDevice",
    "PreferredRequest",
    "ResourceRole",
    "ServedResource",
    "advertised_devices",
    "preferred_ids",
    "resources_of",
]


class ResourceRole(StrEnum):
    COUNT = "count"
    """The device count resource: Allocate for it serves the container's placement."""
    MEMORY = "memory"
    """A capacity kind's memory resource: advertised so the node's capacity carries it; Allocate is a no-op."""
    CORES = "cores"
    """A capacity kind's cores resource (`DeviceKind.capacity_by_cores`); Allocate is a no-op."""


@dataclass(frozen=True, slots=True)
class ServedResource:
    """One extended resource the daemon registers with the kubelet, and the device kind it belongs to."""

    name: str
    kind: str
    role: ResourceRole

    @property
    def socket_name(self) -> str:
        """The plugin's socket file name in the device-plugin directory, e.g. `hami-nvidia.com_gpu.sock`."""
        return "hami-" + self.name.replace("/", "_") + ".sock"


@dataclass(frozen=True, slots=True)
class AdvertisedDevice:
    """One device ID as ListAndWatch sends it."""

    id: str
    device: str
    """The physical device's UUID."""
    healthy: bool
    numa: int = -1
    """NUMA node, -1 when unknown (sent without topology)."""


@dataclass(frozen=True, slots=True)
class PreferredRequest:
    """One container of the kubelet's GetPreferredAllocation: the IDs it may have, those it must, how many."""

    available: list[str]
    must_include: list[str]
    size: int


def resources_of(kind: DeviceKind) -> list[ServedResource]:
    """The resources served for `kind`: its count, and for capacity kinds its memory too."""
    served = [ServedResource(kind.resources.count, kind.common_word, ResourceRole.COUNT)]
    if kind.register_format == RegisterFormat.CAPACITY and kind.resources.memory:
        served.append(ServedResource(kind.resources.memory, kind.common_word, ResourceRole.MEMORY))
    if kind.register_format == RegisterFormat.CAPACITY and kind.capacity_by_cores and kind.resources.cores:
        served.append(ServedResource(kind.resources.cores, kind.common_word, ResourceRole.CORES))
    return served


def advertised_devices(kind: DeviceKind, role: ResourceRole, devices: Iterable[Device]) -> tuple[AdvertisedDevice, ...]:
    """The device IDs to advertise for one resource of `kind`, in a stable order."""
    out: list[AdvertisedDevice] = []
    for d in sorted(devices, key=lambda d: (d.index, d.id)):
        if role == ResourceRole.MEMORY:
            units = d.devmem // kind.resources.memory_unit_mib
            out.extend(AdvertisedDevice(f"{d.id}-mem-{j}", d.id, d.health, d.numa) for j in range(units))
        elif role == ResourceRole.CORES:
            cores = kind.capacity_cores_per_device
            out.extend(AdvertisedDevice(f"{d.id}-core-{j}", d.id, d.health, d.numa) for j in range(cores))
        elif kind.register_format == RegisterFormat.CAPACITY:
            out.append(AdvertisedDevice(d.id, d.id, d.health, d.numa))
        else:
            out.extend(AdvertisedDevice(f"{d.id}-{i}", d.id, d.health, d.numa) for i in range(d.count))
    return tuple(out)


def preferred_ids(
    available: Sequence[str], must_include: Sequence[str], size: int, physical: Mapping[str, str]
) -> list[str]:
    """The kubelet's GetPreferredAllocation: `must_include` first, then IDs on physical devices not yet used.

    A container asking for two devices should get two different cards, which the kubelet alone does not
    know; when there are fewer distinct cards than `size`, IDs on already chosen cards fill the rest.
    `physical` maps advertised IDs to their physical device (an unknown ID is its own device).
    """
    chosen = list(dict.fromkeys(must_include))[:size]
    used = {physical.get(i, i) for i in chosen}
    rest = [i for i in available if i not in chosen]
    for advertised in rest:
        if len(chosen) >= size:
            break
        if physical.get(advertised, advertised) not in used:
            chosen.append(advertised)
            used.add(physical.get(advertised, advertised))
    for advertised in rest:
        if len(chosen) >= size:
            break
        if advertised not in chosen:
            chosen.append(advertised)
    return chosen
