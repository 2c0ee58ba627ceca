"""The node's devices as a DRA ResourceSlice, and its publishing: one pool per node, one slice per pool.

Built from the same `NodeInventory` the device plugins serve (the vendors' `hami_discover_devices`), so both
paths see one set of devices. Each healthy device is one entry (a vendor that reports partitions as devices
gets one entry per partition); an unhealthy one is left out, so kube-scheduler allocates nothing on it.

Attributes, under the driver's domain (`device.attributes["<driver>"].<name>` in CEL): ``kind`` (the
device kind's common word), ``vendor``, ``model``, ``uuid``, ``index``, ``numa`` (omitted when unknown), and
whatever the vendor's `hami_dra_device` adds (topology identifiers), never overriding core's.

Capacities, fully qualified with the driver's name (``<driver>/memory``: kube-scheduler matches a claim's
capacity requests to them as written, so claims name them the same way): ``memory`` (MiB, as a quantity
``<n>Mi``), ``cores`` (percent of the
device) and, on a shared device, ``shares`` (the split count). A shared device (`DraDevice.shared`, by default
a split count above 1) sets ``allowMultipleAllocations`` and gives each capacity a request policy (KEP-5075,
consumable capacity), which is HAMi's fitting rule said in the API's terms:

* ``memory``: a request is rounded up to the vendor's step (the kind's memory unit, or `DraDevice.memory_step_mib`)
  or to the next of its fixed sizes (`DraDevice.memory_values_mib`); a request that says nothing takes the whole
  memory (HAMi's default: no memory resource means all of it);
* ``cores``: in the vendor's step, 0 to the device's cores; nothing said means 0 (no core limit, as in HAMi);
* ``shares``: every allocation takes exactly 1, so no more claims than the split count hold the device.

The pool's generation goes up whenever the published devices change; kube-scheduler then drops the older one.
Pure functions but `SlicePublisher`, which reads and writes the one ResourceSlice through `hami.cluster`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami.cluster.port import Cluster, ClusterError, KubeObject, NotFoundError, meta
from hami.model import Device, DraAttribute, NodeInventory
from hami.plugins import VendorPlugins
from hami.quantity import parse_quantity

__all__ = [
    "CAPACITY_CORES",
    "CAPACITY_MEMORY",
    "CAPACITY_SHARES",
    "DEFAULT_DRIVER",
    "PublishedDevice",
    "SlicePublisher",
    "build_slice",
    "device_name",
    "hashed_device_name",
    "published_devices",
    "slice_name",
]

log = logging.getLogger(__name__)

DEFAULT_DRIVER = "hami.io"
"""The DRA driver name HAMi publishes under (and its attribute and capacity domain) unless configured otherwise."""

CAPACITY_MEMORY = "memory"
CAPACITY_CORES = "cores"
CAPACITY_SHARES = "shares"

CORE_ATTRIBUTES = frozenset({"kind", "vendor", "model", "uuid", "index", "numa"})
"""The attributes core publishes for every device; a vendor's `hami_dra_device` does not override them."""

_LABEL = re.compile(r"[^a-z0-9-]+")
_ATTRIBUTE_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,30}[A-Za-z0-9])?$")


@dataclass(frozen=True, slots=True)
class PublishedDevice:
    """One entry of the node's ResourceSlice, and the device it stands for."""

    name: str
    kind: str
    device: Device
    shared: bool


def device_name(kind: str, device: Device) -> str:
    """The device's name in the slice: a DNS label from the kind and the device index (``nvidia-0``), stable
    across restarts; a hash of the UUID keeps two devices with the same index apart (see `published_devices`)."""
    stem = _LABEL.sub("-", kind.lower()).strip("-")[:40] or "device"
    return f"{stem}-{device.index}"


def hashed_device_name(kind: str, device: Device) -> str:
    """The name of a device whose `device_name` another device of the node already has."""
    digest = hashlib.sha256(device.id.encode()).hexdigest()[:10]
    return f"{device_name(kind, device)[:50]}-{digest}"


def slice_name(node: str, driver: str) -> str:
    """The ResourceSlice's name for `node`: one slice per node and driver."""
    slug = _LABEL.sub("-", driver.lower()).strip("-")
    return f"{node}-{slug}"[:253].rstrip("-.")


def published_devices(plugins: VendorPlugins, inventories: Mapping[str, NodeInventory]) -> list[PublishedDevice]:
    """The healthy devices of every kind the vendor publishes, named, in a stable order (kind, index, UUID)."""
    out: list[PublishedDevice] = []
    taken: set[str] = set()
    for word in sorted(inventories):
        for d in sorted(inventories[word].devices, key=lambda d: (d.index, d.id)):
            if not d.health:
                continue
            facts = plugins.dra_device(word, d)
            if not facts.published:
                continue
            name = device_name(word, d)
            if name in taken:
                name = hashed_device_name(word, d)
            taken.add(name)
            shared = facts.shared if facts.shared is not None else d.count > 1
            out.append(PublishedDevice(name, word, d, shared))
    return out


def _attribute(value: DraAttribute) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    return {"string": str(value)}


def _mi(mib: int) -> str:
    return f"{mib}Mi"


def _device_entry(plugins: VendorPlugins, driver: str, published: PublishedDevice) -> dict[str, Any]:
    d = published.device
    kind = plugins.kind(published.kind)
    facts = plugins.dra_device(published.kind, d)
    attributes: dict[str, DraAttribute] = {}
    for name, value in facts.attributes.items():
        if name in CORE_ATTRIBUTES:
            log.warning("vendor of %s gave attribute %r, which core publishes itself; ignored", published.kind, name)
        elif not _ATTRIBUTE_NAME.match(name):
            log.warning("vendor of %s gave attribute %r, not a valid attribute name; ignored", published.kind, name)
        else:
            attributes[name] = value
    attributes.update(
        kind=published.kind, vendor=plugins.owner(published.kind).name, model=d.type or published.kind, uuid=d.id,
        index=d.index,
    )  # fmt: skip
    if d.numa >= 0:
        attributes["numa"] = d.numa
    entry: dict[str, Any] = {
        "name": published.name,
        "attributes": {k: _attribute(v) for k, v in sorted(attributes.items())},
    }
    memory: dict[str, Any] = {"value": _mi(d.devmem)}
    cores: dict[str, Any] = {"value": str(d.devcore)}
    capacity: dict[str, Any] = {CAPACITY_MEMORY: memory, CAPACITY_CORES: cores}
    if published.shared:
        entry["allowMultipleAllocations"] = True
        if facts.memory_values_mib:
            sizes = [v for v in facts.memory_values_mib if v <= d.devmem] or [d.devmem]
            memory["requestPolicy"] = {"default": _mi(sizes[-1]), "validValues": [_mi(v) for v in sizes]}
        else:
            step = facts.memory_step_mib or kind.resources.memory_unit_mib
            whole = d.devmem // step * step or d.devmem
            memory["value"] = _mi(whole)
            memory["requestPolicy"] = {
                "default": _mi(whole), "validRange": {"min": _mi(step), "max": _mi(whole), "step": _mi(step)},
            }  # fmt: skip
        top = d.devcore // facts.cores_step * facts.cores_step
        cores["requestPolicy"] = {
            "default": "0", "validRange": {"min": "0", "max": str(top), "step": str(facts.cores_step)},
        }  # fmt: skip
        capacity[CAPACITY_SHARES] = {
            "value": str(max(d.count, 1)), "requestPolicy": {"default": "1", "validValues": ["1"]},
        }  # fmt: skip
    # Fully qualified: kube-scheduler matches a claim's capacity requests to these names as written.
    entry["capacity"] = {f"{driver}/{name}": value for name, value in capacity.items()}
    return entry


def build_slice(
    plugins: VendorPlugins,
    node: str,
    driver: str,
    inventories: Mapping[str, NodeInventory],
    generation: int = 1,
    node_uid: str = "",
) -> KubeObject:
    """The node's ResourceSlice for `driver` (every kind of every vendor in one pool named after the node)."""
    devices = [_device_entry(plugins, driver, p) for p in published_devices(plugins, inventories)]
    metadata: dict[str, Any] = {
        "name": slice_name(node, driver),
        "labels": {"app.kubernetes.io/managed-by": "hami", "hami.io/node": node[:63]},
    }
    if node_uid:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": metadata,
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


class SlicePublisher:
    """Keeps the node's ResourceSlice equal to what discovery found: created, replaced when the devices change
    (a new pool generation), left alone when they do not. Errors are the caller's to log and retry."""

    def __init__(self, cluster: Cluster, plugins: VendorPlugins, node: str, driver: str = DEFAULT_DRIVER) -> None:
        self.cluster = cluster
        self.plugins = plugins
        self.node = node
        self.driver = driver
        self.name = slice_name(node, driver)
        self.devices: dict[str, PublishedDevice] = {}
        """Device name → what it stands for, as last published (the kubelet plugin reads claims with it)."""

    def sync(self, inventories: Mapping[str, NodeInventory]) -> bool:
        """Publish the devices of `inventories`; True when the API was written.

        :raises ClusterError: the slice cannot be read or written.
        """
        self.devices = {p.name: p for p in published_devices(self.plugins, inventories)}
        try:
            current: KubeObject | None = self.cluster.get("resourceslices", self.name)
        except NotFoundError:
            current = None
        node_uid = ""
        with contextlib.suppress(ClusterError):  # without it no owner reference; the slice is still right
            node_uid = str(meta(self.cluster.get("nodes", self.node)).get("uid") or "")
        if current is None:
            first = build_slice(self.plugins, self.node, self.driver, inventories, 1, node_uid)
            self.cluster.create("resourceslices", first)
            log.info("published ResourceSlice %s: %d device(s)", self.name, len(self.devices))
            return True
        spec = current.get("spec") or {}
        generation = int((spec.get("pool") or {}).get("generation") or 0)
        wanted = build_slice(self.plugins, self.node, self.driver, inventories, generation, node_uid)
        if _same(spec, wanted["spec"]):
            return False
        wanted = build_slice(self.plugins, self.node, self.driver, inventories, generation + 1, node_uid)
        wanted["metadata"]["resourceVersion"] = meta(current).get("resourceVersion")
        self.cluster.replace("resourceslices", wanted)
        log.info("ResourceSlice %s updated (generation %d): %d device(s)", self.name, generation + 1, len(self.devices))
        return True


_OURS = frozenset({"attributes", "capacity", "requestPolicy"})
"""Maps every key of which is ours: a key the stored slice has beyond ours there is stale, not a server default."""


def _same(current: Any, wanted: Any, exact: bool = False) -> bool:
    """Whether the stored spec says what `wanted` says: every field `wanted` sets is there with the same value,
    fields the API server adds are not ours to compare (but in the maps that are all ours, `_OURS`, the keys must
    be the same), and quantities compare as numbers (the server writes them in canonical form)."""
    if isinstance(wanted, Mapping):
        if not isinstance(current, Mapping) or (exact and set(current) != set(wanted)):
            return False
        return all(k in current and _same(current[k], v, k in _OURS) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (
            isinstance(current, list)
            and len(current) == len(wanted)
            and all(_same(c, w) for c, w in zip(current, wanted, strict=True))
        )
    if isinstance(wanted, str) and isinstance(current, str) and current != wanted:
        try:
            return parse_quantity(current) == parse_quantity(wanted)
        except ValueError:
            return False
    return bool(current == wanted)
