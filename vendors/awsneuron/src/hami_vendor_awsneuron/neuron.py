"""HAMi v2.10's AWS Neuron rules (``pkg/device/awsneuron``): devices from the node's capacity, requests in devices or
NeuronCores, fitting by core masks and contiguous device runs, and the pod annotations AWS's device plugin reads.

Owns, with AWS's Neuron device plugin serving the node (as in HAMi):

* `node_devices`: ``aws.amazon.com/neuron`` capacity ``n`` devices, ``<node>-AWSNeuron-<i>``, each with
  ``aws.amazon.com/neuroncore`` capacity / ``n`` cores: as many slots, and a core mask (``2^cores - 1``) for its
  cores; the node's ``node.kubernetes.io/instance-type`` label says whether devices form a ring (``inf*``);
* `read_request`: ``aws.amazon.com/neuron: n`` asks for ``n`` whole devices; otherwise ``aws.amazon.com/neuroncore:
  n`` asks for ``n`` cores: 1 or 2 on one device, or a multiple of 2 as whole devices (HAMi caps cores per device at
  2, the two bits of its masks). Values must be integers, above 0 and at most 2^31-1 (devices) or twice that (cores);
* `fit_node`: one device (a container asking one device or up to two cores) is the first, from the highest index
  down, that is healthy, selected (``aws.amazon.com/use-neuron-uuid``/``nouse-neuron-uuid``), has a free slot, is
  idle under ``mutex``, and has the cores free; it gets the lowest free core(s), its grant the mask of them. Several
  devices are a run of idle, healthy devices of consecutive indices: anywhere on ``inf`` instances (a ring), on
  others only 1, 4, 8 or 16 devices aligned to a multiple of the count; each is granted whole;
* `pod_annotations`: ``AWS_NEURON_IDS`` (device indices, or core ids ``cores × index (+1)`` for core requests, as
  HAMi accumulates them over the pod's containers), ``NEURON_ALLOC_TIME`` (nanoseconds), ``NEURON_ALLOCATED``
  (``false``), ``aws.amazon.com/predicate-node`` and, for core requests, ``NEURON_RESOURCE_TYPE``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hami.errors import RequestError
from hami.fitting import Selectors
from hami.model import (
    Container,
    ContainerDevice,
    ContainerPlacement,
    ContainerRequest,
    Device,
    DeviceKind,
    DeviceUsage,
    NodeFit,
    NodeView,
    Pod,
    SchedulingPolicy,
)
from hami.quantity import parse_quantity
from hami.requests import read_count

__all__ = ["AWS_NODE_TYPE", "CORES", "DEVICES", "WORD", "fit_node", "node_devices", "pod_annotations", "read_request"]

WORD = "AWSNeuron"
DEVICES, CORES = "aws.amazon.com/neuron", "aws.amazon.com/neuroncore"
AWS_NODE_TYPE = "AWSNodeType"
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
IDS, ALLOC_TIME, ALLOCATED = "AWS_NEURON_IDS", "NEURON_ALLOC_TIME", "NEURON_ALLOCATED"
RESOURCE_TYPE, PREDICATE_NODE = "NEURON_RESOURCE_TYPE", "aws.amazon.com/predicate-node"
MAX_DEVICES = 2**31 - 1
CORES_PER_DEVICE = 2  # HAMi's cap: its masks have two bits
_ALIGNED_RUNS = (1, 4, 8, 16)


def _count(capacity: Mapping[str, str], name: str) -> int:
    try:
        return int(parse_quantity(capacity.get(name, "0")))
    except (ValueError, ArithmeticError):
        return 0


def node_devices(capacity: Mapping[str, str], labels: Mapping[str, str], node: str) -> list[Device]:
    """The node's Neuron devices as HAMi derives them from the capacity (see the module)."""
    count = _count(capacity, DEVICES)
    if count <= 0:
        return []
    cores = max(_count(capacity, CORES), 0) // count
    custom = {AWS_NODE_TYPE: labels.get(INSTANCE_TYPE, "")}
    return [Device(id=f"{node}-{WORD}-{i}", index=i, count=cores, devmem=0, devcore=2**cores - 1, type=WORD,
                   vendor=WORD, custom=custom) for i in range(count)]  # fmt: skip


def _checked(container: Container, name: str, limit: int) -> int | None:
    value = read_count(container, name, unit="devices" if name == DEVICES else "NeuronCores")
    if value is None:
        return None
    raw = container.resource(name) or ""
    if value <= 0:
        raise RequestError(name, raw, f"is not legal: {name} must be greater than 0")
    if value > limit:
        raise RequestError(name, raw, f"is not legal: {name} must not exceed {limit}")
    return value


def read_request(container: Container) -> ContainerRequest | None:
    """What the container asks (see the module); ``cores`` is NeuronCores per device, 0 for whole devices.

    :raises RequestError: a value HAMi's admission refuses, with its message."""
    devices = _checked(container, DEVICES, MAX_DEVICES)
    if devices is not None:
        return ContainerRequest(kind=WORD, count=min(devices, 1024), cores=0)
    cores = _checked(container, CORES, MAX_DEVICES * CORES_PER_DEVICE)
    if cores is None:
        return None
    if cores <= CORES_PER_DEVICE:
        return ContainerRequest(kind=WORD, count=1, cores=cores)
    if cores % CORES_PER_DEVICE:
        why = f"is not legal: {CORES} must be 1 or a multiple of {CORES_PER_DEVICE}, got {cores}"
        raise RequestError(CORES, container.resource(CORES) or "", why)
    return ContainerRequest(kind=WORD, count=min(cores // CORES_PER_DEVICE, 1024), cores=CORES_PER_DEVICE)


def _free_cores(device: Device, usedcores: int) -> int:
    return device.devcore.bit_count() - (usedcores & device.devcore).bit_count()


def _take(device: Device, usedcores: int, cores: int) -> int:
    """The mask of the `cores` lowest free cores of `device` (HAMi's ``addCoreUsage`` for its two cores)."""
    mask, bit = 0, 0
    while cores > 0 and bit < device.devcore.bit_length():
        if device.devcore >> bit & 1 and not usedcores >> bit & 1:
            mask, cores = mask | 1 << bit, cores - 1
        bit += 1
    return mask


@dataclass
class _State:
    usage: DeviceUsage
    used: int
    usedcores: int


def _run(states: Sequence[_State], count: int) -> list[_State]:
    """HAMi's ``graphSelect``: `count` idle, healthy devices of consecutive indices (see the module)."""
    if not states:
        return []
    ring = "inf" in str(states[0].usage.device.custom.get(AWS_NODE_TYPE, "")).lower()
    if not ring and count not in _ALIGNED_RUNS:
        return []
    for start in range(0, len(states), 1 if ring else count):
        window = states[start : start + count]
        if len(window) == count and all(s.used == 0 and s.usage.device.health for s in window):
            return list(window)
    return []


def fit_node(
    kind: DeviceKind, pod: Pod, requests: Sequence[ContainerRequest | None], node: NodeView, policy: SchedulingPolicy
) -> NodeFit:
    """The node's fit for the pod's Neuron requests (see the module)."""
    by_index = sorted(node.devices, key=lambda u: (u.device.index, u.device.id))
    states = [_State(u, u.used, u.usedcores) for u in by_index]
    selectors, mutex = Selectors(kind, pod), "mutex" in policy.device
    names = [c.name for c in pod.all_containers]
    placement: list[ContainerPlacement] = []
    for index, request in enumerate(requests):
        if request is None:
            placement.append(())
            continue
        who = f"container {names[index]}" if index < len(names) and len(requests) > 1 else "pod"
        if request.count > 1:
            chosen = _run(states, request.count)
            if not chosen:
                return NodeFit(node=node.name, reason=f"{who}: needs {request.count} idle Neuron devices of "
                               f"consecutive indices (a ring on inf instances, else 1, 4, 8 or 16 aligned), "
                               f"none of {len(states)}")  # fmt: skip
            for s in chosen:
                s.used, s.usedcores = s.used + 1, s.usedcores | s.usage.device.devcore
            placement.append(tuple(ContainerDevice(uuid=s.usage.device.id, type=WORD, usedmem=0,
                                                   usedcores=s.usage.device.devcore) for s in chosen))  # fmt: skip
            continue
        refused: dict[str, int] = {}
        for s in reversed(states):
            d = s.usage.device
            cores = request.cores or d.count
            why = ("unhealthy" if not d.health else
                   selectors.refuses(s.usage) if selectors.active and selectors.refuses(s.usage) else
                   "no free slot" if s.used >= d.count else
                   "not idle (mutex)" if mutex and s.used > 0 else
                   "insufficient cores" if _free_cores(d, s.usedcores) < cores else None)  # fmt: skip
            if why:
                refused[why] = refused.get(why, 0) + 1
                continue
            mask = _take(d, s.usedcores, cores)
            s.used, s.usedcores = s.used + 1, s.usedcores | mask
            placement.append((ContainerDevice(uuid=d.id, type=WORD, usedmem=0, usedcores=mask),))
            break
        else:
            detail = ", ".join(f"{n} {why}" for why, n in sorted(refused.items(), key=lambda kv: (-kv[1], kv[0])))
            return NodeFit(node=node.name, reason=f"{who}: needs 1 {WORD} device, 0/{len(states)} usable ({detail})")
    return NodeFit(node=node.name, placement=tuple(placement))


def pod_annotations(pod: Pod, node: NodeView, placement: Sequence[ContainerPlacement], now_ns: int) -> dict[str, str]:
    """HAMi's Neuron pod annotations for `placement` (see the module)."""
    devices = {u.device.id: u.device for u in node.devices}
    containers = pod.all_containers
    out: dict[str, str] = {}
    ids: list[str] = []  # HAMi's list runs on over the pod's containers
    for index, granted in enumerate(placement):
        if not granted or index >= len(containers):
            continue
        whole = _count(containers[index].limits, DEVICES) > 0
        for g in granted:
            d = devices.get(g.uuid)
            if d is None:
                continue
            if whole:
                ids.append(str(d.index))
                continue
            for bit in (0, 1):
                if g.usedcores >> bit & 1:
                    ids.append(str(d.count * d.index + bit))
                    out[RESOURCE_TYPE] = CORES
        if ids:
            out.update({IDS: ",".join(ids), ALLOC_TIME: str(now_ns), ALLOCATED: "false", PREDICATE_NODE: node.name})
    return out
